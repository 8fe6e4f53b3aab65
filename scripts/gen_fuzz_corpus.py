#!/usr/bin/env python3
# Writes the small seed files the fuzz targets start from: fuzz/corpus/{gguf,safetensors,tokenizer_json}/.
"""
Usage: python3 scripts/gen_fuzz_corpus.py [--out fuzz/corpus]
Only the standard library and numpy. The GGUF and safetensors files are built byte by byte from
the published formats, so every field the readers check is present and valid; the fuzzer then
mutates from there. Seeds stay small (a few KiB) so that mutations stay fast.
"""

import argparse
import json
import pathlib
import shutil
import struct

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent

# GGUF metadata type ids and ggml tensor type ids (the published GGUF spec).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
        "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q6_K": (14, 256, 210), "BF16": (30, 1, 2)}


def gguf_string(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == STRING:
        return gguf_string(v)
    if t == ARRAY:
        elem_type, items = v
        out = struct.pack("<IQ", elem_type, len(items))
        return out + b"".join(gguf_value(elem_type, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def f16_bits(x):
    return int(np.array([x], dtype=np.float16).view(np.uint16)[0])


def tensor_bytes(type_name, n, seed):
    """Deterministic, valid-looking data: finite scales in every block."""
    _, block, size = GGML[type_name]
    rng = np.random.default_rng(seed)
    if type_name == "F32":
        return rng.standard_normal(n).astype("<f4").tobytes()
    if type_name == "F16":
        return rng.standard_normal(n).astype("<f2").tobytes()
    if type_name == "BF16":
        return (rng.standard_normal(n).astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    raw = bytearray(rng.integers(0, 256, (n // block) * size, dtype=np.uint8).tobytes())
    scale_at = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}[type_name]
    for b in range(n // block):
        for off in scale_at:
            struct.pack_into("<H", raw, b * size + off, f16_bits(0.01 * (b + 1)))
    return bytes(raw)


def gguf_file(kv, tensors, version=3, alignment=32):
    """kv: [(key, type, value)]; tensors: [(name, type_name, dims in ggml order)]."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv)))
    for key, t, v in kv:
        out += gguf_string(key) + struct.pack("<I", t) + gguf_value(t, v)
    datas, offset = [], 0
    for i, (name, type_name, dims) in enumerate(tensors):
        n = int(np.prod(dims))
        data = tensor_bytes(type_name, n, i)
        out += gguf_string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", GGML[type_name][0], offset)
        datas.append(data)
        offset += -(-len(data) // alignment) * alignment
    out += b"\0" * (-len(out) % alignment)
    for data in datas:
        out += data + b"\0" * (-len(data) % alignment)
    return bytes(out)


def byte_level_alphabet():
    """GPT-2's printable stand-in for each byte (published byte-to-unicode table)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def gguf_seeds():
    every_type = [
        ("general.architecture", STRING, "llama"),
        ("general.alignment", U32, 32),
        ("t.u8", U8, 7), ("t.i8", I8, -7), ("t.u16", U16, 700), ("t.i16", I16, -700),
        ("t.i32", I32, -70000), ("t.f32", F32, 0.5), ("t.bool", BOOL, True),
        ("t.u64", U64, 1 << 40), ("t.i64", I64, -(1 << 40)), ("t.f64", F64, 0.25),
        ("t.str", STRING, "h\u00e9llo"),
        ("t.arr_i32", ARRAY, (I32, [1, -2, 3])),
        ("t.arr_str", ARRAY, (STRING, ["a", "bc", ""])),
        ("t.arr_arr", ARRAY, (ARRAY, [(U8, [1, 2]), (U8, [])])),
    ]
    tensors = [
        ("a.f32", "F32", [8, 2]), ("b.f16", "F16", [16]), ("c.bf16", "BF16", [4, 4]),
        ("d.q8_0", "Q8_0", [32, 2]), ("e.q4_0", "Q4_0", [64]), ("f.q4_1", "Q4_1", [32, 3]),
        ("g.q4_k", "Q4_K", [256]), ("h.q6_k", "Q6_K", [256]),
    ]
    alphabet = byte_level_alphabet()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    vocab = alphabet + [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<|im_start|>"]
    gpt2_tok = [
        ("general.architecture", STRING, "llama"),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, "smollm"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, vocab)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [1] * (len(vocab) - 2) + [3, 3])),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
        ("tokenizer.ggml.bos_token_id", U32, len(vocab) - 2),
        ("tokenizer.ggml.eos_token_id", U32, len(vocab) - 2),
    ]
    spm_vocab = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    spm_vocab += ["\u2581", "\u2581t", "\u2581th", "\u2581the", "e", "h", "t", "a"]
    spm_tok = [
        ("general.architecture", STRING, "llama"),
        ("tokenizer.ggml.model", STRING, "llama"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, spm_vocab)),
        ("tokenizer.ggml.scores", ARRAY, (F32, [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5, -6, -7, -8])),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [2, 3, 3] + [6] * 256 + [1] * 8)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.unknown_token_id", U32, 0),
        ("tokenizer.ggml.add_bos_token", BOOL, True),
    ]
    llama_cfg = [
        ("general.architecture", STRING, "llama"),
        ("llama.block_count", U32, 1), ("llama.context_length", U32, 64),
        ("llama.embedding_length", U32, 64), ("llama.feed_forward_length", U32, 128),
        ("llama.attention.head_count", U32, 2), ("llama.attention.head_count_kv", U32, 1),
        ("llama.rope.freq_base", F32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.vocab_size", U32, 32),
    ]
    # One Llama block with every weight the loader asks for, in several storage types.
    C, F, V, KV = 64, 128, 32, 32
    llama_tensors = [
        ("token_embd.weight", "Q8_0", [C, V]), ("output_norm.weight", "F32", [C]),
        ("blk.0.attn_norm.weight", "F32", [C]), ("blk.0.attn_q.weight", "Q4_0", [C, C]),
        ("blk.0.attn_k.weight", "Q4_1", [C, KV]), ("blk.0.attn_v.weight", "F16", [C, KV]),
        ("blk.0.attn_output.weight", "Q8_0", [C, C]), ("blk.0.ffn_norm.weight", "F32", [C]),
        ("blk.0.ffn_gate.weight", "Q4_1", [C, F]), ("blk.0.ffn_up.weight", "Q4_0", [C, F]),
        ("blk.0.ffn_down.weight", "BF16", [F, C]),
    ]
    return {
        "every_type.gguf": gguf_file(every_type, tensors),
        "every_type_v2.gguf": gguf_file(every_type[2:8], tensors[:4], version=2),
        "align64.gguf": gguf_file([("general.alignment", U32, 64)], tensors[3:6], alignment=64),
        "empty.gguf": gguf_file([], []),
        "tokenizer_gpt2.gguf": gguf_file(gpt2_tok, []),
        "tokenizer_spm.gguf": gguf_file(spm_tok, []),
        "zero_dim.gguf": gguf_file([], [("empty", "F32", [0, 4])]),
        "llama_1_block.gguf": gguf_file(llama_cfg, llama_tensors),
        "llama_1_block_output_head.gguf": gguf_file(
            llama_cfg, llama_tensors + [("output.weight", "Q4_1", [C, V])]),
    }


def safetensors_file(tensors, metadata=None):
    """tensors: [(name, dtype, shape, numpy dtype)]; data laid out in order."""
    header, data = {}, bytearray()
    if metadata is not None:
        header["__metadata__"] = metadata
    rng = np.random.default_rng(7)
    for name, dtype, shape, np_dtype in tensors:
        n = int(np.prod(shape))
        if dtype == "BF16":
            raw = (rng.standard_normal(n).astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
        elif dtype == "I32":
            raw = rng.integers(-100, 100, n).astype("<i4").tobytes()
        else:
            raw = rng.standard_normal(n).astype(np_dtype).tobytes()
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(data)


def safetensors_seeds():
    mixed = [
        ("w.f32", "F32", [3, 4], "<f4"), ("w.f16", "F16", [5], "<f2"),
        ("w.bf16", "BF16", [2, 2, 2], None), ("step", "I32", [2], None), ("scalar", "F32", [], "<f4"),
        ("empty", "F32", [0, 3], "<f4"),
    ]
    return {
        "mixed.safetensors": safetensors_file(mixed, {"format": "pt", "step": "12"}),
        "one.safetensors": safetensors_file(mixed[:1]),
        "empty.safetensors": safetensors_file([], {"k": "v"}),
    }


def tokenizer_seeds():
    alphabet = byte_level_alphabet()
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [["Ġ", "t"], ["h", "e"], ["Ġt", "he"]]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}]

    def doc(pre, merges_form):
        m = merges if merges_form == "pairs" else [" ".join(p) for p in merges]
        return json.dumps({
            "version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": pre,
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": m},
        }, ensure_ascii=False).encode()

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    digits = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, byte_level]}
    seeds = {
        "byte_level.json": doc(byte_level, "strings"),
        "byte_level_pairs.json": doc(byte_level, "pairs"),
        "digits_byte_level.json": doc(digits, "strings"),
    }
    # The hand-written and converted tokenizers the tokenizer tests use, when present and small.
    for name in ["tok512_hf.json", "tok512.json", "llama3_bpe.json", "spm_bpe.json", "spm_legacy.json",
                 "qwen2_nfc.json", "added_strip.json"]:
        src = REPO / "tests" / "data" / "tokenizer" / name
        if src.exists() and src.stat().st_size < 64 * 1024:
            seeds[name] = src.read_bytes()
    return seeds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "fuzz" / "corpus")
    args = ap.parse_args()
    for target, seeds in [("gguf", gguf_seeds()), ("safetensors", safetensors_seeds()),
                          ("tokenizer_json", tokenizer_seeds())]:
        d = args.out / target
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        for name, data in seeds.items():
            (d / name).write_bytes(data)
        print(f"{d}: {len(seeds)} seeds, {sum(len(x) for x in seeds.values())} bytes")


if __name__ == "__main__":
    main()
