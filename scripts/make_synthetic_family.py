#!/usr/bin/env python3
"""Writes a small random-weight GGUF of a model family, with a real tokenizer, for comparisons.

The tokenizer (every tokenizer.* key) is copied from a GGUF that has one (default: the SmolLM2
file of scripts/install-deps.sh), so both engines tokenize prompts the same way; the weights are
random f32 (or f16), scaled so that the next-token distribution is peaked enough for greedy
decoding to be stable against rounding. Families: llama, qwen3 (per-head q/k norms, head_dim
apart from width / heads), gemma3 (q/k norms, post-norms, GeGLU, scaled embeddings, five local
layers of --window positions to each global one), smollm3 (llama with every fourth layer
without RoPE), phi3 (q, k, v fused in attn_qkv, gate and up in ffn_up), and the mixtures of experts (--experts of
width --ffn, --experts-used per token): mixtral (llama with experts), qwen3moe (per-head q/k
norms, renormalized expert weights), olmoe (whole-vector q/k norms, weights as the router gives
them). Needs numpy and the `gguf` package (pip).
usage: make_synthetic_family.py OUT.gguf --arch qwen3 [--layers 4] [--width 256] [--ffn 512]
       [--heads 4] [--kv-heads 2] [--head-dim 64] [--window 16] [--experts 8]
       [--experts-used 2] [--tokenizer FILE.gguf] [--f16] [--seed 0]
"""
import argparse

import gguf
import numpy as np


