#!/usr/bin/env python3
"""A LoRA fine-tune's adapter files in PEFT's layout, read with `safetensors` from PyPI.

Runs `tessera finetune --lora` on the default model for two steps, then checks with the
`safetensors` package (not Tessera's reader) that adapter_model.safetensors holds, for every layer
and target, base_model.model.model.layers.N.<module>.lora_A.weight (r, in) and .lora_B.weight
(out, r) in F32 with the model's dimensions, and that adapter_config.json carries the keys
peft.LoraConfig reads with the run's values. Exit 77 (skipped) without safetensors.
usage: peft_layout_test.py TESSERA MODEL.gguf
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    from safetensors.numpy import load_file
except ImportError:
    print("safetensors is not installed: skipped")
    sys.exit(77)

# SmolLM2-135M: width 576, 9 query heads and 3 key/value heads of 64, MLP 1536, 30 layers.
SHAPES = {"self_attn.q_proj": (576, 576), "self_attn.k_proj": (192, 576),
          "self_attn.v_proj": (192, 576), "self_attn.o_proj": (576, 576),
          "mlp.gate_proj": (1536, 576), "mlp.up_proj": (1536, 576), "mlp.down_proj": (576, 1536)}


def main():
    tessera, model = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "chat.jsonl")
        with open(data, "w") as f:
            for i in range(12):
                f.write(json.dumps({"messages": [
                    {"role": "user", "content": f"Name the number after {i}."},
                    {"role": "assistant", "content": f"{i + 1}."}]}) + "\n")
        out = os.path.join(tmp, "adapter")
        subprocess.run([tessera, "finetune", "-m", model, "--data", data, "-o", out, "--lora", "8",
                        "--lora-alpha", "16", "--lora-targets", "q,v,down", "--steps", "2",
                        "--batch", "1", "--seq", "32", "--threads", "2", "--quiet"], check=True)
        tensors = load_file(os.path.join(out, "adapter_model.safetensors"))
        want = {}
        for layer in range(30):
            for module in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"):
                n_out, n_in = SHAPES[module]
                base = f"base_model.model.model.layers.{layer}.{module}"
                want[base + ".lora_A.weight"] = (8, n_in)
                want[base + ".lora_B.weight"] = (n_out, 8)
        assert set(tensors) == set(want), sorted(set(tensors) ^ set(want))[:6]
        for name, shape in want.items():
            t = tensors[name]
            assert t.shape == shape, (name, t.shape, shape)
            assert str(t.dtype) == "float32", (name, t.dtype)
        # Two steps moved B away from its zero start, and A holds PEFT's uniform init.
        assert any(abs(tensors[n]).max() > 0 for n in want if n.endswith("lora_B.weight"))
        assert abs(tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]).max() <= 1 / 24
        with open(os.path.join(out, "adapter_config.json")) as f:
            cfg = json.load(f)
        assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM", cfg
        assert cfg["r"] == 8 and cfg["lora_alpha"] == 16, cfg
        assert sorted(cfg["target_modules"]) == ["down_proj", "q_proj", "v_proj"], cfg
        assert cfg["base_model_name_or_path"] == model, cfg
        for key, value in (("bias", "none"), ("fan_in_fan_out", False), ("use_dora", False),
                           ("use_rslora", False), ("modules_to_save", None)):
            assert cfg[key] == value, (key, cfg[key])
    print("peft layout: ok (%d tensors)" % len(want))


if __name__ == "__main__":
    main()
