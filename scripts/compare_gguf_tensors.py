#!/usr/bin/env python3
"""Tensor by tensor, two GGUF files: same type and same bytes? (gguf-py, PyPI `gguf`).
    compare_gguf_tensors.py A.gguf B.gguf"""
import sys, gguf
a, b = gguf.GGUFReader(sys.argv[1]), gguf.GGUFReader(sys.argv[2])
ta = {t.name: t for t in a.tensors}; tb = {t.name: t for t in b.tensors}
same = diff_type = diff_data = 0
for n, t in ta.items():
    u = tb.get(n)
    if u is None: print("missing in B:", n); continue
    if t.tensor_type != u.tensor_type: diff_type += 1; print("type", n, t.tensor_type.name, u.tensor_type.name); continue
    if bytes(t.data.tobytes()) != bytes(u.data.tobytes()): diff_data += 1; print("data", n, t.tensor_type.name)
    else: same += 1
print(f"{len(ta)} tensors in A, {len(tb)} in B: {same} identical, {diff_type} differ in type, {diff_data} differ in data")
