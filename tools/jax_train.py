#!/usr/bin/env python3
"""Train maxrs's Llama model with plain JAX, for benchmarks against maxrs.

    python tools/jax_train.py --config RUN.json --params PARAMS.safetensors \
        --tokens TOKENS.bin --out RESULT.json
    python tools/jax_train.py --selftest

The model, parameter layout, data order, loss, learning-rate schedule and optimizer are those of
maxrs (src/model/llama.rs, src/train/data.rs, src/train/schedule.rs) and MaxText's conventions
(AdamW as optax.adamw, clip by global norm). This file is written from those descriptions; it does
not use MaxText code. See tools/README.md for the RUN.json keys and the RESULT.json fields.

Everything is f32 unless `dtype`/`weight_dtype` say otherwise: weights are kept in
`weight_dtype` and cast to `dtype` where used; RMSNorm statistics, RoPE, the attention softmax,
the logits and the loss are f32.
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np


# ---------------------------------------------------------------------------------------------
# Devices: XLA_FLAGS must be set before jax is imported.
# ---------------------------------------------------------------------------------------------

SELFTEST_DEVICES = 2


def _requested_device_count(argv):
    """The CPU device count this invocation needs: RUN.json's num_devices (or the selftest's)."""
    if "--selftest" in argv:
        return SELFTEST_DEVICES
    for i, arg in enumerate(argv):
        path = None
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        if path is not None:
            try:
                with open(path) as f:
                    return int(json.load(f).get("num_devices", 1))
            except (OSError, ValueError, TypeError, AttributeError):
                return 1  # the full config check reports the problem later
    return 1


def _set_device_count(n):
    flag = "--xla_force_host_platform_device_count"
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(flag + "=")]
    os.environ["XLA_FLAGS"] = " ".join(kept + [f"{flag}={max(1, n)}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


if __name__ == "__main__":
    _set_device_count(_requested_device_count(sys.argv[1:]))

_IMPORT_START = time.perf_counter()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

_ALL_DEVICES = jax.devices()
IMPORT_SECONDS = time.perf_counter() - _IMPORT_START

F32 = jnp.float32
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
REMAT_POLICIES = ("full", "minimal", "save_qkv_proj", "none")
# MaxText's DEFAULT_MASK_VALUE, a Python float (f64), rounded to f32 where used.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


# ---------------------------------------------------------------------------------------------
# RUN.json
# ---------------------------------------------------------------------------------------------

# key -> type; every key is required.
CONFIG_KEYS = {
    "emb": int, "heads": int, "kv_heads": int, "head_dim": int, "mlp": int, "layers": int,
    "vocab": int, "eps": float, "rope_max_timescale": float, "logits_via_embedding": bool,
    "dtype": str, "weight_dtype": str, "scan_layers": bool, "remat_policy": str,
    "global_batch": int, "seq": int, "steps": int,
    "learning_rate": float, "warmup_steps_fraction": float, "learning_rate_final_fraction": float,
    "learning_rate_schedule_steps": int,
    "adam_b1": float, "adam_b2": float, "adam_eps": float, "adam_eps_root": float,
    "adam_weight_decay": float, "gradient_clipping_threshold": float, "z_loss_multiplier": float,
    "num_devices": int,
}


class Config:
    """RUN.json, checked. Attributes are the keys of CONFIG_KEYS."""

    def __init__(self, d):
        problems = []
        missing = [k for k in CONFIG_KEYS if k not in d]
        if missing:
            problems.append("missing keys: " + ", ".join(missing))
        unknown = [k for k in d if k not in CONFIG_KEYS]
        if unknown:
            print(f"jax_train: ignoring unknown RUN.json keys: {', '.join(unknown)}", file=sys.stderr)
        for key, ty in CONFIG_KEYS.items():
            if key not in d:
                continue
            v = d[key]
            ok = (isinstance(v, bool) if ty is bool else
                  isinstance(v, (int, float)) and not isinstance(v, bool) if ty is float else
                  isinstance(v, int) and not isinstance(v, bool) if ty is int else
                  isinstance(v, str))
            if not ok:
                problems.append(f"{key}={v!r}: expected {ty.__name__}")
            else:
                setattr(self, key, ty(v))
        if not problems:
            problems += self._check()
        if problems:
            raise ValueError("RUN.json: " + "; ".join(problems))
        if self.learning_rate_schedule_steps == -1:
            self.learning_rate_schedule_steps = self.steps

    def _check(self):
        p = []
        for k in ("emb", "heads", "kv_heads", "head_dim", "mlp", "layers", "vocab", "global_batch",
                  "seq", "steps", "num_devices"):
            if getattr(self, k) < 1:
                p.append(f"{k}={getattr(self, k)}: must be >= 1")
        if self.heads % max(self.kv_heads, 1):
            p.append(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.head_dim % 2:
            p.append(f"head_dim={self.head_dim}: RoPE needs an even head_dim")
        for k in ("dtype", "weight_dtype"):
            if getattr(self, k) not in DTYPES:
                p.append(f"{k}={getattr(self, k)!r}: expected one of {', '.join(DTYPES)}")
        if self.remat_policy not in REMAT_POLICIES:
            p.append(f"remat_policy={self.remat_policy!r}: expected one of {', '.join(REMAT_POLICIES)}")
        if not (self.learning_rate_schedule_steps >= 1 or self.learning_rate_schedule_steps == -1):
            p.append(f"learning_rate_schedule_steps={self.learning_rate_schedule_steps}: must be > 0")
        if not 0.0 <= self.warmup_steps_fraction <= 1.0:
            p.append(f"warmup_steps_fraction={self.warmup_steps_fraction}: must be in [0, 1]")
        if self.num_devices > len(_ALL_DEVICES):
            p.append(f"num_devices={self.num_devices}: only {len(_ALL_DEVICES)} CPU devices exist "
                     "(XLA_FLAGS is set from --config before jax is imported)")
        if self.num_devices > 1:
            if self.emb % self.num_devices:
                p.append(f"emb={self.emb} is not divisible by num_devices={self.num_devices} (fsdp)")
            if self.global_batch % self.num_devices:
                p.append(f"global_batch={self.global_batch} is not divisible by num_devices={self.num_devices}")
        return p

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]

    @property
    def param_dtype(self):
        return DTYPES[self.weight_dtype]


# ---------------------------------------------------------------------------------------------
# Parameter layout (src/model/llama.rs's table)
# ---------------------------------------------------------------------------------------------

def layer_param_defs(c):
    """(name relative to the layer, shape, logical axes, fan_in or "ones") for one layer."""
    e, h, kv, d, m = c.emb, c.heads, c.kv_heads, c.head_dim, c.mlp
    return [
        ("pre_self_attention_layer_norm.scale", (e,), ("norm",), "ones"),
        ("self_attention.query.kernel", (e, h, d), ("embed", "heads", "kv"), e),
        ("self_attention.key.kernel", (e, kv, d), ("embed", "kv_heads", "kv"), e),
        ("self_attention.value.kernel", (e, kv, d), ("embed", "kv_heads", "kv"), e),
        ("self_attention.out.kernel", (h, d, e), ("heads", "kv", "embed"), h * d),
        ("post_self_attention_layer_norm.scale", (e,), ("norm",), "ones"),
        ("mlp.wi_0.kernel", (e, m), ("embed", "mlp"), e),
        ("mlp.wi_1.kernel", (e, m), ("embed", "mlp"), e),
        ("mlp.wo.kernel", (m, e), ("mlp", "embed"), m),
    ]


def param_defs(c):
    """Every parameter: (full name, shape, logical axes, init), in llama.rs's order.
    init is "ones", "normal" (stddev 1) or an int fan-in (truncated normal)."""
    defs = [("token_embedder.embedding", (c.vocab, c.emb), ("vocab", "embed"), "normal")]
    for name, shape, logical, init in layer_param_defs(c):
        if c.scan_layers:
            defs.append((f"decoder.layers.{name}", (c.layers,) + shape, ("layers",) + logical, init))
        else:
            defs += [(f"decoder.layers_{i}.{name}", shape, logical, init) for i in range(c.layers)]
    defs.append(("decoder.decoder_norm.scale", (c.emb,), ("norm",), "ones"))
    if not c.logits_via_embedding:
        defs.append(("decoder.logits_dense.kernel", (c.emb, c.vocab), ("embed", "vocab"), c.emb))
    return defs


def load_params(path, c):
    """Reads a safetensors file, checks it against the layout, returns {name: array in weight_dtype}
    (host arrays: jax arrays on the default device)."""
    from safetensors import safe_open

    want = {name: shape for name, shape, _, _ in param_defs(c)}
    out, problems = {}, []
    with safe_open(path, framework="flax") as f:
        names = set(f.keys())
        for name in sorted(names - set(want)):
            problems.append(f"unexpected {name}")
        for name, shape in want.items():
            if name not in names:
                problems.append(f"missing {name} {list(shape)}")
                continue
            t = f.get_tensor(name)
            if tuple(t.shape) != shape:
                problems.append(f"{name}: expected shape {list(shape)}, found {list(t.shape)}")
            elif not jnp.issubdtype(t.dtype, jnp.floating):
                problems.append(f"{name}: expected a float tensor, found {t.dtype}")
            else:
                out[name] = t.astype(c.param_dtype)
    if problems:
        raise ValueError(f"{path}: parameters do not match the model:\n  " + "\n  ".join(problems))
    return out


def save_params(path, params):
    from safetensors.flax import save_file

    save_file({k: jnp.asarray(v) for k, v in params.items()}, path)


def random_params(c, seed, perturb_norms=False):
    """Numpy f32 parameters drawn like llama.rs's initializers (not the same numbers). With
    perturb_norms the norm scales are 1 + N(0, 0.1^2) instead of ones, so tests exercise them."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape, _, init in param_defs(c):
        if init == "ones":
            v = np.ones(shape) + (0.1 * rng.standard_normal(shape) if perturb_norms else 0.0)
        elif init == "normal":
            v = rng.standard_normal(shape)
        else:  # variance_scaling(1, fan_in, truncated_normal): N(0,1) truncated to (-2, 2), rescaled
            v = rng.standard_normal(shape)
            bad = np.abs(v) >= 2.0
            while bad.any():
                v[bad] = rng.standard_normal(int(bad.sum()))
                bad = np.abs(v) >= 2.0
            v = v * (math.sqrt(1.0 / init) / 0.8796256610342398)
        params[name] = v.astype(np.float32)
    return params


