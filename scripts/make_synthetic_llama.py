#!/usr/bin/env python3
"""Writes a synthetic Llama GGUF with random f16 weights for benchmarks (not committed: 2.2 GB).

Default shape: the 1.1B of docs/PERFORMANCE.md (22 layers, width 2048, MLP 5632, 32 heads,
4 KV heads, vocabulary 32000). Needs numpy and the `gguf` package (pip); quantize the result
with `tessera quantize OUT.gguf OUT-q8_0.gguf --type q8_0`.
Usage: make_synthetic_llama.py OUT.gguf [--layers 22] [--width 2048] [--ffn 5632]
"""
import argparse

import gguf
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    C, F, H, Hkv, V = a.width, a.ffn, a.heads, a.kv_heads, a.vocab
    D = C // H
    rng = np.random.default_rng(0)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("synthetic-llama-%dL-%d" % (a.layers, C))
    w.add_block_count(a.layers)
    w.add_context_length(2048)
    w.add_embedding_length(C)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    # A placeholder SentencePiece vocabulary (unk, bos, eos, the 256 byte tokens, then "tok<i>")
    # so other engines (llama.cpp's llama-bench) load the file too; benchmarks feed token ids.
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    tokens += ["tok%d" % i for i in range(V - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(V - 259)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (V - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", mat(V, C))
    for i in range(a.layers):
        p = "blk.%d." % i
        w.add_tensor(p + "attn_norm.weight", np.ones(C, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(C, np.float32))
        w.add_tensor(p + "attn_q.weight", mat(C, C))
        w.add_tensor(p + "attn_k.weight", mat(Hkv * D, C))
        w.add_tensor(p + "attn_v.weight", mat(Hkv * D, C))
        w.add_tensor(p + "attn_output.weight", mat(C, C))
        w.add_tensor(p + "ffn_gate.weight", mat(F, C))
        w.add_tensor(p + "ffn_up.weight", mat(F, C))
        w.add_tensor(p + "ffn_down.weight", mat(C, F))
    w.add_tensor("output_norm.weight", np.ones(C, np.float32))
    w.add_tensor("output.weight", mat(V, C))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
