#!/usr/bin/env python3
"""Goldens for real-model tokenizers and chat templates, from Hugging Face `tokenizers`, `gguf`
and `jinja2` (all pip packages).

Writes into tests/data/tokenizer/:
  smollm2.gguf            SmolLM2-135M-Instruct's tokenizer.* metadata copied verbatim from the
                          model file (no tensors), so tests need not have the 100 MB model
  smollm2.json            the equivalent HF tokenizer built from that vocabulary and merges
                          (Digits(individual) + ByteLevel pre-tokenizer, control tokens special)
  llama3_bpe.json         a small byte-level BPE trained here with the Llama 3 split regex
  qwen2_bpe.json          the same with Qwen2's split regex (single digits) and NFC normalizer
  spm_bpe.json            a small SentencePiece-style BPE (byte_fallback, Metaspace "first")
  spm_legacy.json         the same model with Llama 2's legacy layout (Prepend + Replace
                          normalizer, no pre-tokenizer)
  real_golden.json        per tokenizer: the strings, HF's ids and HF's decode of those ids;
                          per pre-tokenizer variant (gpt2, smollm, llama3, qwen2): HF's pieces
  chat_golden.json        canonical chat templates rendered by jinja2 on fixed conversations

Usage: scripts/gen_real_tokenizer_golden.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import json
import os
import sys

import gguf
import jinja2
import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")
sys.path.insert(0, HERE)
from gen_tokenizer_golden import CASES as BASE_CASES  # noqa: E402

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

EXTRA_CASES = [
    "'S 'T 'RE 'Ve 'LL 'D 'M it'S WE'RE x'\u017fa (long s folds to s) it'Sa",
    "numbers 1234567 12345678901 007 3.14159265358979 1,000,000",
    ".hello ,world !bang (paren) [x] {y} #tag @user $5",
    "\r\n\r\n  \n x \r\r\n\ty",
    "a\n\n\tb  \n  c\t\n",
    "x  \n  y   \n\n   z",
    "trailing newline spaces \n   ",
    "  \u00a0\u00a0 nbsp run \u2003em",
    "mixed\u00e9t\u00e9 123\u0661\u0662 \u2160\u2161 ab\u00b2",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "  <|im_end|>  spaced specials <|im_start|>",
    "<s>[INST] Hello there [/INST] Hi!</s>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "\u2581already meta \u2581\u2581 symbols",
]
CASES = BASE_CASES + EXTRA_CASES


def dump_cases(name, tok, cases):
    out = []
    for text in cases:
        ids = tok.encode(text).ids
        out.append({"text": text, "ids": ids,
                    "decoded": tok.decode(ids, skip_special_tokens=False),
                    "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    return {"tokenizer": name, "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "cases": out}


def field_value(reader, key):
    f = reader.fields[key]
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def smollm2(model_path):
    r = gguf.GGUFReader(model_path)
    keys = [k for k in r.fields if k.startswith("tokenizer.")]
    v = {k: field_value(r, k) for k in keys}
    w = gguf.GGUFWriter(os.path.join(DATA, "smollm2.gguf"), "llama")
    w.add_tokenizer_model(v["tokenizer.ggml.model"])
    w.add_tokenizer_pre(v["tokenizer.ggml.pre"])
    w.add_token_list(v["tokenizer.ggml.tokens"])
    w.add_token_types(v["tokenizer.ggml.token_type"])
    w.add_token_merges(v["tokenizer.ggml.merges"])
    w.add_bos_token_id(v["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(v["tokenizer.ggml.eos_token_id"])
    w.add_unk_token_id(v["tokenizer.ggml.unknown_token_id"])
    w.add_pad_token_id(v["tokenizer.ggml.padding_token_id"])
    w.add_add_bos_token(v["tokenizer.ggml.add_bos_token"])
    w.add_add_space_prefix(v["tokenizer.ggml.add_space_prefix"])
    w.add_chat_template(v["tokenizer.chat_template"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    tokens, types = v["tokenizer.ggml.tokens"], v["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in v["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    tok.save(os.path.join(DATA, "smollm2.json"), pretty=False)
    return dump_cases("smollm2.json", tok, CASES), v["tokenizer.chat_template"]


def training_text(cases):
    """train.txt plus the cases without special tokens, three times: every case's pieces occur."""
    with open(os.path.join(DATA, "train.txt"), encoding="utf-8") as f:
        base = f.read()
    return [base] + [c for c in cases if "<" not in c] * 3


