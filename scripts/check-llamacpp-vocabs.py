#!/usr/bin/env python3
"""Tokenizes llama.cpp's tokenizer test cases (models/ggml-vocab-*.gguf with their .inp/.out files,
from the llama.cpp tree vendored in llama-cpp-python's source package) with `tessera tokenizer
encode` and compares the ids with the ones llama.cpp recorded (its test-tokenizer-0: no BOS, special
tokens not parsed). Prints one line per vocabulary: every case the same, the first difference, or
the one line Tessera refused the file with.
usage: check-llamacpp-vocabs.py [MODELS_DIR] [--tessera build/tessera]
  MODELS_DIR default: /tmp/tessera-llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models
  (scripts/build-llamacpp.sh unpacks it there).
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

SEP = "\n__ggml_vocab_test__\n"


def cases(inp_path, out_path):
    with open(inp_path, encoding="utf-8") as f:
        texts = f.read().split(SEP)[:-1]
    with open(out_path, encoding="utf-8") as f:
        ids = [[int(x) for x in line.split()] for line in f.read().split("\n")[: len(texts)]]
    return list(zip(texts, ids))


def encode(tessera, gguf, text, tmp):
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    r = subprocess.run([tessera, "tokenizer", "encode", "-m", gguf, "--in", tmp],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
    out = r.stdout.strip()
    return ([int(x) for x in out.split(",")] if out else []), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="?",
                    default="/tmp/tessera-llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models")
    ap.add_argument("--tessera", default="build/tessera")
    a = ap.parse_args()
    tmp = os.path.join(tempfile.mkdtemp(), "case.txt")
    passed = 0
    files = sorted(glob.glob(os.path.join(a.models, "ggml-vocab-*.gguf")))
    for gguf in files:
        name = os.path.basename(gguf)[len("ggml-vocab-"):-len(".gguf")]
        if not os.path.exists(gguf + ".inp"):
            continue
        cs = cases(gguf + ".inp", gguf + ".out")
        verdict = "same   %-18s all %d cases" % (name, len(cs))
        for text, want in cs:
            got, err = encode(a.tessera, gguf, text, tmp)
            if err is not None:
                verdict = "REFUSE %-18s %s" % (name, err)
                break
            if got != want:
                verdict = "DIFFER %-18s %r: tessera %s, llama.cpp %s" % (name, text[:40], got[:12],
                                                                        want[:12])
                break
        else:
            passed += 1
        print(verdict, flush=True)
    print("%d of %d vocabularies give llama.cpp's ids on every case" % (passed, len(
        [f for f in files if os.path.exists(f + ".inp")])))


if __name__ == "__main__":
    sys.exit(main())