def copy_tokenizer(src_path, w):
    """Every tokenizer.* field of src_path into writer w; returns the vocabulary size."""
    r = gguf.GGUFReader(src_path)
    n_vocab = 0
    for name, field in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape")
                        for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(name, vals)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        elif vtype == gguf.GGUFValueType.BOOL:
            w.add_bool(name, bool(field.parts[field.data[0]][0]))
        else:
            w.add_uint32(name, int(field.parts[field.data[0]][0]))
    return n_vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", choices=["llama", "qwen3", "gemma3", "smollm3", "phi3", "mixtral",
                                         "qwen3moe", "olmoe"],
                    default="qwen3")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=0, help="0: width / heads")
    ap.add_argument("--window", type=int, default=16, help="gemma3: local layers' window")
    ap.add_argument("--longrope", action="store_true",
                    help="phi3: LongRoPE factors (pretrained length 4096 of 131072)")
    ap.add_argument("--yarn", type=float, default=0,
                    help="YaRN scaling of this factor over a pretrained length of 64 (0: none)")
    ap.add_argument("--experts", type=int, default=8, help="MoE families: experts per layer")
    ap.add_argument("--experts-used", type=int, default=2, help="MoE families: per token")
    ap.add_argument("--tokenizer", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--f16", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    C, F, H, Hkv = a.width, a.ffn, a.heads, a.kv_heads
    D = a.head_dim or C // H
    rng = np.random.default_rng(a.seed)
    dt = np.float16 if a.f16 else np.float32

    moe = a.arch in ("mixtral", "qwen3moe", "olmoe")
    E = a.experts
    # Mixtral files are llama files with experts.
    w = gguf.GGUFWriter(a.out, "llama" if a.arch == "mixtral" else a.arch)
    V = copy_tokenizer(a.tokenizer, w)
    w.add_name("synthetic-%s-%dL-%d" % (a.arch, a.layers, C))
    w.add_block_count(a.layers)
    w.add_context_length(131072 if a.longrope else 4096)
    w.add_embedding_length(C)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0 if a.arch in ("llama", "mixtral", "olmoe") else 1000000.0)
    if moe:
        w.add_expert_count(E)
        w.add_expert_used_count(a.experts_used)
        if a.arch == "qwen3moe":
            w.add_expert_feed_forward_length(F)
    if a.arch == "gemma3":
        w.add_sliding_window(a.window)
    w.add_rope_dimension_count(D)
    if a.longrope:  # as llama.cpp's converter writes Phi-3.5's
        w.add_uint32(a.arch + ".rope.scaling.original_context_length", 4096)
        w.add_float32(a.arch + ".rope.scaling.attn_factor",
                      float(np.sqrt(1 + np.log(32) / np.log(4096))))
    if a.yarn:  # as llama.cpp's converter writes Qwen's long-context YaRN
        w.add_string(a.arch + ".rope.scaling.type", "yarn")
        w.add_float32(a.arch + ".rope.scaling.factor", a.yarn)
        w.add_uint32(a.arch + ".rope.scaling.original_context_length", 64)
    w.add_vocab_size(V)

    def mat(rows, cols, scale):
        # 1/sqrt(cols) keeps activations O(1); `scale` above 1 sharpens the distributions.
        x = rng.standard_normal((rows, cols), dtype=np.float32) * (scale / np.sqrt(cols))
        return x.astype(dt)

    def norm(n, spread=0.1):
        return (1.0 + spread * rng.standard_normal(n)).astype(np.float32)

    gemma = a.arch == "gemma3"
    # Gemma scales looked-up rows by sqrt(C): rows of std 1 / sqrt(C) enter the stream at std 1.
    w.add_tensor("token_embd.weight", mat(V, C, 1.0 if gemma else 4.0 * np.sqrt(C) / 8))
    for i in range(a.layers):
        p = "blk.%d." % i
        w.add_tensor(p + "attn_norm.weight", norm(C))
        if a.arch == "phi3":
            w.add_tensor(p + "attn_qkv.weight", mat((H + 2 * Hkv) * D, C, 1.0))
        else:
            w.add_tensor(p + "attn_q.weight", mat(H * D, C, 1.0))
            w.add_tensor(p + "attn_k.weight", mat(Hkv * D, C, 1.0))
            w.add_tensor(p + "attn_v.weight", mat(Hkv * D, C, 1.0))
        if a.arch in ("qwen3", "gemma3", "qwen3moe"):
            w.add_tensor(p + "attn_q_norm.weight", norm(D, 0.3))
            w.add_tensor(p + "attn_k_norm.weight", norm(D, 0.3))
        if a.arch == "olmoe":  # one norm over all of q, one over all of k
            w.add_tensor(p + "attn_q_norm.weight", norm(H * D, 0.3))
            w.add_tensor(p + "attn_k_norm.weight", norm(Hkv * D, 0.3))
        w.add_tensor(p + "attn_output.weight", mat(C, H * D, 1.0))
        if gemma:
            w.add_tensor(p + "post_attention_norm.weight", norm(C))
            w.add_tensor(p + "post_ffw_norm.weight", norm(C))
        w.add_tensor(p + "ffn_norm.weight", norm(C))
        if moe:
            # The router in f32 (llama.cpp keeps it so); experts stacked (E, rows, cols). A
            # router scale of 2 spreads the tokens' choices without near-ties.
            w.add_tensor(p + "ffn_gate_inp.weight", mat(E, C, 2.0).astype(np.float32))
            w.add_tensor(p + "ffn_gate_exps.weight",
                         np.stack([mat(F, C, 1.0) for _ in range(E)]))
            w.add_tensor(p + "ffn_up_exps.weight", np.stack([mat(F, C, 1.0) for _ in range(E)]))
            w.add_tensor(p + "ffn_down_exps.weight",
                         np.stack([mat(C, F, 1.0) for _ in range(E)]))
            continue
        if a.arch == "phi3":  # the gate's rows, then the up rows
            w.add_tensor(p + "ffn_up.weight", mat(2 * F, C, 1.0))
        else:
            w.add_tensor(p + "ffn_gate.weight", mat(F, C, 1.0))
            w.add_tensor(p + "ffn_up.weight", mat(F, C, 1.0))
        w.add_tensor(p + "ffn_down.weight", mat(C, F, 1.0))
    if a.longrope:  # short factors near 1, long ones growing with the pair's wavelength
        w.add_tensor("rope_factors_short.weight",
                     (1 + 0.1 * rng.random(D // 2)).astype(np.float32))
        w.add_tensor("rope_factors_long.weight",
                     np.linspace(1, 40, D // 2).astype(np.float32))
    w.add_tensor("output_norm.weight", norm(C))
    w.add_tensor("output.weight", mat(V, C, 8.0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote %s: %s, %d layers, width %d, heads %d/%d of %d, vocab %d" %
          (a.out, a.arch, a.layers, C, H, Hkv, D, V))


if __name__ == "__main__":
    main()
