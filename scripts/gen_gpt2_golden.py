#!/usr/bin/python3
"""Writes tests/data/gpt2/tiny_golden.safetensors: a tiny GPT-2 written by hand in PyTorch
(no transformers library), its logits, mean loss and every parameter gradient, in float64.

Run with Debian's python (apt-get install -y python3-torch python3-numpy):
    /usr/bin/python3 scripts/gen_gpt2_golden.py

File contents (all F32 except tokens/targets, which are I32):
  param.<name>  weights in Tessera's layout: HF tensor names, linear weights (out, in) (NOT HF's
                Conv1D (in, out)), wte.weight with the real V rows (no padding).
  grad.<name>   d(mean loss)/d(param), same names and shapes.
  tokens (B,T), targets (B,T) (one target is -1: ignored), logits (B,T,V), loss (1).
  __metadata__  n_layer, n_head, n_embd, vocab_size, max_seq, B, T.
Weights are drawn in float64, rounded to float32 (the values stored), and the reference runs in
float64 on those rounded values, so the only difference from Tessera's f32 run is its rounding.
"""
import json
import math
import os
import struct

import numpy as np
import torch

L, C, H, V, MAX_T, B, T = 2, 32, 4, 61, 16, 2, 9
SEED = 1234


def param_shapes():
    shapes = [("wte.weight", (V, C)), ("wpe.weight", (MAX_T, C))]
    for i in range(L):
        h = f"h.{i}."
        shapes += [
            (h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
            (h + "attn.c_attn.weight", (3 * C, C)), (h + "attn.c_attn.bias", (3 * C,)),
            (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
            (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
            (h + "mlp.c_fc.weight", (4 * C, C)), (h + "mlp.c_fc.bias", (4 * C,)),
            (h + "mlp.c_proj.weight", (C, 4 * C)), (h + "mlp.c_proj.bias", (C,)),
        ]
    shapes += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return shapes


def make_params(gen):
    # Larger than GPT-2's init (std 0.02) so every term, biases included, moves the outputs.
    params = {}
    for name, shape in param_shapes():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            x = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif len(shape) == 1:
            x = 0.05 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name in ("wte.weight", "wpe.weight"):
            x = 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            x = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[1])
        params[name] = x.float().double().requires_grad_(True)  # exactly f32-representable
    return params


def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance, as GPT-2
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(p, tokens):
    D = C // H
    x = p["wte.weight"][tokens] + p["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        h = f"h.{i}."
        a = layernorm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
        qkv = a @ p[h + "attn.c_attn.weight"].T + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)  # q, k, v per token, heads contiguous inside each
        q, k, v = (z.view(B, T, H, D).transpose(1, 2) for z in (q, k, v))  # (B,H,T,D)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~mask, float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"].T + p[h + "attn.c_proj.bias"]
        m = layernorm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        f = gelu_tanh(m @ p[h + "mlp.c_fc.weight"].T + p[h + "mlp.c_fc.bias"])
        x = x + f @ p[h + "mlp.c_proj.weight"].T + p[h + "mlp.c_proj.bias"]
    x = layernorm(x, p["ln_f.weight"], p["ln_f.bias"])
    return x @ p["wte.weight"].T  # tied lm head, (B,T,V)


def write_safetensors(path, tensors, metadata):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[arr.dtype]
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def main():
    gen = torch.Generator().manual_seed(SEED)
    params = make_params(gen)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    targets[1, 4] = -1  # ignored position
    logits = forward(params, tokens)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                                             ignore_index=-1)  # mean over non-ignored
    loss.backward()

    out = {"tokens": tokens.numpy().astype(np.int32), "targets": targets.numpy().astype(np.int32),
           "logits": logits.detach().numpy().astype(np.float32),
           "loss": np.array([loss.item()], dtype=np.float32)}
    for name, p in params.items():
        out["param." + name] = p.detach().numpy().astype(np.float32)
        out["grad." + name] = p.grad.numpy().astype(np.float32)
    meta = {"n_layer": str(L), "n_head": str(H), "n_embd": str(C), "vocab_size": str(V),
            "max_seq": str(MAX_T), "B": str(B), "T": str(T), "generator": "gen_gpt2_golden.py"}
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    path = os.path.normpath(os.path.join(root, "tests", "data", "gpt2", "tiny_golden.safetensors"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_safetensors(path, out, meta)
    print(f"wrote {path}: loss {loss.item():.6f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
