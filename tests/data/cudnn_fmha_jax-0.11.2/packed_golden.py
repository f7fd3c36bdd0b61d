"""How the packed-document golden files here were made (tests/cudnn_golden.rs).

JAX 0.11.2 (`pip install jax==0.11.2 jaxlib==0.11.2`, CPU only) lowers its cuDNN fused attention
for the CUDA platform without a GPU once the two checks that ask the device (cuDNN version,
compute capability) answer as an H100 with cuDNN 9.10 would; nothing else is changed. Lowered
this way, the causal MHA case gives the same custom calls, field for field, as
causal_mha.*.stablehlo.mlir, which was lowered on an H100.

    python packed_golden.py fwd 8 > packed.fwd.stablehlo.mlir
    python packed_golden.py fwdbwd 8 > packed.fwdbwd.stablehlo.mlir
    python packed_golden.py fwd 2 256 > packed_gqa_window.fwd.stablehlo.mlir
    python packed_golden.py fwdbwd 2 256 > packed_gqa_window.fwdbwd.stablehlo.mlir
    python packed_golden.py offsets     # the values of tests/cudnn_golden.rs's packed_layout test

Arguments: pass (fwd: inference; fwdbwd: jax.vjp), key/value heads, sliding window. Shapes: batch
2, 1024 tokens, 8 query heads of 128, bf16, at most 3 documents a row (q_seqlen [2, 3], q_offsets
[2, 4]), mask PADDING_CAUSAL (JAX's packed-layout tests pair it with causal attention).
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.cudnn import fused_attention_stablehlo as fa

fa.check_cudnn_version = lambda: 91000
fa.check_compute_capability = lambda capability: True
fa.is_cuda_compute_capability_equal = lambda capability: False


def offsets():
    """`_fix_seqlen_offsets` on 3 rows of 16 tokens, 4 query and 2 key/value heads of 8: row 0
    holds documents of 3, 4 and 2 tokens then 7 of padding (which joins the last document), row 1
    one document and padding, row 2 only padding."""
    q = jnp.zeros((3, 16, 4, 8), jnp.bfloat16)
    k = jnp.zeros((3, 16, 2, 8), jnp.bfloat16)
    seqlen = jnp.array([[3, 4, 9], [16, -1, -1], [16, -1, -1]], jnp.int32)
    starts = jnp.array([[0, 3, 7, -1], [0, -1, -1, -1], [0, -1, -1, -1]], jnp.int32)
    names = ["q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets"]
    for name, x in zip(names, fa._fix_seqlen_offsets(seqlen, seqlen, starts, starts, q, k)):
        print(name, np.asarray(x).tolist())


def lowered(pass_, kv_heads, window):
    B, T, N, H, M = 2, 1024, 8, 128, 3
    q = jax.ShapeDtypeStruct((B, T, N, H), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, T, kv_heads, H), jnp.bfloat16)
    seq = jax.ShapeDtypeStruct((B, M), jnp.int32)
    off = jax.ShapeDtypeStruct((B, M + 1), jnp.int32)

    def attn(q, k, v, qs, ks, qo, ko):
        return fa.dot_product_attention(q, k, v, q_seqlen=qs, kv_seqlen=ks, q_offsets=qo, kv_offsets=ko,
                                        mask_type=fa.MaskType.PADDING_CAUSAL, scale=1.0, qkv_layout="BTNH",
                                        sliding_window_length=window)

    def fwdbwd(q, k, v, qs, ks, qo, ko):
        out, vjp = jax.vjp(lambda q, k, v: attn(q, k, v, qs, ks, qo, ko), q, k, v)
        return vjp(out)

    f = attn if pass_ == "fwd" else fwdbwd
    return jax.jit(f).trace(q, kv, kv, seq, seq, off, off).lower(lowering_platforms=("cuda",)).as_text()


if __name__ == "__main__":
    if sys.argv[1] == "offsets":
        offsets()
    else:
        print(lowered(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None))