# ---------------------------------------------------------------------------------------------
# The model (src/model/llama.rs, section 3)
# ---------------------------------------------------------------------------------------------

def rms_norm(x, scale, eps, dtype):
    """MaxText's RMSNorm: statistics in f32, normalized value cast to dtype, times scale."""
    xf = x.astype(F32)
    inv = jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
    return (xf * inv).astype(dtype) * scale.astype(dtype)


def rope_tables(c, seq):
    """cos/sin [seq, head_dim/2] in f32: angle(p, i) = p * max_timescale^(-2i/head_dim), the
    inverse timescales computed in f64 and rounded to f32 (as llama.rs's Shared::new)."""
    half = c.head_dim // 2
    inv_timescale = (c.rope_max_timescale ** (-2.0 * np.arange(half) / c.head_dim)).astype(np.float32)
    angles = jnp.arange(seq, dtype=F32)[:, None] * jnp.asarray(inv_timescale)[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def rope(x, cos, sin):
    """Half-split rotary embedding of x [b, t, h, d]: [x1 cos - x2 sin, x2 cos + x1 sin], in f32."""
    half = x.shape[-1] // 2
    xf = x.astype(F32)
    x1, x2 = xf[..., :half], xf[..., half:]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def softmax_f32(x):
    """exp(x - max) / sum, the max through stop_gradient (as llama.rs's softmax)."""
    e = jnp.exp(x - jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True)))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def attention(c, p, h, cos, sin, causal):
    dt = c.compute_dtype
    b, t = h.shape[0], h.shape[1]
    group = c.heads // c.kv_heads
    q = checkpoint_name(jnp.einsum("btd,dhk->bthk", h, p["self_attention.query.kernel"].astype(dt)), "query_proj")
    k = checkpoint_name(jnp.einsum("btd,dhk->bthk", h, p["self_attention.key.kernel"].astype(dt)), "key_proj")
    v = checkpoint_name(jnp.einsum("btd,dhk->bthk", h, p["self_attention.value.kernel"].astype(dt)), "value_proj")
    # No query scaling: maxrs's llama2 (as MaxText, `init_query_w`) keeps 1/sqrt(head_dim) in the
    # query kernel.
    q = rope(q, cos, sin)
    k = rope(k, cos, sin)
    q = q.reshape(b, t, c.kv_heads, group, c.head_dim)  # query head i uses kv head i // group
    scores = jnp.einsum("btngk,bsnk->bngts", q, k).astype(F32)
    probs = softmax_f32(jnp.where(causal[None, None, None], scores, MASK_VALUE)).astype(dt)
    out = jnp.einsum("bngts,bsnk->btngk", probs, v).reshape(b, t, c.heads, c.head_dim)
    return checkpoint_name(jnp.einsum("bthk,hkd->btd", out, p["self_attention.out.kernel"].astype(dt)), "out_proj")


