#!/usr/bin/env python3
"""A reference BERT uncased tokenizer for the WordPiece test, written from BERT's published
algorithm (Devlin et al. 2019, google-research/bert tokenization.py: BasicTokenizer with
do_lower_case=True, then WordpieceTokenizer), on Python's own unicodedata and str.lower().

usage: wordpiece_reference.py VOCAB_TXT < texts.json > results.json
texts.json: a JSON list of strings; results.json: a list of {"basic": [words], "word_ids": [[ids] per word], "ids": [ids],
"decoded": text} (decoded: the pieces joined by spaces with " ##" removed).
"""
import json
import sys
import unicodedata


def load_vocab(path):
    vocab = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            vocab[line.rstrip("\n")] = i
    return vocab


def is_whitespace(ch):
    if ch in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(ch) == "Zs"


def is_control(ch):
    if ch in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def is_punctuation(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_chinese_char(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def clean_text(text):
    out = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or is_control(ch):
            continue
        out.append(" " if is_whitespace(ch) else ch)
    return "".join(out)


def tokenize_chinese_chars(text):
    out = []
    for ch in text:
        if is_chinese_char(ord(ch)):
            out.extend([" ", ch, " "])
        else:
            out.append(ch)
    return "".join(out)


def strip_accents(text):
    return "".join(ch for ch in unicodedata.normalize("NFD", text) if unicodedata.category(ch) != "Mn")


def split_on_punc(text):
    words, start_new = [], True
    for ch in text:
        if is_punctuation(ch):
            words.append([ch])
            start_new = True
        else:
            if start_new:
                words.append([])
            start_new = False
            words[-1].append(ch)
    return ["".join(w) for w in words]


def basic_tokenize(text):
    text = tokenize_chinese_chars(clean_text(text))
    split = []
    for token in text.strip().split():
        split.extend(split_on_punc(strip_accents(token.lower())))
    return " ".join(split).strip().split()


def wordpiece(word, vocab, unk="[UNK]", max_chars=100):
    chars = list(word)
    if len(chars) > max_chars:
        return [unk]
    pieces, start = [], 0
    while start < len(chars):
        end, found = len(chars), None
        while start < end:
            sub = "".join(chars[start:end])
            if start > 0:
                sub = "##" + sub
            if sub in vocab:
                found = sub
                break
            end -= 1
        if found is None:
            return [unk]
        pieces.append(found)
        start = end
    return pieces


def main():
    vocab = load_vocab(sys.argv[1])
    results = []
    for text in json.load(sys.stdin):
        basic = basic_tokenize(text)
        words = [wordpiece(w, vocab) for w in basic]
        pieces = [p for w in words for p in w]
        results.append({"basic": basic, "word_ids": [[vocab[p] for p in w] for w in words],
                        "ids": [vocab[p] for p in pieces], "decoded": " ".join(pieces).replace(" ##", "").strip()})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
