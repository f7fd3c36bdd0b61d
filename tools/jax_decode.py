#!/usr/bin/env python3
"""Decode maxrs's Llama model with plain JAX, for benchmarks against `maxrs decode`.

    python tools/jax_decode.py --config RUN.json --params PARAMS.safetensors \
        --prompts PROMPTS.json --out RESULT.json
    python tools/jax_decode.py --selftest

The same decode as maxrs's (src/inference): prompts right-padded to `prefill_len` and prefilled
at once (causal attention over the prompt; the keys and values become a cache of `cache_len`
positions per layer, stacked over layers); then one jitted generate call per token, the cache
donated and carried through a `lax.scan` over the layers, each layer writing its row of every
sequence with `dynamic_update_slice` and attending over the cached positions up to the token's
own. Sampling is `greedy` (argmax) or `weighted` (`jax.random.categorical` of logits /
temperature); each sample splits its key from the running one, as maxrs does. The model
functions come from jax_train.py (the same numerics as src/model/llama.rs). Written from maxrs's
sources and MaxText's documented conventions, not from MaxText code.

RUN.json: the model keys of jax_train.py (emb, heads, kv_heads, head_dim, mlp, layers, vocab,
eps, rope_max_timescale, logits_via_embedding, dtype, weight_dtype; scan_layers must be true),
plus batch, prefill_len, cache_len, steps (generate calls), sampling ("greedy" | "weighted"),
temperature, seed, repeats (the whole decode runs once to warm up, then this many times:
prefill is the median prefill call, per_token the median generate call over all measured runs,
generate_total the sum of all their generate calls). PROMPTS.json: a list of token-id lists (at most `batch`). RESULT.json:
{"tokens": per prompt the generated ids, "timings_s": {"compile", "prefill", "per_token"
(median generate call), "generate_total"}, "jax_version"}.
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_train as jt  # noqa: E402

F32 = jnp.float32

MODEL_KEYS = {"emb": int, "heads": int, "kv_heads": int, "head_dim": int, "mlp": int, "layers": int,
              "vocab": int, "eps": float, "rope_max_timescale": float, "logits_via_embedding": bool,
              "dtype": str, "weight_dtype": str, "scan_layers": bool}
DECODE_KEYS = {"batch": int, "prefill_len": int, "cache_len": int, "steps": int, "sampling": str,
               "temperature": float, "seed": int, "repeats": int}


class Config:
    def __init__(self, d):
        for key, ty in {**MODEL_KEYS, **DECODE_KEYS}.items():
            if key not in d:
                raise ValueError(f"RUN.json: missing key {key}")
            setattr(self, key, ty(d[key]))
        if not self.scan_layers:
            raise ValueError("RUN.json: scan_layers must be true (the parameters are stacked)")
        if self.sampling not in ("greedy", "weighted"):
            raise ValueError(f"RUN.json: sampling={self.sampling!r}: greedy or weighted")

    compute_dtype = property(lambda self: jt.DTYPES[self.dtype])
    param_dtype = property(lambda self: jt.DTYPES[self.weight_dtype])


def rope_at(c, x, positions):
    """Half-split RoPE of x [b, t, h, d] at positions [b, t] (jax_train's tables, per row)."""
    half = c.head_dim // 2
    inv = jnp.asarray((c.rope_max_timescale ** (-2.0 * np.arange(half) / c.head_dim)).astype(np.float32))
    angles = positions.astype(F32)[..., None] * inv
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    xf = x.astype(F32)
    x1, x2 = xf[..., :half], xf[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def attend(c, q, k, v, allowed):
    """q [b, t, h, d] (scaled) over k, v [b, s, kv, d] where allowed [b, t, s]."""
    b, t = q.shape[0], q.shape[1]
    group = c.heads // c.kv_heads
    q = q.reshape(b, t, c.kv_heads, group, c.head_dim)
    scores = jnp.einsum("btngk,bsnk->bngts", q, k).astype(F32)
    probs = jt.softmax_f32(jnp.where(allowed[:, None, None], scores, jt.MASK_VALUE)).astype(v.dtype)
    return jnp.einsum("bngts,bsnk->btngk", probs, v).reshape(b, t, c.heads, c.head_dim)


def layer(c, p, x, positions, kv_fn):
    """One Llama layer; kv_fn(k, v, q) returns the attention output (and records the cache)."""
    dt = c.compute_dtype
    h = jt.rms_norm(x, p["pre_self_attention_layer_norm.scale"], c.eps, dt)
    q = jnp.einsum("btd,dhk->bthk", h, p["self_attention.query.kernel"].astype(dt))
    k = jnp.einsum("btd,dhk->bthk", h, p["self_attention.key.kernel"].astype(dt))
    v = jnp.einsum("btd,dhk->bthk", h, p["self_attention.value.kernel"].astype(dt))
    q = rope_at(c, q, positions)  # the query kernel holds 1/sqrt(head_dim) (MaxText's folding)
    k = rope_at(c, k, positions)
    out, extra = kv_fn(q, k, v)
    x = x + jnp.einsum("bthk,hkd->btd", out, p["self_attention.out.kernel"].astype(dt))
    h = jt.rms_norm(x, p["post_self_attention_layer_norm.scale"], c.eps, dt)
    return x + jt.mlp(c, p, h), extra


def split_layers(params):
    return ({k[len("decoder.layers."):]: v for k, v in params.items() if k.startswith("decoder.layers.")})


def head(c, params, y):
    dt = c.compute_dtype
    y = jt.rms_norm(y, params["decoder.decoder_norm.scale"], c.eps, dt)
    if c.logits_via_embedding:
        logits = jnp.einsum("btd,vd->btv", y, params["token_embedder.embedding"].astype(dt))
    else:
        logits = y @ params["decoder.logits_dense.kernel"].astype(dt)
    return logits.astype(F32)


def sample(c, logits, key):
    key, sample_key = jax.random.split(key)
    if c.sampling == "greedy":
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), key
    return jax.random.categorical(sample_key, logits / c.temperature).astype(jnp.int32), key


def prefill(c, params, tokens, lengths, key):
    b, p = tokens.shape
    dt = c.compute_dtype
    x = params["token_embedder.embedding"].astype(dt)[tokens]
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((p, p), bool)), (b, p, p))

    def kv_fn(q, k, v):
        pad = [(0, 0), (0, c.cache_len - p), (0, 0), (0, 0)]
        return attend(c, q, k, v, causal), (jnp.pad(k, pad), jnp.pad(v, pad))

    def body(x, lp):
        return layer(c, lp, x, positions, kv_fn)

    y, (keys, values) = jax.lax.scan(body, x, split_layers(params))
    last = jnp.take_along_axis(y, (lengths - 1)[:, None, None], axis=1)
    token, key = sample(c, head(c, params, last)[:, 0], key)
    return (keys, values), token, lengths, key


