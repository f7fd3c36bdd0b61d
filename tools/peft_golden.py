"""Golden logits of LoRA adapters in Hugging Face PEFT's format, for `tests/lora_peft.rs`.

For two of `tools/hf_golden.py`'s tiny checkpoints (llama3.1: its query and key rows are
reordered on conversion; gemma2: its query scaling is folded into the query weights), an adapter
of rank 4 and alpha 8 on every attention and MLP projection, whose weights come from the same
deterministic generator (`hf_golden.values`, the tensor's PEFT name as its seed), is loaded by
`peft` over the model loaded by `transformers` (f32, eager attention), and the logits of the
family's golden sequence are recorded. The test writes the same checkpoint and adapter, converts
them with `maxrs convert from-hf ... hf_lora_adapter_path=`, and checks maxrs's logits.

Made with the venv of `tools/hf_golden.py` plus peft (versions in the output's "versions"):

    ~/.cache/maxrs/venvs/hf-golden/bin/pip install peft==0.21.2
    ~/.cache/maxrs/venvs/hf-golden/bin/python tools/peft_golden.py tests/data/peft_golden.json
"""

import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import hf_golden  # noqa: E402

RANK, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FAMILIES = ["llama3.1", "gemma2"]


def adapter_tensors(shapes):
    """The adapter's tensors (PEFT's names and shapes) for a model of tensors `shapes`."""
    out = {}
    for name, shape in shapes.items():
        module = name.removesuffix(".weight")
        if module.split(".")[-1] not in TARGETS:
            continue
        prefix = f"base_model.model.{module}"
        out[f"{prefix}.lora_A.weight"] = [RANK, shape[1]]
        out[f"{prefix}.lora_B.weight"] = [shape[0], RANK]
    return out


def adapter_config():
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
            "target_modules": TARGETS, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "base_model_name_or_path": None}


def write_adapter(d, shapes):
    import torch
    from safetensors.torch import save_file

    tensors = {name: torch.tensor(hf_golden.values(name, math.prod(shape), False), dtype=torch.float32)
               .reshape(shape) for name, shape in adapter_tensors(shapes).items()}
    save_file(tensors, f"{d}/adapter_model.safetensors", metadata={"format": "pt"})
    with open(f"{d}/adapter_config.json", "w") as f:
        json.dump(adapter_config(), f)


def main(out_path):
    import peft
    import torch
    import transformers

    base_golden = json.load(open(os.path.join(os.path.dirname(__file__), "../tests/data/hf_golden.json")))
    golden = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "peft": peft.__version__},
              "rank": RANK, "alpha": ALPHA, "targets": TARGETS, "families": {}}
    cases = hf_golden.cases()
    for family in FAMILIES:
        config, shapes = cases[family]
        sequence = base_golden["families"][family]["sequence"]
        with tempfile.TemporaryDirectory() as base, tempfile.TemporaryDirectory() as adapter:
            hf_golden.write_checkpoint(base, config, shapes)
            write_adapter(adapter, shapes)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                base, dtype=torch.float32, attn_implementation="eager")
            model = peft.PeftModel.from_pretrained(model, adapter)
            model.eval()
            # Every adapter tensor of the file was loaded (not left at PEFT's initialization).
            loaded = {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}
            assert sorted(loaded) == sorted(adapter_tensors(shapes)), sorted(loaded)
            for name, shape in adapter_tensors(shapes).items():
                want = torch.tensor(hf_golden.values(name, math.prod(shape), False)).reshape(shape)
                assert torch.equal(loaded[name].detach(), want), name
            with torch.no_grad():
                logits = model(torch.tensor([sequence])).logits[0]
        golden["families"][family] = {
            "logits": [[float(f"{x:.7g}") for x in row] for row in logits.tolist()],
        }
        print(family, "logits[0][:4]:", golden["families"][family]["logits"][0][:4])
    with open(out_path, "w") as f:
        json.dump(golden, f, separators=(",", ":"))


if __name__ == "__main__":
    main(sys.argv[1])
