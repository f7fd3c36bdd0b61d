"""Writes tests/data/chat/: four tokenizer folders whose tokenizer_config.json carries a real
model's chat template, and golden.json, what transformers' apply_chat_template and MaxText's SFT
preprocessing give for each of a few conversations (rendered text and token ids).

The templates are copied verbatim from public files (each folder's `source` below names it);
the tokenizer under them is the small byte-level BPE of tests/data/shakespeare-bytelevel512
with the template's special tokens added, so the ids test the rendering and the special tokens
without shipping multi-megabyte vocabularies. Run once by hand (the test pins the output):

  python3 -m venv /tmp/tf && /tmp/tf/bin/pip install transformers==5.24.0 tokenizers==0.23.3 jinja2==3.1.6 pyyaml
  /tmp/tf/bin/python tools/data/chat_golden.py --maxtext MAXTEXT_CHECKOUT  # maxtext at e591f30
"""
import argparse
import json
import os
import subprocess

import yaml
from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerFast

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")
COMMIT = "e591f30"

# Mixtral-8x7B-Instruct-v0.1's tokenizer_config.json chat_template, as huggingface/text-generation-inference
# router/src/infer/chat_template.rs (test_chat_templates) records it.
MIXTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)


def git_show(repo, path):
  return subprocess.check_output(["git", "-C", repo, "show", f"{COMMIT}:{path}"], text=True)


def families(maxtext):
  llama = yaml.safe_load(git_show(maxtext, "src/maxtext/configs/post_train/distillation-sft.yml"))["chat_template"]
  qwen = json.loads(git_show(maxtext, "src/maxtext/assets/tokenizers/qwen3-tokenizer/tokenizer_config.json"))
  gemma = json.loads(git_show(maxtext, "src/maxtext/examples/chat_templates/gemma-3-27b-chat_template.json"))
  return {
      "llama3": dict(
          source=f"maxtext {COMMIT} src/maxtext/configs/post_train/distillation-sft.yml chat_template (Llama 3 Instruct's format)",
          template=llama,
          specials=["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
          config=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
      ),
      "qwen3": dict(
          source=f"maxtext {COMMIT} src/maxtext/assets/tokenizers/qwen3-tokenizer/tokenizer_config.json chat_template (Qwen3)",
          template=qwen["chat_template"],
          specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
          config=dict(bos_token=None, eos_token=qwen["eos_token"], pad_token=qwen["pad_token"]),
      ),
      "gemma3": dict(
          source=f"maxtext {COMMIT} src/maxtext/examples/chat_templates/gemma-3-27b-chat_template.json (Gemma 3 27B it)",
          template=gemma["chat_template"],
          specials=["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
          config=dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"),
      ),
      "mistral": dict(
          source="huggingface/text-generation-inference router/src/infer/chat_template.rs, mistralai/Mixtral-8x7B-Instruct-v0.1",
          template=MIXTRAL,
          specials=["<unk>", "<s>", "</s>"],
          config=dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
      ),
  }


SYSTEM = {"role": "system", "content": "You are a terse assistant."}
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [
        {"role": "user", "content": "  Count to three.  "},
        {"role": "assistant", "content": "One, two, three."},
        {"role": "user", "content": "Now backwards, s'il vous plaît."},
        {"role": "assistant", "content": "Three, two, one. \u00e9t\u00e9 \U0001F600"},
    ],
]


def ids_of(encoded):
  """MaxText's extract_token_ids (input_pipeline_utils.py)."""
  if hasattr(encoded, "input_ids"):
    return list(encoded.input_ids)
  if isinstance(encoded, dict):
    return list(encoded["input_ids"])
  return list(encoded)


def completion(tok, round_msgs):
  """MaxText's _get_completion_in_chat_template (input_pipeline_utils.py at e591f30)."""
  full = ids_of(tok.apply_chat_template(round_msgs, add_generation_prompt=False, tokenize=True))
  prompt = ids_of(tok.apply_chat_template(round_msgs[:-1], add_generation_prompt=True, tokenize=True))
  common = 0
  for a, b in zip(full, prompt):
    if a != b:
      break
    common += 1
  assert common > 0
  return tok.decode(full[common:], skip_special_tokens=False)


def sft_segments(tok, messages):
  """MaxText's apply_chat_template + tokenization for use_sft (input_pipeline_utils.py at e591f30):
  each user turn renders (with the round's system message) with the generation prompt; each
  assistant turn is the completion after it; segments are then tokenized."""
  segments, round_msgs = [], []
  for message in messages:
    round_msgs.append(message)
    if message["role"] == "user":
      text = tok.apply_chat_template(round_msgs, add_generation_prompt=True, tokenize=False)
      segments.append((text, True))
    elif message["role"] == "assistant":
      segments.append((completion(tok, round_msgs), False))
      round_msgs = []
  return [dict(text=t, prompt=p, ids=tok(t)["input_ids"]) for t, p in segments]


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--maxtext", required=True, help="a maxtext checkout holding commit " + COMMIT)
  args = ap.parse_args()
  base = os.path.join(HERE, "shakespeare-bytelevel512", "tokenizer.json")
  golden = {}
  for name, fam in families(args.maxtext).items():
    folder = os.path.join(HERE, "chat", name)
    os.makedirs(folder, exist_ok=True)
    raw = Tokenizer.from_file(base)
    raw.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in fam["specials"]])
    raw.save(os.path.join(folder, "tokenizer.json"))
    config = dict(fam["config"], chat_template=fam["template"], source=fam["source"],
                  tokenizer_class="PreTrainedTokenizerFast")
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
      json.dump(config, f, indent=2, ensure_ascii=False)
      f.write("\n")
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    cases = []
    for conv in CONVERSATIONS:
      for system in ([False, True] if name != "mistral" else [False]):
        messages = ([SYSTEM] if system else []) + conv
        cases.append(dict(
            messages=messages,
            text=tok.apply_chat_template(messages, tokenize=False),
            ids=ids_of(tok.apply_chat_template(messages, tokenize=True)),
            generation_prompt=tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True),
            sft=sft_segments(tok, messages),
        ))
    golden[name] = cases
  with open(os.path.join(HERE, "chat", "golden.json"), "w", encoding="utf-8") as f:
    json.dump(dict(made_by="tools/data/chat_golden.py (transformers 5.24.0, jinja2 3.1.6)", cases=golden), f, indent=1, ensure_ascii=False)
    f.write("\n")


if __name__ == "__main__":
  main()