def split_byte_level_bpe(pattern, specials, vocab_size, corpus, normalizer=None):
    """A byte-level BPE trained on corpus, pre-tokenized by the regex `pattern` (Llama 3, Qwen2)."""
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def llama3_bpe():
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"]
    tok = split_byte_level_bpe(LLAMA3_PATTERN, specials, 700, training_text(CASES))
    # Llama 3 emits a pre-token that is itself a token without merging (llama.cpp does the same
    # for the llama3 pre-tokenizer).
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    path = os.path.join(DATA, "llama3_bpe.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return dump_cases("llama3_bpe.json", Tokenizer.from_file(path), CASES)


def qwen2_bpe():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = split_byte_level_bpe(QWEN2_PATTERN, specials, 700, training_text(CASES),
                               normalizer=normalizers.NFC())
    path = os.path.join(DATA, "qwen2_bpe.json")
    tok.save(path, pretty=False)
    return dump_cases("qwen2_bpe.json", Tokenizer.from_file(path), CASES)


def spm_bpe():
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=True)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # A small alphabet forces rare characters (CJK, emoji, accents) onto the byte tokens.
    trainer = trainers.BpeTrainer(vocab_size=700, show_progress=False, limit_alphabet=70,
                                  special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens)
    tok.train_from_iterator(training_text(CASES), trainer)
    # Llama keeps the byte tokens as ordinary vocabulary, not added tokens.
    j = json.loads(tok.to_str())
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] not in byte_tokens]
    path = os.path.join(DATA, "spm_bpe.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    tok = Tokenizer.from_file(path)
    golden_first = dump_cases("spm_bpe.json", tok, CASES)

    j["pre_tokenizer"] = None
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    path = os.path.join(DATA, "spm_legacy.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    golden_legacy = dump_cases("spm_legacy.json", Tokenizer.from_file(path), CASES)
    return golden_first, golden_legacy


def pieces(pre, cases):
    return [[p for p, _ in pre.pre_tokenize_str(t)] for t in cases]


def pre_tokenizer_pieces():
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    variants = {
        "gpt2": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        "smollm": pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
        "llama3": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"), bl]),
        "qwen2": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"), bl]),
    }
    return {name: pieces(pre, CASES) for name, pre in variants.items()}


# Canonical templates as published with each family's chat models (single-line forms).
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
ZEPHYR_TEMPLATE = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen2's: a default system prompt written with escaped newlines inside the literal.
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "  Hi there \n"}, {"role": "assistant", "content": "Hello. "},
     {"role": "user", "content": "Tell me a joke."}],
    [{"role": "system", "content": "You answer in French."},
     {"role": "user", "content": "Bonjour"}, {"role": "assistant", "content": "Salut !"},
     {"role": "user", "content": "Ca va ?\n\nOui."}],
]


def chat_goldens(smollm_template):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)
    env.globals["raise_exception"] = raise_exception
    families = [
        ("smollm2", "chatml", smollm_template, "", ""),
        ("qwen2", "chatml", QWEN2_TEMPLATE, "", ""),
        ("chatml", "chatml", CHATML_TEMPLATE, "", ""),
        ("llama2", "llama2", LLAMA2_TEMPLATE, "<s>", "</s>"),
        ("llama3", "llama3", LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>"),
        ("zephyr", "zephyr", ZEPHYR_TEMPLATE, "<s>", "</s>"),
    ]
    out = []
    for name, fmt, text, bos, eos in families:
        tpl = env.from_string(text)
        renders = []
        for conv in CONVERSATIONS:
            for gen in (False, True):
                renders.append({"messages": conv, "add_generation_prompt": gen,
                                "text": tpl.render(messages=conv, add_generation_prompt=gen,
                                                   bos_token=bos, eos_token=eos)})
        out.append({"family": name, "format": fmt, "template": text, "bos": bos,
                    "renders": renders})
    return out


def write_json(name, obj):
    with open(os.path.join(DATA, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        HERE, "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    smol, smol_template = smollm2(model)
    spm_first, spm_legacy = spm_bpe()
    write_json("real_golden.json", {
        "generator": "scripts/gen_real_tokenizer_golden.py",
        "hf_tokenizers_version": tokenizers.__version__,
        "tokenizers": [smol, llama3_bpe(), qwen2_bpe(), spm_first, spm_legacy],
        "pieces": {"cases": CASES, **pre_tokenizer_pieces()},
    })
    write_json("chat_golden.json", {"generator": "scripts/gen_real_tokenizer_golden.py",
                                    "jinja2_version": jinja2.__version__,
                                    "families": chat_goldens(smol_template)})
    print(f"wrote goldens for {len(CASES)} strings with tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
