#!/usr/bin/env python3
"""Layering check: every #include "..." under src/ must follow the picture in src/LAYERS.

Usage: check_layers.py [repo root] | --self-test. Exits 1 naming each forbidden include, each stale `allow`
line, and any difference between the picture in src/LAYERS and the one in docs/ARCHITECTURE.md.
"""
import os
import re
import sys

_arg = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "--self-test" else None
root = os.path.abspath(_arg or os.path.join(os.path.dirname(__file__), ".."))
src = os.path.join(root, "src")
errors = []


def read_rules():
    text = open(os.path.join(src, "LAYERS")).read().splitlines()
    pic, inside, allows = [], False, set()
    for line in text:
        if line.startswith("# picture:"):
            inside = True
        elif line.startswith("# end picture"):
            inside = False
        elif inside:
            pic.append(line[2:])
        elif line.startswith("allow "):
            m = re.fullmatch(r"allow (\S+) -> (\S+)", line.strip())
            if not m:
                errors.append(f"src/LAYERS: bad allow line '{line}'")
            else:
                allows.add((m.group(1), m.group(2)))
    deps = {}
    for line in pic:
        name = line.split()[0]
        deps[name] = line.split("->", 1)[1].split() if "->" in line else []
    for name, ds in deps.items():
        for d in ds:
            if d not in deps:
                errors.append(f"src/LAYERS: layer {name} points at unknown layer {d}")
    return pic, deps, allows


def closure(deps):
    out = {}
    for name in deps:
        seen, stack = set(), list(deps[name])
        while stack:
            d = stack.pop()
            if d in seen or d not in deps:
                continue
            seen.add(d)
            stack.extend(deps[d])
        out[name] = seen | {name}
    return out


def layer_of(path, layers):
    """Layer of a path relative to src/: the longest layer name that is a folder prefix."""
    best = None
    for name in layers:
        if path.startswith(name + "/") and (best is None or len(name) > len(best)):
            best = name
    return best


def main():
    pic, deps, allows = read_rules()
    allowed = closure(deps)
    used_allows = set()
    inc_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith((".h", ".cc", ".cu", ".cuh")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            layer = layer_of(rel, deps)
            if layer is None:
                errors.append(f"src/{rel}: in no layer of src/LAYERS")
                continue
            for n, line in enumerate(open(os.path.join(dirpath, f), errors="replace"), 1):
                m = inc_re.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if os.path.exists(os.path.join(dirpath, inc)) and not os.path.exists(os.path.join(src, inc)):
                    inc = os.path.relpath(os.path.normpath(os.path.join(dirpath, inc)), src)
                target = layer_of(inc, deps)
                if target is None or target in allowed[layer]:
                    continue
                if (rel, inc) in allows:
                    used_allows.add((rel, inc))
                    continue
                errors.append(f"src/{rel}:{n}: layer {layer} may not include {inc} (layer {target}); "
                              f"{layer} may include: {' '.join(sorted(allowed[layer]))}")
    for a in sorted(allows - used_allows):
        errors.append(f"src/LAYERS: 'allow {a[0]} -> {a[1]}' is no longer needed: remove it")
    for d in sorted(os.listdir(src)):
        full = os.path.join(src, d)
        if os.path.isdir(full):
            subs = [d + "/" + s for s in os.listdir(full) if os.path.isdir(os.path.join(full, s))]
            for layer in [d] + subs:
                if layer == d and any(s in deps for s in subs):
                    continue  # a folder of layers (apps/, backend/ without headers of its own)
                if layer not in deps and layer_of(layer + "/x", deps) is None:
                    errors.append(f"src/{layer}: folder in no layer of src/LAYERS")
    doc = open(os.path.join(root, "docs", "ARCHITECTURE.md")).read()
    if "\n".join(pic) not in doc:
        errors.append("docs/ARCHITECTURE.md: section 1 must show the picture of src/LAYERS line for line")
    for e in errors:
        print(e)
    print(f"check_layers: {len(errors)} problem(s)")
    return 1 if errors else 0


def self_test():
    """The check must fail on a forbidden include and on a stale allow line, and pass on a copy."""
    import shutil
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("src", "docs"):
            shutil.copytree(os.path.join(root, d), os.path.join(tmp, d))
        run = lambda: subprocess.run([sys.executable, __file__, tmp], capture_output=True, text=True)
        ok = run()
        assert ok.returncode == 0, "clean copy fails:\n" + ok.stdout
        bad = os.path.join(tmp, "src", "ops", "zz_bad.h")
        open(bad, "w").write('#include "backend/cpu/cpu_kernels.h"\n')
        r = run()
        assert r.returncode == 1 and "src/ops/zz_bad.h:1: layer ops may not include" in r.stdout, r.stdout
        os.remove(bad)
        with open(os.path.join(tmp, "src", "LAYERS"), "a") as f:
            f.write("allow core/error.h -> model/gpt2.h\n")
        r = run()
        assert r.returncode == 1 and "is no longer needed" in r.stdout, r.stdout
    print("check_layers self-test: 3 passed, 0 failed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        sys.exit(self_test())
    sys.exit(main())