def mlp(c, p, h):
    dt = c.compute_dtype
    gate = checkpoint_name(h @ p["mlp.wi_0.kernel"].astype(dt), "mlpwi_0")
    up = checkpoint_name(h @ p["mlp.wi_1.kernel"].astype(dt), "mlpwi_1")
    return checkpoint_name((gate * jax.nn.sigmoid(gate) * up) @ p["mlp.wo.kernel"].astype(dt), "mlpwo")


def remat_policy(name):
    return {
        "full": jax.checkpoint_policies.nothing_saveable,
        "minimal": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
        "save_qkv_proj": jax.checkpoint_policies.save_only_these_names("query_proj", "key_proj", "value_proj"),
    }[name]


def forward(c, params, tokens, mesh=None):
    """f32 logits [batch, seq, vocab] of s32 tokens [batch, seq]."""
    dt = c.compute_dtype

    def constrain(x):  # activations: batch on fsdp (MaxText's activation_batch rule)
        if mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("fsdp", *([None] * (x.ndim - 1)))))

    seq = tokens.shape[1]
    cos, sin = rope_tables(c, seq)
    causal = jnp.arange(seq)[:, None] >= jnp.arange(seq)[None, :]

    def layer(x, p):
        h = rms_norm(x, p["pre_self_attention_layer_norm.scale"], c.eps, dt)
        x = constrain(x + attention(c, p, h, cos, sin, causal))
        h = rms_norm(x, p["post_self_attention_layer_norm.scale"], c.eps, dt)
        return constrain(x + mlp(c, p, h))

    if c.remat_policy != "none":
        layer = jax.checkpoint(layer, policy=remat_policy(c.remat_policy), prevent_cse=not c.scan_layers)

    embedding = params["token_embedder.embedding"].astype(dt)
    x = constrain(embedding[tokens])
    if c.scan_layers:
        prefix = "decoder.layers."
        stacked = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
        x, _ = jax.lax.scan(lambda carry, p: (layer(carry, p), None), x, stacked)
    else:
        for i in range(c.layers):
            prefix = f"decoder.layers_{i}."
            x = layer(x, {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)})
    y = rms_norm(x, params["decoder.decoder_norm.scale"], c.eps, dt)
    if c.logits_via_embedding:
        # MaxText's normalize_embedding_logits (on by default): tied logits over sqrt(emb).
        logits = jnp.einsum("btd,vd->btv", y, embedding) / jnp.sqrt(jnp.asarray(c.emb, dt))
    else:
        logits = y @ params["decoder.logits_dense.kernel"].astype(dt)
    return constrain(logits.astype(F32))