def generate(c, params, cache, tokens, positions, key):
    b = tokens.shape[0]
    dt = c.compute_dtype
    x = params["token_embedder.embedding"].astype(dt)[tokens[:, None]]
    pos = positions[:, None]
    allowed = jnp.arange(c.cache_len)[None, None, :] <= pos[:, :, None]

    def body(carry, lp):
        x, keys, values, i = carry

        def kv_fn(q, k, v):
            ks, vs = keys, values
            for row in range(b):  # each sequence writes at its own position
                ks = jax.lax.dynamic_update_slice(ks, k[row][None, None], (i, row, positions[row], 0, 0))
                vs = jax.lax.dynamic_update_slice(vs, v[row][None, None], (i, row, positions[row], 0, 0))
            return attend(c, q, ks[i], vs[i], allowed), (ks, vs)

        y, (keys, values) = layer(c, lp, x, pos, kv_fn)
        return (y, keys, values, i + 1), None

    (y, keys, values, _), _ = jax.lax.scan(body, (x, cache[0], cache[1], jnp.int32(0)), split_layers(params))
    token, key = sample(c, head(c, params, y)[:, 0], key)
    return (keys, values), token, positions + 1, key


def run(c, params, prompts):
    b, p = c.batch, c.prefill_len
    tokens = np.zeros((b, p), np.int32)
    lengths = np.ones((b,), np.int32)
    for r, prompt in enumerate(prompts):
        tokens[r, :len(prompt)] = prompt
        lengths[r] = len(prompt)
    t0 = time.perf_counter()
    prefill_fn = jax.jit(lambda *a: prefill(c, *a))
    generate_fn = jax.jit(lambda *a: generate(c, *a), donate_argnums=(1, 2, 3, 4))
    key0 = jax.random.PRNGKey(c.seed)
    prefill_c = prefill_fn.lower(params, tokens, lengths, key0).compile()
    cache_shape = jax.ShapeDtypeStruct((c.layers, b, c.cache_len, c.kv_heads, c.head_dim), c.compute_dtype)
    generate_c = generate_fn.lower(params, (cache_shape, cache_shape), jnp.zeros(b, jnp.int32),
                                   jnp.zeros(b, jnp.int32), key0).compile()
    compile_s = time.perf_counter() - t0
    prefills, calls = [], []
    for run_index in range(c.repeats + 1):  # the first run warms up
        t = time.perf_counter()
        cache, token, positions, key = prefill_c(params, tokens, lengths, key0)
        out = [np.asarray(token)]
        prefill_s = time.perf_counter() - t
        run_calls = []
        for _ in range(c.steps):
            t = time.perf_counter()
            cache, token, positions, key = generate_c(params, cache, token, positions, key)
            out.append(np.asarray(token))
            run_calls.append(time.perf_counter() - t)
        if run_index > 0:
            prefills.append(prefill_s)
            calls.extend(run_calls)
    generated = np.stack(out, axis=1)
    return {
        "tokens": [generated[r].tolist() for r in range(len(prompts))],
        "timings_s": {"compile": compile_s, "prefill": statistics.median(prefills),
                      "per_token": statistics.median(calls) if calls else None,
                      "generate_total": sum(calls)},
        "jax_version": jax.__version__,
    }


