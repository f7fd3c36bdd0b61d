#!/usr/bin/env python3
"""An f64 reference of MaxText's llama2 loss on its synthetic batch, from a checkpoint's values.

Reads `tests/data/orbax/values/nnx_step1.safetensors` (the parameters Orbax restored from the
fixture's MaxText checkpoint: tests/data/orbax/README.md) and computes, in numpy f64, the loss
of MaxText e591f30's llama2 decoder (`models/llama2.py`: RMSNorm, attention with half-split
RoPE, SwiGLU MLP, untied logits) on MaxText's synthetic batch (`SyntheticDataIterator`:
`randint(PRNGKey(0), (batch, S + 1), 0, vocab)`), for the fixture's sizes.

The queries are not scaled at run time: MaxText (and maxrs, since it adopted the convention)
folds `head_dim^-1/2` into the query kernel. One switch shows what MaxText's trainer does that
maxrs does not (issue 47):
- `--prng unsafe_rbg|threefry2x32`: MaxText's `train.py` sets `jax_default_prng_impl=unsafe_rbg`
  before it builds the synthetic iterator, so its tokens are `unsafe_rbg` draws (threefry:
  JAX's default, which maxrs's synthetic data follows).

    /tmp/mtvenv/bin/python tools/maxtext_llama_loss.py --prng unsafe_rbg     # 4.815190: MaxText's
    /tmp/mtvenv/bin/python tools/maxtext_llama_loss.py --prng threefry2x32   # 4.667259: maxrs's
"""
import argparse
import os

import numpy as np

LAYERS, HEADS, HEAD_DIM, VOCAB, SEQ = 3, 2, 8, 64, 16


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--values", default=os.path.join(here, "../tests/data/orbax/values/nnx_step1.safetensors"))
    p.add_argument("--prng", choices=["unsafe_rbg", "threefry2x32"], default="unsafe_rbg")
    args = p.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax  # pylint: disable=import-outside-toplevel
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

    jax.config.update("jax_default_prng_impl", args.prng)
    values = load_file(args.values)

    def param(name):
        return values["params/params/" + name].astype(np.float64)

    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(0), (1, SEQ + 1), 0, VOCAB))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def rms(x, scale):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * scale

    def rope(x):
        half = HEAD_DIM // 2
        angle = np.arange(SEQ)[None, :, None, None] / 10000.0 ** (2 * np.arange(half) / HEAD_DIM)
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)

    x = param("token_embedder/embedding")[inputs]
    for layer in range(LAYERS):
        # Scanned parameters carry the layer axis at MaxText's `param_scan_axis=1`.
        def p_(name, layer=layer):
            return np.take(param("decoder/layers/" + name), layer, axis=1)

        h = rms(x, p_("pre_self_attention_layer_norm/scale"))
        q, k, v = (np.einsum("bse,ehd->bshd", h, p_(f"self_attention/{n}/kernel")) for n in ("query", "key", "value"))
        q, k = rope(q), rope(k)
        scores = np.where(np.tril(np.ones((SEQ, SEQ), bool)), np.einsum("bqhd,bkhd->bhqk", q, k), -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + np.einsum("bqhd,hde->bqe", np.einsum("bhqk,bkhd->bqhd", probs, v), p_("self_attention/out/kernel"))
        h = rms(x, p_("post_self_attention_layer_norm/scale"))
        gate = np.einsum("bse,em->bsm", h, p_("mlp/wi_0/kernel"))
        up = np.einsum("bse,em->bsm", h, p_("mlp/wi_1/kernel"))
        x = x + np.einsum("bsm,me->bse", gate / (1 + np.exp(-gate)) * up, p_("mlp/wo/kernel"))
    logits = rms(x, param("decoder/decoder_norm/scale")) @ param("decoder/logits_dense/kernel")
    top = logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    target_logit = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    print(f"tokens {tokens.tolist()}")
    print(f"loss {(log_z - target_logit).mean():.6f}")


if __name__ == "__main__":
    main()
