#!/usr/bin/env python3
"""Yardsticks for the GPU benches, measured in the same run on the same GPU: cuDNN's fused
attention and PyTorch's FlashAttention through torch's scaled_dot_product_attention (causal,
bf16, the shapes of tessera_cuda_attention_bench), and a bf16 GEMM through torch.matmul
(cuBLAS). One JSON object per line, FLOPs counted as the tessera benches count them.

Runs on the device machine (scripts/gpu-check.sh), where PyTorch is installed; nothing of it is
part of the library. Exits 0 with a line saying why when there is no torch or no GPU.
`torch_yardstick.py --compare bench.jsonl` prints tessera's figures against these ones.
"""
import json
import statistics
import sys


def median_ms(fn, warmup, reps):
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def attention(gpu, backend_name, B, H, T, D):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "torch_flash": SDPBackend.FLASH_ATTENTION}
    # (B, T, H, D) storage seen as (B, H, T, D), the layout the tessera kernels read.
    def make():
        x = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
        return x.transpose(1, 2).requires_grad_(True)

    q, k, v = make(), make(), make()
    grad = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    fwd_flops = 0.5 * 4.0 * B * H * T * T * D  # causal: half of dense
    reps = 10 if T >= 4096 else 20
    with sdpa_kernel([backend[backend_name]]):
        with torch.no_grad():
            fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 3, reps)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        bwd = median_ms(
            lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), 3, reps
        )
    for name, ms, flops in (("forward", fwd, fwd_flops), ("backward", bwd, 2.5 * fwd_flops)):
        print(json.dumps({
            "name": f"{backend_name}_attention_{name}",
            "shape": f"B={B} H={H} T={T} D={D} causal bf16",
            "median_ms": round(ms, 4),
            "tflops": round(flops / (ms * 1e-3) / 1e12, 2),
            "gpu": gpu,
        }), flush=True)


def gemm(gpu, n):
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: torch.matmul(a, b.t()), 3, 20)
    print(json.dumps({
        "bench": "gemm_bf16", "impl": "torch_matmul", "M": n, "N": n, "K": n,
        "median_ms": round(ms, 4), "tflops": round(2.0 * n**3 / (ms * 1e-3) / 1e12, 1),
        "gpu": gpu,
    }), flush=True)


def compare(path):
    """Prints tessera's attention and GEMM against the yardsticks found in a bench.jsonl."""
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    by_name = {(r.get("name"), r.get("shape")): r for r in rows if "tflops" in r}
    for (name, shape), ours in sorted(by_name.items(), key=lambda kv: str(kv[0])):
        if not name or not name.startswith("flash_attention_"):
            continue
        # flash_attention_forward_wgmma (the Hopper kernel) meets the same forward yardsticks.
        base = name.replace("_wgmma", "")
        for other in ("cudnn", "torch_flash"):
            theirs = by_name.get((base.replace("flash_attention_", f"{other}_attention_"), shape))
            if theirs:
                print(f"{name} {shape}: tessera {ours['tflops']} TFLOP/s, {other} "
                      f"{theirs['tflops']}: {ours['tflops'] / theirs['tflops']:.2f}x")
    big = [r for r in rows if r.get("bench") == "gemm_bf16" and r.get("M") == 8192
           and r.get("N") == 8192 and r.get("K") == 8192 and "tflops" in r]
    for r in big:
        print(f"gemm_bf16 8192^3 {r.get('impl')}: {r['tflops']} TFLOP/s")
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--compare":
        return compare(sys.argv[2])
    try:
        import torch
    except ImportError:
        print("torch_yardstick: no PyTorch here, nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("torch_yardstick: no CUDA device, nothing to measure")
        return 0
    gpu = torch.cuda.get_device_name(0)
    print(f"torch_yardstick: torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{gpu}", file=sys.stderr)
    failures = 0
    for backend_name in ("cudnn", "torch_flash"):
        for T in (1024, 4096):
            try:
                attention(gpu, backend_name, 4, 32, T, 128)
            except Exception as e:  # one backend missing must not hide the others
                failures += 1
                print(json.dumps({"name": f"{backend_name}_attention", "T": T,
                                  "error": str(e).splitlines()[0][:200]}), flush=True)
    try:
        gemm(gpu, 8192)
    except Exception as e:
        failures += 1
        print(json.dumps({"bench": "gemm_bf16", "impl": "torch_matmul",
                          "error": str(e).splitlines()[0][:200]}), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
