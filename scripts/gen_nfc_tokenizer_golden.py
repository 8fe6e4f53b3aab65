#!/usr/bin/env python3
"""Goldens for NFC normalization and for added tokens with lstrip / rstrip, from Python's
`unicodedata` and Hugging Face `tokenizers` (pip install tokenizers).

Writes into tests/data/tokenizer/:
  nfc_golden.json       tricky strings (as hex bytes, some not valid UTF-8) and their NFC from
                        unicodedata.normalize; invalid bytes go through surrogateescape, so they
                        come out unchanged and block composition, as our normalizer treats them;
                        and every code point that NFC changes when alone, with its NFC
  qwen2_nfc.json        a small Qwen2-style byte-level BPE (NFC normalizer, Qwen2 Split regex,
                        ByteLevel) trained here, with ChatML specials and a normalized added token
  added_strip.json      tok512.json plus added tokens with lstrip / rstrip (special and not,
                        normalized and not)
  nfc_strip_golden.json per tokenizer: the strings, HF's ids and HF's decode of those ids

Usage: scripts/gen_nfc_tokenizer_golden.py
"""
import json
import os
import sys
import unicodedata

import tokenizers
from tokenizers import AddedToken, Tokenizer, normalizers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")
sys.path.insert(0, HERE)
from gen_real_tokenizer_golden import (  # noqa: E402
    QWEN2_PATTERN, dump_cases, split_byte_level_bpe, training_text, write_json)

# (label, text): text is str, or bytes for input that is not valid UTF-8.
NFC_CASES = [
    ("empty", ""),
    ("ascii", "Hello, world! 123 <|im_end|>\n\t"),
    ("already NFC latin", "caf\u00e9 na\u00efve fa\u00e7ade jalape\u00f1o \u00c5ngstr\u00f6m"),
    ("already NFC CJK", "\u706f\u53f0\u306f\u7f8e\u3057\u3044 \u4e2d\u6587"),
    ("decomposed acute", "cafe\u0301"),
    ("decomposed many", "A\u030a e\u0301 i\u0308 n\u0303 c\u0327 o\u0302 u\u0300"),
    ("vietnamese reorder", "e\u0302\u0323 vs e\u0323\u0302 vs \u1ec7"),
    ("dot above then below", "\u1e0b\u0323 d\u0307\u0323 d\u0323\u0307"),
    ("no composite", "q\u0307\u0323 q\u0323\u0307"),
    ("blocked same class", "a\u0305\u0301 a\u0301\u0305"),
    ("greek stacked", "\u03b1\u0313\u0301\u0345 \u03b1\u0345\u0301\u0313"),
    ("hebrew points", "\u05e9\u05b8\u05b7 \u05e9\u05c1\u05bc"),
    ("zalgo", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e"
              "\u0349\u035a\u032f\u031e\u0320\u034da\u0301\u0301\u0301"),
    ("leading marks", "\u0301\u0323abc"),
    ("only marks", "\u0301\u0300\u0323"),
    ("hangul LV", "\u1100\u1161"),
    ("hangul LVT", "\u1100\u1161\u11a8 \u110b\u1173\u11af"),
    ("hangul LV+T", "\uac00\u11a8"),
    ("hangul LVT+T", "\uac01\u11a8"),
    ("hangul lone jamo", "\u1161 \u11a8 \u1100 \u1100\u1100\u1161\u1161"),
    ("hangul NFD word", unicodedata.normalize("NFD", "\ud55c\uad6d\uc5b4 \ub9d0")),
    ("hangul NFC word", "\ud55c\uad6d\uc5b4 \ub9d0"),
    ("exclusion devanagari", "\u0958 \u0915\u093c"),
    ("exclusion hebrew", "\ufb1d \u05d9\u05b4 \ufb2a"),
    ("exclusion tibetan", "\u0f43 \u0f42\u0fb7"),
    ("exclusion post-version", "\u2adc \u2add\u0338"),
    ("singletons", "\u212b \u2126 \u212a \u0340 \u0341 \u0374 \u037e \u0387 \u1f71 \u2000"),
    ("non-starter decompositions", "\u0344 \u0f73 \u0f75 \u0f81"),
    ("starter second", "\u0b47\u0b3e \u0b47\u0301\u0b3e \u0dd9\u0dcf\u0dca \u1025\u102e"),
    ("emoji", "\U0001f30a\U0001f6a2 \U0001f468\u200d\U0001f469\u200d\U0001f467 "
              "\U0001f44d\U0001f3fd \U0001f1ef\U0001f1f5 \u263a\ufe0f"),
    ("mark after emoji", "\U0001f600\u0301 \u2603\u0308"),
    ("compatibility untouched", "\ufb01 \u2460 \uff21 x\u00b2 \u2167 \u00bd"),
    ("mixed sentence", "Cafe\u0301 in Ko\u0308ln, \u1100\u1161 and \u212b, then plain text."),
    ("invalid lone bytes", b"ab\xff\xfecd"),
    ("invalid truncated", b"caf\xc3"),
    ("invalid before mark", b"e\xff\xcc\x81"),
    ("mark after invalid", b"\xcc\x81\xc3(\xcc\x81"),
    ("encoded surrogate", b"a\xed\xa0\x80\xcc\x81e\xcc\x81"),
    ("overlong", b"\xc0\xaf e\xcc\x81 \xe0\x80\xaf"),
    ("invalid inside marks", b"a\xcc\xa3\x80\xcc\x81"),
]

