#!/usr/bin/env python3
"""A Hugging Face folder written by `tessera convert` loads in transformers (no torch needed)
with the ids generate() stops at, and transformers renders and tokenizes as tessera does:
apply_chat_template(tokenize=False) equals `tessera template`, and the tokenizer's ids equal
`tessera tokenizer encode --special`. Skipped (exit 77) where transformers is not installed.
    hf_interop_test.py TESSERA_BIN MODEL.gguf"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import transformers  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
except ImportError:
    print("transformers is not installed: skipped")
    sys.exit(77)

tessera, model = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args):
    return subprocess.run([tessera, *args], check=True, capture_output=True, text=True).stdout


with tempfile.TemporaryDirectory() as tmp:
    folder = os.path.join(tmp, "hf")
    run("convert", model, folder)
    config = AutoConfig.from_pretrained(folder)
    gen = GenerationConfig.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    check(config.model_type == "llama", f"model_type {config.model_type}")
    check(tok.eos_token is not None, "the tokenizer has an eos token")
    eos_id = tok.convert_tokens_to_ids(tok.eos_token)
    check(config.eos_token_id == eos_id, f"config eos {config.eos_token_id} != tokenizer's {eos_id}")
    check(gen.eos_token_id == eos_id, f"generation_config eos {gen.eos_token_id} != {eos_id}")

    conversations = [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Réponds en français."},
         {"role": "user", "content": "Bonjour ! 東京は？"},
         {"role": "assistant", "content": "Tōkyō est la capitale du Japon."},
         {"role": "user", "content": "Et la France ?"}],
    ]
    for i, conv in enumerate(conversations):
        path = os.path.join(tmp, f"conv{i}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(conv, f, ensure_ascii=False)
        for gen_prompt in (True, False):
            theirs = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen_prompt)
            flags = [] if gen_prompt else ["--no-generation-prompt"]
            for source in (model, folder):
                ours = run("template", "-m", source, "--messages", path, *flags)
                check(ours == theirs, f"template of conversation {i} (generation prompt "
                                      f"{gen_prompt}) from {source}:\n{ours!r}\n!=\n{theirs!r}")
            ids = tok(theirs, add_special_tokens=False)["input_ids"]
            ours_ids = run("tokenizer", "encode", "-m", folder, "--text", theirs, "--special")
            check(ours_ids.strip() == ",".join(map(str, ids)),
                  f"ids of conversation {i}: {ours_ids.strip()} != {ids}")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
