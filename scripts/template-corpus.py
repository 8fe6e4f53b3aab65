#!/usr/bin/env python3
"""Real models' chat templates through `tessera template` and through transformers' renderer.

The corpus is the set of templates llama.cpp collects from published models (models/templates in
its tree: Llama 3.x, Qwen 2.5/3, Gemma, Mistral, DeepSeek, Phi, Granite, Command R, Hermes,
GLM, Kimi, MiniMax, gpt-oss, ...), read at run time from the llama-cpp-python source package on
PyPI (the same download as scripts/build-llamacpp.sh), never copied into this repository. Each
template renders every conversation of tests/data/chat_templates/conversations.json (system or
not, multi-turn, non-ASCII, tool calls and results, reasoning), with and without the generation
prompt, through transformers' apply_chat_template machinery (jinja2, its sandbox and globals)
and through `tessera template`. A rendering agrees when both outputs are equal byte for byte or
both refuse (raise_exception, or an error).

Usage: scripts/template-corpus.py [--tessera build/tessera] [--dir TEMPLATES_DIR] [--json OUT]
                                  [--no-fetch]
Needs transformers and jinja2 (pip). Prints one line per template and the totals; exits 1 if any
rendering disagrees, 77 (the ctest skip) without transformers, or with --no-fetch when the
corpus has not been downloaded.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

try:
    from transformers.utils import chat_template_utils as ctu
except ImportError:
    print("template-corpus: transformers is not installed; skipped", file=sys.stderr)
    sys.exit(77)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CONVERSATIONS = os.path.join(ROOT, "tests", "data", "chat_templates", "conversations.json")
VERSION = os.environ.get("LLAMACPP_PYPI_VERSION", "0.3.36")
WORK = os.environ.get("WORK", "/tmp/tessera-llamacpp")
BOS, EOS = "<s>", "</s>"


def corpus_dir(fetch):
    src = os.path.join(WORK, f"llama_cpp_python-{VERSION}")
    templates = os.path.join(src, "vendor", "llama.cpp", "models", "templates")
    if not os.path.isdir(templates) and not fetch:
        print(f"template-corpus: no corpus at {templates} (run scripts/template-corpus.py once "
              "to download it); skipped", file=sys.stderr)
        sys.exit(77)
    if not os.path.isdir(templates):
        os.makedirs(WORK, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", f"llama-cpp-python=={VERSION}", "-d", WORK], check=True,
                       stdout=sys.stderr)
        subprocess.run(["tar", "xzf", os.path.join(WORK, f"llama_cpp_python-{VERSION}.tar.gz"),
                        "-C", WORK], check=True)
    return templates


def oracle(template, conv, gen):
    try:
        out, _ = ctu.render_jinja_template(
            conversations=[conv["messages"]], tools=conv.get("tools"), chat_template=template,
            add_generation_prompt=gen, bos_token=BOS, eos_token=EOS, **conv.get("extra", {}))
        return True, out[0]
    except Exception as e:  # noqa: BLE001 - any refusal counts as one
        return False, f"{type(e).__name__}: {e}"


def ours(tessera, path, conv, gen, tmp):
    msgs = os.path.join(tmp, "messages.json")
    with open(msgs, "w", encoding="utf-8") as f:
        json.dump(conv["messages"], f, ensure_ascii=False)
    cmd = [tessera, "template", "--template", path, "--messages", msgs, "--bos-token", BOS,
           "--eos-token", EOS]
    if conv.get("tools") is not None:
        tools = os.path.join(tmp, "tools.json")
        with open(tools, "w", encoding="utf-8") as f:
            json.dump(conv["tools"], f, ensure_ascii=False)
        cmd += ["--tools", tools]
    if conv.get("extra"):
        cmd += ["--vars", json.dumps(conv["extra"], ensure_ascii=False)]
    if not gen:
        cmd.append("--no-generation-prompt")
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        return False, r.stderr.decode("utf-8", "replace").strip()
    return True, r.stdout.decode("utf-8")


def first_difference(a, b):
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"at byte {i}: transformers {a[max(0, i - 20):i + 30]!r}, tessera {b[max(0, i - 20):i + 30]!r}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build", "tessera"))
    ap.add_argument("--dir", help="a folder of .jinja templates (default: llama.cpp's corpus)")
    ap.add_argument("--json", help="write per-template results here")
    ap.add_argument("--no-fetch", action="store_true", help="skip (77) if not downloaded yet")
    args = ap.parse_args()
    folder = args.dir or corpus_dir(not args.no_fetch)
    with open(CONVERSATIONS, encoding="utf-8") as f:
        conversations = json.load(f)
    results, total, agree = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(glob.glob(os.path.join(folder, "*.jinja"))):
            with open(path, encoding="utf-8") as f:
                template = f.read()
            row = {"template": os.path.basename(path), "agree": 0, "cases": 0,
                   "both_refuse": 0, "differ": []}
            for conv in conversations:
                for gen in (False, True):
                    ok_a, a = oracle(template, conv, gen)
                    ok_b, b = ours(args.tessera, path, conv, gen, tmp)
                    row["cases"] += 1
                    case = f"{conv['name']}|gen={int(gen)}"
                    if ok_a and ok_b and a == b:
                        row["agree"] += 1
                    elif not ok_a and not ok_b:
                        row["agree"] += 1
                        row["both_refuse"] += 1
                    elif ok_a and ok_b:
                        row["differ"].append(f"{case}: {first_difference(a, b)}")
                    elif ok_a:
                        row["differ"].append(f"{case}: tessera refused: {b[:200]}")
                    else:
                        row["differ"].append(f"{case}: transformers refused ({a[:120]}), "
                                             "tessera rendered")
            total += row["cases"]
            agree += row["agree"]
            results.append(row)
            mark = "ok  " if not row["differ"] else "DIFF"
            print(f"{mark} {row['template']}: {row['agree']}/{row['cases']} agree "
                  f"({row['both_refuse']} refused by both)")
            for d in row["differ"][:2]:
                print(f"       {d}")
    n_ok = sum(1 for r in results if not r["differ"])
    print(f"{n_ok} of {len(results)} templates agree on every case; {agree} of {total} renderings")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, ensure_ascii=False, indent=1)
    return 0 if n_ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
