#!/usr/bin/env python3
"""Loads a LoRA adapter written by `tessera finetune --lora` with PEFT itself and compares.

The base model is written as a Hugging Face folder in f32 (`tessera convert --dtype f32`), loaded
by transformers on the CPU, and the adapter applied by `peft.PeftModel.from_pretrained` from the
run's folder as it is (adapter_config.json, adapter_model.safetensors). The mean negative
log-likelihood of the first --ctx tokens of TEXT, with and without the adapter, is then computed
by PyTorch and by `tessera perplexity --lora` (f32 KV cache, one window) on the same folder. The
adapter must move the NLL by far more than the two engines differ. Needs torch, transformers
and peft (not in scripts/python-requirements.txt: torch from PyPI brings the CUDA libraries, some
GB); exits 77 without them. Writes its figures as JSON to --out.

usage: peft-check.py TESSERA BASE.gguf ADAPTER_DIR TEXT [--ctx 256] [--out result.json]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import peft
    import torch
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:
    print(f"needs torch, transformers and peft ({e}): skipped")
    sys.exit(77)


def tessera_nll(tessera, folder, adapter, text, ctx):
    cmd = [tessera, "perplexity", "-m", folder, "-f", text, "--ctx", str(ctx), "--max-windows", "1",
           "--kv-type", "f32", "--json"]
    if adapter:
        cmd += ["--lora", adapter]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return math.log(out["perplexity"]), out["tokens"]


def torch_nll(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return -sum(lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)) / (len(ids) - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tessera")
    ap.add_argument("base")
    ap.add_argument("adapter")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "base")
        subprocess.run([a.tessera, "convert", a.base, folder, "--dtype", "f32"], check=True,
                       capture_output=True)
        tok = AutoTokenizer.from_pretrained(folder)
        with open(a.text, encoding="utf-8") as f:
            ids = tok(f.read(), add_special_tokens=False)["input_ids"][: a.ctx]
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
        model.eval()
        theirs_base = torch_nll(model, ids)
        adapted = PeftModel.from_pretrained(model, a.adapter)
        adapted.eval()
        theirs_lora = torch_nll(adapted, ids)
        ours_base, n_base = tessera_nll(a.tessera, folder, "", a.text, a.ctx)
        ours_lora, n_lora = tessera_nll(a.tessera, folder, a.adapter, a.text, a.ctx)
    result = {
        "tokens_scored": {"torch": len(ids) - 1, "tessera": n_lora},
        "nll_base": {"torch": theirs_base, "tessera": ours_base},
        "nll_lora": {"torch": theirs_lora, "tessera": ours_lora},
        "adapter_effect": abs(theirs_lora - theirs_base),
        "engines_differ_by": abs(theirs_lora - ours_lora),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__},
    }
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    ok = (n_base == n_lora == len(ids) - 1 and
          result["engines_differ_by"] < 1e-3 * max(1.0, abs(theirs_lora)) and
          abs(theirs_base - ours_base) < 1e-3 * max(1.0, abs(theirs_base)) and
          result["adapter_effect"] > 10 * result["engines_differ_by"])
    print("peft-check:", "ok" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