def loss_fn(c, params, batch, mesh=None):
    """Masked mean cross-entropy + z_loss_multiplier * logsumexp^2 (llama.rs section 4)."""
    logits = forward(c, params, batch["inputs"], mesh)
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    log_z = (jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1, keepdims=True)) + m)[..., 0]
    target_logit = jnp.sum(logits * jax.nn.one_hot(batch["targets"], c.vocab, dtype=F32), axis=-1)
    weights = (batch["targets_segmentation"] != 0).astype(F32)
    z_term = jnp.square(log_z) * c.z_loss_multiplier
    total_loss = jnp.sum((log_z - target_logit + z_term) * weights)
    return total_loss / jnp.maximum(jnp.sum(weights), 1.0)


# ---------------------------------------------------------------------------------------------
# Learning-rate schedule (src/train/schedule.rs) and AdamW (optax.adamw + clip_by_global_norm)
# ---------------------------------------------------------------------------------------------

def schedule_parts(c):
    steps = c.learning_rate_schedule_steps
    warmup = int(steps * c.warmup_steps_fraction)
    return steps, warmup, steps - warmup


def learning_rate_host(c, step):
    """schedule.rs's LearningRateSchedule::at, in f64 (for checks)."""
    steps, warmup, cosine = schedule_parts(c)
    lr = c.learning_rate
    if step >= steps:
        return 0.0
    if step < warmup:
        return lr * step / (warmup - 1) if warmup > 1 else 0.0
    pct = (step - warmup) / (cosine - 1) if cosine > 1 else 1.0
    a = 0.5 * (math.cos(math.pi * pct) + 1.0)
    return lr * a + lr * c.learning_rate_final_fraction * (1.0 - a)


def learning_rate(c, step):
    """The same schedule in-graph, in f32, of an s32 step counter."""
    steps, warmup, cosine = schedule_parts(c)
    lr, final = c.learning_rate, c.learning_rate * c.learning_rate_final_fraction
    s = step.astype(F32)
    warm = lr * s / (warmup - 1) if warmup > 1 else jnp.zeros((), F32)
    pct = (s - warmup) / (cosine - 1) if cosine > 1 else jnp.ones((), F32)
    a = 0.5 * (jnp.cos(jnp.pi * pct) + 1.0)
    decay = lr * a + final * (1.0 - a)
    return jnp.where(step >= steps, 0.0, jnp.where(step < warmup, warm, decay)).astype(F32)