# Strings for the Qwen2-style tokenizer: valid UTF-8 (HF takes str) with NFC-sensitive text,
# some of it next to special tokens, which split it before normalization.
QWEN2_CASES = [t for _, t in NFC_CASES if isinstance(t, str)] + [
    "<|im_start|>user\ncafe\u0301 et the\u0301<|im_end|>\n<|im_start|>assistant\n",
    "e<|im_end|>\u0301 (the mark stays apart from e)",
    "\u1100<|endoftext|>\u1161",
    "the word caf\u00e9 is a normalized added token; so is cafe\u0301 and CAF\u00c9",
    "numbers 1234 and 12 apples, \u212bngstr\u00f6m 5\u212b",
    "  leading spaces\n\nand\ttabs\u00a0nbsp \u3000 ideographic",
    "it's I'M we\u0301'LL",
]

# Strings with whitespace of every kind around the lstrip / rstrip tokens.
STRIP_CASES = [
    "<mask>",
    "a <mask> b",
    "a   <mask>   b",
    "a\n\n<mask>\n\nb",
    "a \t\n <mask>",
    "  <mask>",
    "<mask>  ",
    "x\u00a0\u3000<mask>\u2003y",
    "<|im_end|>",
    "a <|im_end|> b",
    "a <|im_end|>\n\n  b",
    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "a  [BOTH]  b",
    "[BOTH][BOTH]",
    "[BOTH]   [BOTH]",
    "<|im_end|>   <mask> x",
    "<mask> <mask>  <mask>",
    "a <sep> b  <sep>  c",
    "<sep>   <mask>",
    "a <norm> b  <norm>  c",
    "a  <norm><mask> b",
    "   ",
    "\n<|im_end|>\n",
    "text <|endoftext|> more  <|endoftext|>  end",
    "caf\u00e9 <mask> na\u00efve \U0001f600 <|im_end|> \u706f\u53f0",
    "a<mask>b<|im_end|>c[BOTH]d<sep>e",
]


def to_str(t):
    return t if isinstance(t, str) else t.decode("utf-8", "surrogateescape")


def to_bytes(s):
    return s.encode("utf-8", "surrogateescape")


def nfc_golden():
    cases = []
    for label, text in NFC_CASES:
        s = to_str(text)
        out = unicodedata.normalize("NFC", s)
        cases.append({"label": label, "in": to_bytes(s).hex(), "nfc": to_bytes(out).hex()})
    # Every code point that NFC changes on its own (all others must map to themselves).
    singles = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out = unicodedata.normalize("NFC", chr(cp))
        if out != chr(cp):
            singles.append([cp, out.encode("utf-8").hex()])
    return {"generator": "scripts/gen_nfc_tokenizer_golden.py",
            "unicode_version": unicodedata.unidata_version, "cases": cases, "singles": singles}


def qwen2_nfc():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    corpus = training_text([unicodedata.normalize("NFC", t) for t in QWEN2_CASES])
    tok = split_byte_level_bpe(QWEN2_PATTERN, specials, 600, corpus, normalizers.NFC())
    # A normalized (non-special) added token written decomposed: HF matches its NFC in the
    # normalized text.
    tok.add_tokens([AddedToken("cafe\u0301", normalized=True, special=False)])
    path = os.path.join(DATA, "qwen2_nfc.json")
    tok.save(path, pretty=False)
    return dump_cases("qwen2_nfc.json", Tokenizer.from_file(path), QWEN2_CASES)


def added_strip():
    tok = Tokenizer.from_file(os.path.join(DATA, "tok512.json"))
    tok.add_special_tokens([
        AddedToken("<mask>", lstrip=True, special=True, normalized=False),
        AddedToken("<|im_end|>", rstrip=True, special=True, normalized=False),
        AddedToken("<|im_start|>", special=True, normalized=False),
        AddedToken("[BOTH]", lstrip=True, rstrip=True, special=True, normalized=False),
    ])
    tok.add_tokens([
        AddedToken("<sep>", lstrip=True, rstrip=True, special=False, normalized=False),
        AddedToken("<norm>", lstrip=True, special=False, normalized=True),
    ])
    path = os.path.join(DATA, "added_strip.json")
    tok.save(path, pretty=False)
    return dump_cases("added_strip.json", Tokenizer.from_file(path), STRIP_CASES)


def write_lines(name, obj):
    """JSON with each item of a list member on a line of its own (small files, small diffs)."""
    parts = []
    for k, v in obj.items():
        if isinstance(v, list):
            items = ",\n  ".join(json.dumps(x, ensure_ascii=False) for x in v)
            parts.append(f"{json.dumps(k)}: [\n  {items}\n ]")
        else:
            parts.append(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}")
    with open(os.path.join(DATA, name), "w", encoding="utf-8") as f:
        f.write("{\n " + ",\n ".join(parts) + "\n}\n")


def main():
    write_lines("nfc_golden.json", nfc_golden())
    write_json("nfc_strip_golden.json", {
        "generator": "scripts/gen_nfc_tokenizer_golden.py",
        "hf_tokenizers_version": tokenizers.__version__,
        "tokenizers": [qwen2_nfc(), added_strip()],
    })
    print(f"wrote {len(NFC_CASES)} NFC cases, {len(QWEN2_CASES)} + {len(STRIP_CASES)} tokenizer "
          f"cases with tokenizers {tokenizers.__version__}, Unicode {unicodedata.unidata_version}")


if __name__ == "__main__":
    main()