def selftest():
    """Greedy decoding equals the argmax of jax_train's full forward over the growing sequence."""
    d = {"emb": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "mlp": 96, "layers": 2, "vocab": 97,
         "eps": 1e-5, "rope_max_timescale": 10000.0, "logits_via_embedding": False, "dtype": "float32",
         "weight_dtype": "float32", "scan_layers": True, "batch": 3, "prefill_len": 6, "cache_len": 16,
         "steps": 10, "sampling": "greedy", "temperature": 1.0, "seed": 0, "repeats": 1}
    c = Config(d)
    tc = type("TrainConfig", (), {})()
    for key in MODEL_KEYS:
        setattr(tc, key, getattr(c, key))
    tc.compute_dtype, tc.param_dtype, tc.remat_policy = c.compute_dtype, c.param_dtype, "none"
    params = {k: jnp.asarray(v) for k, v in jt.random_params(tc, 3, perturb_norms=True).items()}
    prompts = [[5, 6, 7, 8, 9, 10], [3], [40, 41, 42]]
    result = run(c, params, prompts)
    for prompt, out in zip(prompts, result["tokens"]):
        seq = np.array([prompt + out[:-1]], np.int32)
        want = np.argmax(np.asarray(jt.forward(tc, params, seq)), axis=-1)[0][len(prompt) - 1:]
        assert list(want) == out, (prompt, out, list(want))
    print("jax_decode selftest: greedy decoding equals the full forward's argmax")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config")
    ap.add_argument("--params")
    ap.add_argument("--prompts")
    ap.add_argument("--out")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    if a.selftest:
        return selftest()
    with open(a.config) as f:
        c = Config(json.load(f))
    with open(a.prompts) as f:
        prompts = json.load(f)
    tc = type("TrainConfig", (), {})()
    for key in MODEL_KEYS:
        setattr(tc, key, getattr(c, key))
    tc.param_dtype = c.param_dtype
    params = jt.load_params(a.params, tc)
    result = run(c, params, prompts)
    with open(a.out, "w") as f:
        json.dump(result, f)
    t = result["timings_s"]
    print(f"jax_decode: prefill {t['prefill'] * 1e3:.2f} ms, per token {t['per_token'] * 1e3:.2f} ms", file=sys.stderr)


if __name__ == "__main__":
    main()