def global_norm(tree):
    """sqrt of the sum over leaves of sum(x^2) (optax.tree.norm)."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def clip_by_global_norm(grads, norm, threshold):
    """optax.clip_by_global_norm: unchanged when norm < threshold, else scaled to the threshold."""
    keep = norm < threshold
    return jax.tree.map(lambda g: jax.lax.select(keep, g, (g / norm.astype(g.dtype)) * threshold), grads)


def adamw_init(params):
    zeros = lambda p: jnp.zeros_like(p)  # noqa: E731  moments in the parameters' dtype (mu_dtype=None)
    return {"count": jnp.zeros((), jnp.int32),
            "mu": jax.tree.map(zeros, params), "nu": jax.tree.map(zeros, params)}


def adamw_update(c, params, grads, opt, lr):
    """optax.adamw(lr, b1, b2, eps, eps_root, weight_decay) with no mask, written out in optax's
    order of operations: bias-corrected moments, eps outside and eps_root inside the sqrt,
    decoupled weight decay on every parameter, then scaled by -lr."""
    b1, b2 = c.adam_b1, c.adam_b2
    count = opt["count"] + 1
    bc1, bc2 = 1 - b1 ** count, 1 - b2 ** count

    def leaf(p, g, mu, nu):
        mu = (1 - b1) * g + b1 * mu
        nu = (1 - b2) * (g ** 2) + b2 * nu
        u = (mu / bc1.astype(mu.dtype)) / (jnp.sqrt(nu / bc2.astype(nu.dtype) + c.adam_eps_root) + c.adam_eps)
        u = u + c.adam_weight_decay * p
        u = jnp.asarray(-lr, dtype=u.dtype) * u
        return (p + u).astype(p.dtype), mu, nu

    out = {k: leaf(params[k], grads[k], opt["mu"][k], opt["nu"][k]) for k in params}
    return ({k: v[0] for k, v in out.items()},
            {"count": count, "mu": {k: v[1] for k, v in out.items()}, "nu": {k: v[2] for k, v in out.items()}})


def make_train_step(c, mesh=None):
    def train_step(params, opt, batch):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(c, p, batch, mesh))(params)
        grad_norm = global_norm(grads)
        if c.gradient_clipping_threshold > 0:
            grads = clip_by_global_norm(grads, grad_norm, c.gradient_clipping_threshold)
        lr = learning_rate(c, opt["count"])  # the pre-increment count: step 0 uses schedule(0)
        params, opt = adamw_update(c, params, grads, opt, lr)
        return params, opt, {"loss": loss, "grad_norm": grad_norm, "learning_rate": lr}

    return train_step


# ---------------------------------------------------------------------------------------------
# Data (src/train/data.rs, dataset_type=tokens)
# ---------------------------------------------------------------------------------------------

def load_tokens(path, c):
    data = np.fromfile(path, dtype="<i4")
    row = c.seq + 1
    if data.size == 0 or data.size % row:
        raise ValueError(f"{path}: {data.size} int32 ids is not a positive multiple of seq+1={row}")
    rows = data.reshape(-1, row).astype(np.int32)
    bad = np.argwhere((rows < 0) | (rows >= c.vocab))
    if bad.size:
        r, t = bad[0]
        raise ValueError(f"{path}: row {r}, position {t}: token id {rows[r, t]} is outside [0, {c.vocab})")
    return rows


def batch_rows(rows, c, step):
    """Step k uses global rows k*B .. (k+1)*B, wrapping around the file."""
    idx = (step * c.global_batch + np.arange(c.global_batch)) % rows.shape[0]
    r = rows[idx]
    return {"inputs": r[:, :-1], "targets": r[:, 1:], "targets_segmentation": np.ones_like(r[:, 1:])}


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def shardings(c, mesh):
    """NamedShardings for params, optimizer state and batch on the 1-D fsdp mesh: each parameter's
    `embed` dimension and the batch dimension go on fsdp; everything else is replicated."""
    def spec(logical):
        return NamedSharding(mesh, P(*["fsdp" if a == "embed" else None for a in logical]))

    params = {name: spec(logical) for name, _, logical, _ in param_defs(c)}
    replicated = NamedSharding(mesh, P())
    opt = {"count": replicated, "mu": params, "nu": params}
    batch = {k: NamedSharding(mesh, P("fsdp", None)) for k in ("inputs", "targets", "targets_segmentation")}
    metrics = {k: replicated for k in ("loss", "grad_norm", "learning_rate")}
    return params, opt, batch, metrics


def train(c, params, rows, log=True):
    """Runs c.steps steps from params ({name: array}) on token rows; returns the RESULT dict."""
    devices = _ALL_DEVICES[:c.num_devices]
    step_fn = make_train_step(c, None)
    if c.num_devices > 1:
        mesh = Mesh(np.array(devices), ("fsdp",))
        p_sh, o_sh, b_sh, m_sh = shardings(c, mesh)
        step_fn = make_train_step(c, mesh)
        params = jax.device_put(params, p_sh)
        opt = jax.device_put(adamw_init(params), o_sh)
        put_batch = lambda b: jax.device_put(b, b_sh)  # noqa: E731
        jitted = jax.jit(step_fn, in_shardings=(p_sh, o_sh, b_sh), out_shardings=(p_sh, o_sh, m_sh),
                         donate_argnums=(0, 1))
    else:
        params = jax.device_put(params, devices[0])
        opt = jax.device_put(adamw_init(params), devices[0])
        put_batch = lambda b: jax.device_put(b, devices[0])  # noqa: E731
        jitted = jax.jit(step_fn, donate_argnums=(0, 1))

    batch = put_batch(batch_rows(rows, c, 0))
    t = time.perf_counter()
    traced = jitted.trace(params, opt, batch)
    t_trace = time.perf_counter() - t
    t = time.perf_counter()
    lowered = traced.lower()
    t_lower = time.perf_counter() - t
    t = time.perf_counter()
    compiled = lowered.compile()
    t_compile = time.perf_counter() - t

    startup = time.perf_counter() - _IMPORT_START  # script start to the first step
    step_times, metrics = [], []
    for step in range(c.steps):
        if step > 0:
            batch = put_batch(batch_rows(rows, c, step))
            jax.block_until_ready(batch)
        t = time.perf_counter()
        params, opt, m = compiled(params, opt, batch)
        jax.block_until_ready((params, opt, m))
        step_times.append(time.perf_counter() - t)
        metrics.append(m)
        if log:
            print(f"step {step}: loss {float(m['loss']):.6f}  grad_norm {float(m['grad_norm']):.6f}  "
                  f"lr {float(m['learning_rate']):.6g}  {step_times[-1]:.3f} s", file=sys.stderr)

    return {
        "jax_version": jax.__version__,
        "devices": [f"{d.platform}:{d.id}" for d in devices],
        "timings_s": {
            "import": IMPORT_SECONDS,
            "startup": startup,
            "trace": t_trace,
            "lower": t_lower,
            "compile": t_compile,
            "first_step": step_times[0],
            "median_step": statistics.median(step_times[1:]) if len(step_times) > 1 else None,
        },
        "losses": [float(m["loss"]) for m in metrics],
        "grad_norms": [float(m["grad_norm"]) for m in metrics],
        "learning_rates": [float(m["learning_rate"]) for m in metrics],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def summary(c, result):
    t = result["timings_s"]
    tokens = c.global_batch * c.seq
    med = t["median_step"]
    lines = [
        f"jax {result['jax_version']} on {len(result['devices'])} CPU device(s); "
        f"{c.layers} layers, emb {c.emb}, vocab {c.vocab}, batch {c.global_batch} x seq {c.seq}, "
        f"{c.dtype}/{c.weight_dtype}, scan_layers={c.scan_layers}, remat={c.remat_policy}",
        f"import {t['import']:.2f} s, trace {t['trace']:.2f} s, lower {t['lower']:.2f} s, "
        f"compile {t['compile']:.2f} s, first step {t['first_step']:.3f} s"
        + (f", median step {med:.3f} s ({tokens / med:.0f} tokens/s)" if med else ""),
        f"loss {result['losses'][0]:.6f} -> {result['losses'][-1]:.6f} over {c.steps} steps",
    ]
    return "\n".join(lines)


def run(config_path, params_path, tokens_path, out_path):
    with open(config_path) as f:
        c = Config(json.load(f))
    params = load_params(params_path, c)
    rows = load_tokens(tokens_path, c)
    result = train(c, params, rows)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(summary(c, result), file=sys.stderr)
    return result


# ---------------------------------------------------------------------------------------------
# Self-test
# ---------------------------------------------------------------------------------------------

def reference_loss_f64(c, params, batch):
    """The model and loss written independently in numpy float64 (no JAX), for checking."""
    P64 = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    inputs, targets = batch["inputs"], batch["targets"]
    b, t = inputs.shape

    def norm(x, scale):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.eps) * scale

    half = c.head_dim // 2
    freq = 1.0 / c.rope_max_timescale ** (np.arange(half) * 2.0 / c.head_dim)
    ang = np.arange(t)[:, None] * freq[None, :]
    cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]

    def rot(x):
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    x = P64["token_embedder.embedding"][inputs]
    group = c.heads // c.kv_heads
    future = np.triu(np.ones((t, t), dtype=bool), k=1)
    for i in range(c.layers):
        if c.scan_layers:
            p = {k[len("decoder.layers."):]: v[i] for k, v in P64.items() if k.startswith("decoder.layers.")}
        else:
            p = {k[len(f"decoder.layers_{i}."):]: v for k, v in P64.items() if k.startswith(f"decoder.layers_{i}.")}
        h = norm(x, p["pre_self_attention_layer_norm.scale"])
        q = rot(np.einsum("btd,dhk->bthk", h, p["self_attention.query.kernel"]))  # folded scale
        k = np.repeat(rot(np.einsum("btd,dhk->bthk", h, p["self_attention.key.kernel"])), group, axis=2)
        v = np.repeat(np.einsum("btd,dhk->bthk", h, p["self_attention.value.kernel"]), group, axis=2)
        s = np.einsum("bthk,bshk->bhts", q, k)
        s[:, :, future] = -np.inf
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        o = np.einsum("bhts,bshk->bthk", w, v)
        x = x + np.einsum("bthk,hkd->btd", o, p["self_attention.out.kernel"])
        h = norm(x, p["post_self_attention_layer_norm.scale"])
        g = h @ p["mlp.wi_0.kernel"]
        x = x + (g / (1.0 + np.exp(-g)) * (h @ p["mlp.wi_1.kernel"])) @ p["mlp.wo.kernel"]
    y = norm(x, P64["decoder.decoder_norm.scale"])
    logits = (y @ P64["token_embedder.embedding"].T / np.sqrt(c.emb) if c.logits_via_embedding
              else y @ P64["decoder.logits_dense.kernel"])
    mx = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(logits - mx).sum(axis=-1)) + mx[..., 0]
    tgt = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    w = (batch["targets_segmentation"] != 0).astype(np.float64)
    return float(((lse - tgt + c.z_loss_multiplier * lse ** 2) * w).sum() / max(w.sum(), 1.0))


def selftest_config(**overrides):
    d = dict(emb=64, heads=4, kv_heads=2, head_dim=16, mlp=128, layers=2, vocab=128, eps=1e-5,
             rope_max_timescale=10000.0, logits_via_embedding=False, dtype="float32",
             weight_dtype="float32", scan_layers=True, remat_policy="full", global_batch=4, seq=32,
             steps=5, learning_rate=1e-3, warmup_steps_fraction=0.2, learning_rate_final_fraction=0.1,
             learning_rate_schedule_steps=5, adam_b1=0.9, adam_b2=0.95, adam_eps=1e-8, adam_eps_root=0.0,
             adam_weight_decay=0.1, gradient_clipping_threshold=1.0, z_loss_multiplier=1e-4, num_devices=1)
    d.update(overrides)
    return d


def unstack(params, layers):
    """Scanned names -> decoder.layers_{i}.* (same values)."""
    out = {}
    for k, v in params.items():
        if k.startswith("decoder.layers."):
            for i in range(layers):
                out[f"decoder.layers_{i}." + k[len("decoder.layers."):]] = v[i]
        else:
            out[k] = v
    return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def selftest():
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, file=sys.stderr)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        # 1. The CLI path: files in, RESULT.json out.
        cfg_d = selftest_config()
        c = Config(cfg_d)
        params = random_params(c, seed=0, perturb_norms=True)
        rng = np.random.default_rng(1)
        rows = rng.integers(0, c.vocab, size=(3 * c.global_batch + 1, c.seq + 1), dtype=np.int32)
        paths = {k: os.path.join(tmp, n) for k, n in
                 (("config", "run.json"), ("params", "params.safetensors"), ("tokens", "tokens.bin"),
                  ("out", "result.json"))}
        with open(paths["config"], "w") as f:
            json.dump(cfg_d, f)
        save_params(paths["params"], params)
        rows.astype("<i4").tofile(paths["tokens"])
        result = run(paths["config"], paths["params"], paths["tokens"], paths["out"])
        with open(paths["out"]) as f:
            written = json.load(f)
        check(set(written) == {"jax_version", "devices", "timings_s", "losses", "grad_norms", "learning_rates",
                                  "peak_rss_bytes"}
              and len(written["losses"]) == c.steps, "RESULT.json has every field and one loss per step")
        check(all(math.isfinite(x) for x in result["losses"] + result["grad_norms"]), "losses and grad norms finite")

        # 2. Forward pass and loss against numpy float64.
        ref = reference_loss_f64(c, params, batch_rows(rows, c, 0))
        check(rel(result["losses"][0], ref) < 1e-5,
              f"step-0 loss {result['losses'][0]:.8f} vs numpy f64 {ref:.8f} (rel {rel(result['losses'][0], ref):.1e} < 1e-5)")

        # 3. Schedule: in-graph f32 values vs schedule.rs in f64, over warmup, cosine and the zero tail.
        lr_steps = 12
        sc = Config(selftest_config(learning_rate_schedule_steps=10, warmup_steps_fraction=0.3, steps=lr_steps))
        got = np.asarray(jax.jit(jax.vmap(lambda s: learning_rate(sc, s)))(jnp.arange(lr_steps, dtype=jnp.int32)))
        want = [learning_rate_host(sc, s) for s in range(lr_steps)]
        check(all(abs(g - w) <= 1e-6 * sc.learning_rate for g, w in zip(got, want)) and want[0] == 0.0
              and abs(want[2] - sc.learning_rate) < 1e-15 and want[10] == want[11] == 0.0,
              "schedule: f32 in-graph = schedule.rs (0 at step 0, peak at W-1, 0 from schedule steps on)")
        check(all(rel(g, w) < 1e-6 or w == 0 for g, w in zip(result["learning_rates"],
                                                           [learning_rate_host(c, s) for s in range(c.steps)])),
              "learning_rates in RESULT.json follow the schedule")

        # 4. Optimizer: hand-written clip + AdamW vs optax, on the model's parameters.
        check_optimizer_against_optax(sc, params, check)

        # 5. Equivalent variants give the same losses.
        three = dict(steps=3, learning_rate_schedule_steps=3)
        base = train(Config(selftest_config(**three)), params, rows, log=False)["losses"]

        def same(cfg, p, what, tol=1e-5):
            losses = train(Config(selftest_config(**three, **cfg)), p, rows, log=False)["losses"]
            worst = max(rel(a, b) for a, b in zip(losses, base))
            check(worst < tol, f"{what}: losses match scan/full (max rel {worst:.1e} < {tol:g})")

        same({"scan_layers": False}, unstack(params, c.layers), "unrolled layers_{i}")
        for policy in ("minimal", "save_qkv_proj", "none"):
            same({"remat_policy": policy}, params, f"remat_policy={policy}")
        same({"num_devices": 2}, params, "num_devices=2 (fsdp mesh)")
        same({"dtype": "bfloat16"}, params, "dtype=bfloat16 (loose)", tol=3e-2)
        same({"weight_dtype": "bfloat16", "dtype": "bfloat16"}, params, "weight_dtype=bfloat16 (loose)", tol=3e-2)

        # 6. Tied embeddings against numpy too.
        tc = Config(selftest_config(logits_via_embedding=True, steps=1, learning_rate_schedule_steps=1))
        tparams = {k: v for k, v in params.items() if k != "decoder.logits_dense.kernel"}
        tloss = train(tc, tparams, rows, log=False)["losses"][0]
        tref = reference_loss_f64(tc, tparams, batch_rows(rows, tc, 0))
        check(rel(tloss, tref) < 1e-5, f"logits_via_embedding: loss {tloss:.8f} vs numpy f64 {tref:.8f}")

        # 7. Learning: arithmetic progressions mod vocab (maxrs's synthetic data) are learnable.
        lc = Config(selftest_config(steps=60, learning_rate_schedule_steps=60, learning_rate=1e-2,
                                    global_batch=8, z_loss_multiplier=0.0))
        starts = rng.integers(0, lc.vocab, size=(64, 1))
        strides = rng.integers(1, 9, size=(64, 1))
        prog = ((starts + strides * np.arange(lc.seq + 1)[None, :]) % lc.vocab).astype(np.int32)
        losses = train(lc, random_params(lc, seed=2), prog, log=False)["losses"]
        check(np.mean(losses[-5:]) < 0.5 * losses[0],
              f"loss falls on a learnable sequence: {losses[0]:.3f} -> {np.mean(losses[-5:]):.3f} (last 5)")

    print(f"selftest: {len(failures)} failed" if failures else "selftest: all passed", file=sys.stderr)
    return 1 if failures else 0


def check_optimizer_against_optax(c, params, check):
    """clip_by_global_norm + adamw_update with the schedule vs optax's chain, over c.steps steps of
    random gradients (some above, some below the clipping threshold)."""
    try:
        import optax
    except ImportError:
        print("skip optimizer vs optax (optax is not installed)", file=sys.stderr)
        return
    tx = optax.chain(
        optax.clip_by_global_norm(c.gradient_clipping_threshold),
        optax.adamw(lambda count: learning_rate(c, count), b1=c.adam_b1, b2=c.adam_b2, eps=c.adam_eps,
                    eps_root=c.adam_eps_root, weight_decay=c.adam_weight_decay))
    rng = np.random.default_rng(3)
    p_mine = p_optax = {k: jnp.asarray(v) for k, v in params.items()}
    s_mine, s_optax = adamw_init(p_mine), tx.init(p_optax)

    @jax.jit
    def mine(p, s, g):
        g = clip_by_global_norm(g, global_norm(g), c.gradient_clipping_threshold)
        return adamw_update(c, p, g, s, learning_rate(c, s["count"]))

    @jax.jit
    def reference(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    worst = 0.0
    for step in range(c.steps):
        scale = 0.3 if step % 2 else 3e-3  # global norm above and below the threshold
        g = {k: jnp.asarray(scale * rng.standard_normal(v.shape).astype(np.float32)) for k, v in params.items()}
        p_mine, s_mine = mine(p_mine, s_mine, g)
        p_optax, s_optax = reference(p_optax, s_optax, g)
        for k in params:
            diff = float(jnp.max(jnp.abs(p_mine[k] - p_optax[k])))
            worst = max(worst, diff / max(float(jnp.max(jnp.abs(p_optax[k]))), 1e-30))
    check(worst < 1e-6, f"clip + AdamW + schedule = optax.chain(clip_by_global_norm, adamw) over {c.steps} steps "
                        f"(max rel diff {worst:.1e})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", help="RUN.json")
    ap.add_argument("--params", help="parameters in maxrs's layout (safetensors)")
    ap.add_argument("--tokens", help="flat little-endian int32 token rows of seq+1 ids")
    ap.add_argument("--out", help="RESULT.json to write")
    ap.add_argument("--selftest", action="store_true", help="run the self-test on a tiny random model")
    args = ap.parse_args(argv)
    if args.selftest:
        return selftest()
    missing = [f"--{k}" for k in ("config", "params", "tokens", "out") if getattr(args, k) is None]
    if missing:
        ap.error("missing " + ", ".join(missing) + " (or use --selftest)")
    try:
        run(args.config, args.params, args.tokens, args.out)
    except (ValueError, OSError) as e:
        print(f"jax_train: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
