"""Synthetic tokenizer and text dataset for engine runs that download nothing (issue 23).

torchtitan's trainer needs a tokenizer folder (``model.hf_assets_path``: a Hugging Face
``tokenizer.json`` + ``tokenizer_config.json``, read by torchtitan/components/tokenizer.py
``HuggingFaceTokenizer``) and a text dataset (``training.dataset``; the registered ``c4_test`` entry of
torchtitan/hf_datasets/text_datasets.py ``DATASETS`` calls ``datasets.load_dataset(path,
split="train")``, so ``training.dataset_path`` may name any local folder of JSON-lines files with a
``text`` field, the format of torchtitan's tests/assets/c4_test/data.json). This script writes both,
deterministically (seeded), from pseudo-words made of syllables: no file is downloaded, nothing
outside this script is read.

    python -m autotune.runners.assets OUT_DIR [--docs 2000] [--vocab 8192]

(:class:`autotune.engines.torchtitan.runner.TorchtitanEvaluator` calls :func:`write_assets` once per
evaluator, into its temporary folder; ``bench/engine_smoke/make_assets.py`` is the same command)

writes ``OUT_DIR/tokenizer/{tokenizer.json,tokenizer_config.json}`` (byte-level BPE trained with the
``tokenizers`` library; special tokens ``<|begin_of_text|>`` and ``<|end_of_text|>``, the Llama 3
names, so torchtitan adds BOS/EOS to every document) and ``OUT_DIR/c4_local/data.json``. The model's
vocabulary (Llama 3: 128256) only has to be at least the tokenizer's (8192 + 2 here): ids past the
tokenizer's never occur, which changes neither the step's FLOPs nor its memory.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
_ONSETS = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "pl",
           "ch", "sh", "th", "gr", "br"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "rt", "st", "ng"]


def _words(rng: random.Random, n: int) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                        for _ in range(rng.choice((1, 1, 2, 2, 3)))))
    return sorted(out)


def documents(n_docs: int, seed: int = 0, words_per_doc: tuple[int, int] = (200, 600)) -> list[str]:
    """``n_docs`` pseudo-English documents (Zipf-like word frequencies, sentences, punctuation)."""
    rng = random.Random(seed)
    vocab = _words(rng, 5000)
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    docs = []
    for _ in range(n_docs):
        n = rng.randint(*words_per_doc)
        ws = rng.choices(vocab, weights, k=n)
        sents, i = [], 0
        while i < n:
            k = rng.randint(5, 20)
            s = " ".join(ws[i:i + k])
            sents.append(s[:1].upper() + s[1:] + rng.choice(".....?!"))
            i += k
        docs.append(" ".join(sents))
    return docs


def write_dataset(out: Path, docs: list[str]) -> Path:
    """``out/data.json``: one ``{"text": ...}`` object per line (c4_test's format)."""
    out.mkdir(parents=True, exist_ok=True)
    p = out / "data.json"
    with p.open("w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return p


def write_tokenizer(out: Path, docs: list[str], vocab_size: int) -> Path:
    """Train a byte-level BPE on ``docs``; write tokenizer.json and tokenizer_config.json into ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    special = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    cfg = {"added_tokens_decoder": {str(tok.token_to_id(t)): {"content": t, **special} for t in (BOS, EOS)},
           "bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False,
           "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def write_assets(out: Path, *, n_docs: int = 2000, vocab_size: int = 8192, seed: int = 0,
                 words_per_doc: tuple[int, int] = (200, 600)) -> tuple[Path, Path]:
    """Write ``out/tokenizer`` and ``out/c4_local``; returns (tokenizer folder, dataset folder).
    ``words_per_doc``: the range of each document's length in words (:func:`documents`).
    Needs the ``tokenizers`` package (a dependency of torchtitan's trainer)."""
    docs = documents(n_docs, seed, words_per_doc)
    write_dataset(out / "c4_local", docs)
    write_tokenizer(out / "tokenizer", docs, vocab_size)
    return out / "tokenizer", out / "c4_local"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    out = Path(a.out_dir)
    write_assets(out, n_docs=a.docs, vocab_size=a.vocab, seed=a.seed)
    print(f"wrote {out}/tokenizer and {out}/c4_local ({a.docs} documents)")


if __name__ == "__main__":
    main()
