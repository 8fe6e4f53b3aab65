#!/usr/bin/env python3
"""Golden ids for the tokenizer test, from Hugging Face `tokenizers` (pip install tokenizers).

Trains nothing: it loads tests/data/tokenizer/tok512.json, which OUR code wrote with
  tessera tokenizer train --vocab 512 --in tests/data/tokenizer/train.txt \
      --out tests/data/tokenizer/tok512.json
encodes a fixed list of tricky strings with HF, checks HF decodes them back, and writes
  tests/data/tokenizer/golden.json      the strings and HF's ids (plus HF's version)
  tests/data/tokenizer/tok512_hf.json   the same tokenizer re-serialized by HF (newer format:
                                        merges as pairs), which our reader must load too.
"""
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")

CASES = [
    "",
    "Hello world",
    "The lighthouse keeper wrote in his log every evening.",
    "  leading spaces",
    "trailing spaces   ",
    "   ",
    " ",
    "a  b   c    d",
    "tabs\tand\t\ttabs",
    "\t\tindented\n",
    "line one\nline two\n\nline four\r\nCRLF\r\n",
    "\n\n\n",
    " \n \n x",
    "mixed \t\n whitespace \u00a0 nbsp\u3000ideographic\u2028sep\u0085nel\u000bvt\u000cff",
    "numbers 1 12 123 1234 12345 3.14159 -42 1e10 0x1F",
    "dates 1887-04-12 and 07:15",
    "superscripts x\u00b2 and fractions \u00bd \u2153, roman \u2167, "
    "arabic-indic \u0661\u0662\u0663",
    "it's I'm we've they'll she'd you're don't",
    "IT'S I'M WE'VE THEY'LL (uppercase contractions are not special)",
    "'s 't 're 've 'm 'll 'd ''s '''",
    "quotes \"double\" and 'single' and `back`",
    "punctuation!!! ??? ... --- *** ### @@@ $$$ %%%",
    "emoji \U0001f30a\U0001f6a2 \U0001f600\U0001f600 "
    "family \U0001f468\u200d\U0001f469\u200d\U0001f467 flag \U0001f1ef\U0001f1f5",
    "\u2603 snowman \u263a smiley",
    "CJK \u706f\u53f0\u306f\u3068\u3066\u3082\u7f8e\u3057\u3044\u3067\u3059\u3002 "
    "\u4e2d\u6587\u6d4b\u8bd5 \ud55c\uad6d\uc5b4",
    "Cyrillic \u0434\u044f\u043a\u0443\u044e \u0437\u0430 \u0447\u0430\u0439, "
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440!",
    "Arabic \u0634\u0643\u0631\u0627 \u062c\u0632\u064a\u0644\u0627 \u0661\u0662\u0663",
    "Devanagari \u0927\u0928\u094d\u092f\u0935\u093e\u0926 \u0928\u092e\u0938\u094d\u0924\u0947",
    "Greek \u03b1\u03b2\u03b3 \u0394\u03b4 and Hebrew \u05e9\u05dc\u05d5\u05dd",
    "combining e\u0301 vs \u00e9, caf\u00e9 na\u00efve fa\u00e7ade jalape\u00f1o \u2014 dash",
    "code: for (int i = 0; i < n; ++i) { sum += x[i] * y[i]; }  // dot",
    "    def count_ships(log):\n        total = 0\n        return total\n",
    "snake_case CamelCase kConstant member_ a_b__c",
    "url https://example.com/path?q=1&r=2#frag",
    "email someone@example.org",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "a <|endoftext|> b<|endoftext|><|endoftext|>c",
    "<|endoftext|> leading special",
    "partial <|endoftext| and <|endof",
    "control \u0001\u0002\u001f and del \u007f",
    "zero width \u200b\u200c\u200d joiners",
    "private use \ue000 and noncharacter \ufdd0 and max \U0010fffd",
    "mixed123abc456 abc 123abc abc123",
    "a" * 300,
    " the" * 40,
]


def main():
    tok_path = os.path.join(DATA, "tok512.json")
    tok = Tokenizer.from_file(tok_path)  # raises if HF cannot load what we wrote
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    cases = []
    for text in CASES:
        ids = tok.encode(text).ids
        back = tok.decode(ids, skip_special_tokens=False)
        if back != text:
            sys.exit(f"HF does not round-trip {text!r}: got {back!r}")
        # HF's pre-token pieces, in the byte-level alphabet (specials are not split out here).
        pieces = [p for p, _ in pre.pre_tokenize_str(text)]
        cases.append({"text": text, "ids": ids, "pieces": pieces})
    golden = {
        "generator": "scripts/gen_tokenizer_golden.py",
        "tokenizer": "tok512.json",
        "hf_tokenizers_version": tokenizers.__version__,
        "hf_loaded_our_json": True,
        "hf_vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "cases": cases,
    }
    # One case per line keeps the file readable and its diffs small.
    head = json.dumps({k: v for k, v in golden.items() if k != "cases"}, ensure_ascii=False)
    lines = [json.dumps(c, ensure_ascii=False) for c in cases]
    with open(os.path.join(DATA, "golden.json"), "w", encoding="utf-8") as f:
        f.write(head[:-1] + ',\n "cases": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n")
    with open(os.path.join(DATA, "tok512_hf.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str(pretty=True))
        f.write("\n")
    print(f"wrote {len(cases)} cases with tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
