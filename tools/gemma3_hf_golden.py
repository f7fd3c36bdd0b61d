#!/usr/bin/env python3
"""Golden logits of Hugging Face's Gemma3ForCausalLM on a tiny random checkpoint (issue 31).

Writes tests/data/gemma3_hf/model.safetensors (the checkpoint, Hugging Face's tensor names, f32)
and tests/data/gemma3_hf/golden.json (the config, the input tokens, the f32 logits and their
argmax), which tests/gemma3_hf.rs compares maxrs's Gemma 3 against after mapping the tensors with
src/model/gemma3_hf.rs's table. Run with transformers and CPU torch (versions recorded in the JSON):

    ~/.cache/maxrs/venvs/hf-golden/bin/python tools/gemma3_hf_golden.py
"""
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "gemma3_hf")

CONFIG = dict(
    vocab_size=48,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=6,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    sliding_window=4,
    query_pre_attn_scalar=8,  # head_dim, as gemma3-4b and -12b
    rms_norm_eps=1e-6,
    rope_theta=100.0,  # global layers; small so that 12 positions rotate visibly
    rope_local_base_freq=10000.0,
    rope_scaling={"rope_type": "linear", "factor": 4.0},
    max_position_embeddings=64,
)


def main():
    torch.manual_seed(31)
    config = Gemma3TextConfig(**CONFIG)
    config._attn_implementation = "eager"
    model = Gemma3ForCausalLM(config).float().eval()
    # Hugging Face initializes norm weights to 0 (a gain of 1 + 0) and linears with std 0.02:
    # draw every tensor instead so each one matters.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
            elif "embed_tokens" in name:
                p.uniform_(-0.5, 0.5)
            else:
                a = 1.7 / p.shape[1] ** 0.5
                p.uniform_(-a, a)
    tokens = torch.randint(0, CONFIG["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
    os.makedirs(OUT, exist_ok=True)
    tensors = {n: p.detach().contiguous() for n, p in model.named_parameters() if n != "lm_head.weight"}
    save_file(tensors, os.path.join(OUT, "model.safetensors"))
    golden = {
        "command": "~/.cache/maxrs/venvs/hf-golden/bin/python tools/gemma3_hf_golden.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config": CONFIG,
        "tokens": tokens.tolist(),
        "logits": [round(v, 7) for v in logits.flatten().tolist()],
        "argmax": logits.argmax(-1).tolist(),
    }
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f)
        f.write("\n")


if __name__ == "__main__":
    main()
