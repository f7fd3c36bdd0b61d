"""Writes tests/data/tokenizer_golden.json: the ids the reference libraries give for each text of
tests/data/tokenizer_corpus.jsonl, and (with --train) the small test tokenizers in tests/data.

Run once by hand in a virtualenv (pip install sentencepiece==0.2.3 tokenizers==0.23.3 protobuf and the
mistral-common==1.13.1 wheel for its tokenizer.model.v1); the test pins the output.
  python tools/data/golden_ids.py --mistral PATH/tokenizer.model.v1 --plays DIR_OF_.md [--train]
"""
import argparse
import glob
import json
import os

import sentencepiece as spm
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")


def paragraphs(paths):
  for path in paths:
    block = []
    for line in open(path, encoding="utf-8").read().split("\n"):
      if line.strip():
        block.append(line.rstrip("\r"))
      elif block:
        yield "\n".join(block)
        block = []
    if block:
      yield "\n".join(block)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--mistral", required=True)
  ap.add_argument("--plays", required=True)
  ap.add_argument("--train", action="store_true")
  args = ap.parse_args()
  plays = sorted(glob.glob(os.path.join(args.plays, "comedies", "*.md")))
  if args.train:
    sentences = list(paragraphs(plays))
    common = dict(sentence_iterator=iter(sentences), vocab_size=512, character_coverage=1.0,
                  byte_fallback=True, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
                  max_sentence_length=100000, num_threads=1, seed_sentencepiece_size=100000)
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(HERE, "shakespeare-bpe512"),
                                   model_type="bpe", normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
                                   split_digits=True, **common)
    common["sentence_iterator"] = iter(sentences)
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(HERE, "shakespeare-unigram512"),
                                   model_type="unigram", normalization_rule_name="nmt_nfkc", **common)
    for f in glob.glob(os.path.join(HERE, "*.vocab")):
      os.remove(f)
    tok = tokenizers.Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(paragraphs(plays), trainer=trainer)
    os.makedirs(os.path.join(HERE, "shakespeare-bytelevel512"), exist_ok=True)
    tok.save(os.path.join(HERE, "shakespeare-bytelevel512", "tokenizer.json"))

  texts = [json.loads(l)["text"] for l in open(os.path.join(HERE, "tokenizer_corpus.jsonl"), encoding="utf-8")]
  out = {"source": f"sentencepiece {spm.__version__} EncodeAsIds / tokenizers {tokenizers.__version__} "
                   "encode(add_special_tokens=False), by tools/data/golden_ids.py", "texts": len(texts)}
  for name, path in [("mistral-v1", args.mistral),
                     ("shakespeare-bpe512", os.path.join(HERE, "shakespeare-bpe512.model")),
                     ("shakespeare-unigram512", os.path.join(HERE, "shakespeare-unigram512.model"))]:
    sp = spm.SentencePieceProcessor(model_file=path)
    out[name] = [sp.EncodeAsIds(t) for t in texts]
  hf = tokenizers.Tokenizer.from_file(os.path.join(HERE, "shakespeare-bytelevel512", "tokenizer.json"))
  out["shakespeare-bytelevel512"] = [hf.encode(t, add_special_tokens=False).ids for t in texts]
  with open(os.path.join(HERE, "tokenizer_golden.json"), "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")


if __name__ == "__main__":
  main()
