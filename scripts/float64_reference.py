#!/usr/bin/env python3
"""Greedy decoding of a small GGUF in float64 numpy: an oracle for Tessera and llama.cpp on the
random-weight files of scripts/make_synthetic_family.py (the mixtures of experts mixtral,
qwen3moe and olmoe; dense qwen3 and llama, with YaRN scaling where the file has it). Every step
recomputes the whole sequence (no cache), so it is only for small models. Prints each step's
token, its margin over the runner-up and, for a mixture of experts, the smallest router margin
of the step's last position (between the k-th and the next expert's logits, over the layers): a
small margin is a near-tie that rounding may flip. Then the ids; `tessera tokenizer decode`
turns them into text.
usage: float64_reference.py FILE.gguf PROMPT_IDS(comma-separated) STEPS
"""
import sys

import gguf
import numpy as np


def main():
    path, prompt, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    r = gguf.GGUFReader(path)

    def kv(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.parts[f.data[0]][0]

    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    W = {t.name: np.array(t.data, dtype=np.float64).reshape([int(d) for d in reversed(t.shape)])
         for t in r.tensors}
    L, H = int(kv(arch + ".block_count")), int(kv(arch + ".attention.head_count"))
    Hkv = int(kv(arch + ".attention.head_count_kv", H))
    K = int(kv(arch + ".expert_used_count", 0))  # 0: a dense MLP
    eps = float(kv(arch + ".attention.layer_norm_rms_epsilon"))
    theta = float(kv(arch + ".rope.freq_base", 10000.0))
    scaling = r.fields.get(arch + ".rope.scaling.type")
    yarn = scaling is not None and bytes(scaling.parts[scaling.data[0]]).decode() == "yarn"
    renorm = arch != "olmoe"  # llama (Mixtral) and qwen3moe renormalize the chosen weights
    D = W["blk.0.attn_q.weight"].shape[0] // H
    # llama files rotate pairs (2i, 2i+1); qwen3moe and olmoe rotate halves (i, i + D/2).
    interleaved = arch == "llama"
    head_norm = "blk.0.attn_q_norm.weight" in W and W["blk.0.attn_q_norm.weight"].shape[0] == D
    out_w = W.get("output.weight", W["token_embd.weight"])

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def inv_freqs():
        inv = theta ** (-np.arange(0, D, 2) / D)
        if not yarn:
            return inv, 1.0
        # YaRN: pairs by the turns they make over the pretrained length; those under beta_slow
        # turns are slowed by the factor, those over beta_fast kept, a linear ramp between.
        factor = float(kv(arch + ".rope.scaling.factor"))
        orig = float(kv(arch + ".rope.scaling.original_context_length"))
        # the pair indices where turns = 32 and = 1, rounded outwards as the paper's code does
        at = lambda t: D * np.log(orig / (t * 2 * np.pi)) / (2 * np.log(theta))
        lo, hi = max(np.floor(at(32.0)), 0.0), min(np.ceil(at(1.0)), D - 1.0)
        slowed = np.clip((np.arange(D // 2) - lo) / max(hi - lo, 1e-3), 0.0, 1.0)
        return inv * (1 - slowed) + inv / factor * slowed, 0.1 * np.log(factor) + 1.0

    def rope(x, n):  # x (n, heads, D)
        inv, mscale = inv_freqs()
        ang = np.arange(n)[:, None, None] * inv[None, None, :]
        c, s = np.cos(ang) * mscale, np.sin(ang) * mscale
        a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :D // 2], x[..., D // 2:])
        ra, rb = a * c - b * s, a * s + b * c
        if interleaved:
            y = np.empty_like(x)
            y[..., 0::2], y[..., 1::2] = ra, rb
            return y
        return np.concatenate([ra, rb], -1)

    def logits_of(toks):
        route_margin = np.inf
        x = W["token_embd.weight"][toks]
        n = len(toks)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for layer in range(L):
            p = "blk.%d." % layer
            xn = rms(x, W[p + "attn_norm.weight"])
            q, k, v = (xn @ W[p + "attn_%s.weight" % m].T for m in "qkv")
            if p + "attn_q_norm.weight" in W:
                if head_norm:  # per head (Qwen3-MoE)
                    q = rms(q.reshape(n, H, D), W[p + "attn_q_norm.weight"]).reshape(n, -1)
                    k = rms(k.reshape(n, Hkv, D), W[p + "attn_k_norm.weight"]).reshape(n, -1)
                else:  # the whole vector (OLMoE)
                    q, k = rms(q, W[p + "attn_q_norm.weight"]), rms(k, W[p + "attn_k_norm.weight"])
            q, k = rope(q.reshape(n, H, D), n), rope(k.reshape(n, Hkv, D), n)
            v = v.reshape(n, Hkv, D)
            att = np.empty((n, H, D))
            for h in range(H):
                g = h // (H // Hkv)
                s = q[:, h] @ k[:, g].T / np.sqrt(D) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                att[:, h] = (s / s.sum(-1, keepdims=True)) @ v[:, g]
            x = x + att.reshape(n, -1) @ W[p + "attn_output.weight"].T
            xn = rms(x, W[p + "ffn_norm.weight"])
            if K == 0:
                gate, up = xn @ W[p + "ffn_gate.weight"].T, xn @ W[p + "ffn_up.weight"].T
                x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "ffn_down.weight"].T
                continue
            router = xn @ W[p + "ffn_gate_inp.weight"].T
            prob = np.exp(router - router.max(-1, keepdims=True))
            prob /= prob.sum(-1, keepdims=True)
            last = np.sort(router[-1])[::-1]
            route_margin = min(route_margin, last[K - 1] - last[K])
            for t in range(n):
                chosen = np.argsort(-router[t], kind="stable")[:K]
                weights = prob[t, chosen] / (prob[t, chosen].sum() if renorm else 1.0)
                for e, w in zip(chosen, weights):
                    gate = W[p + "ffn_gate_exps.weight"][e] @ xn[t]
                    up = W[p + "ffn_up_exps.weight"][e] @ xn[t]
                    x[t] += w * (W[p + "ffn_down_exps.weight"][e] @ (gate / (1 + np.exp(-gate)) * up))
        return rms(x[-1], W["output_norm.weight"]) @ out_w.T, route_margin

    toks = [int(t) for t in prompt.split(",")]
    for step in range(steps):
        lg, route_margin = logits_of(toks)
        best, second = np.argsort(-lg)[:2]
        print("step %d: token %d, margin %.4f, router margin %.2e" %
              (step, best, lg[best] - lg[second], route_margin), flush=True)
        toks.append(int(best))
    print(",".join(str(t) for t in toks))


if __name__ == "__main__":
    main()
