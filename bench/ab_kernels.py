"""Generated kernels of another revision against this tree's, timed in one process.

For single-kernel workloads (the pointwise and row rows of bench/backend.py, and the
activations whose math lives in the prelude), the C++ ember generates at `--base` (a git
revision, generated in a subprocess from a `git archive` of it) and at the working tree are
built with the same flags and target, loaded side by side, and called on the same buffers
in interleaved blocks: the median ratio says whether a change to lowering or prelude made a
kernel faster or slower, free of capture, wrapper and allocation costs. Both outputs are
compared too. Run with one thread to weigh the math rather than the memory system:

    OMP_NUM_THREADS=1 .venv/bin/python bench/ab_kernels.py --base HEAD~3
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import block, calls_per_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

WORKLOADS = {
    "pointwise chain": "lambda x: torch.sigmoid(x * 1.5 + 0.5) * torch.tanh(x) - x.abs()",
    "softmax": "lambda x: torch.softmax(x, -1)",
    "log_softmax": "lambda x: torch.log_softmax(x, -1)",
    "gelu": "lambda x: F.gelu(x)",
    "gelu tanh": "lambda x: F.gelu(x, approximate='tanh')",
    "silu": "lambda x: F.silu(x)",
    "exp": "lambda x: torch.exp(x)",
    "erf": "lambda x: torch.erf(x)",
}
SHAPE = (4096, 1024)

GENERATE = """
import json, sys, torch
import torch.nn.functional as F
import ember.backend
from ember.backend.compile import record
torch._dynamo.config.cache_size_limit = 100
SHAPE = tuple(json.loads(sys.argv[2]))
out = {}
for name, src in json.loads(sys.argv[1]).items():
    fn = eval(src)
    with record() as arts:
        torch.compile(fn, backend=ember.backend, dynamic=False)(torch.randn(SHAPE))
    (art,) = arts
    out[name] = {"cpp": art.cpp, "kernels": art.kernels}
print(json.dumps(out))
"""


def generate(tree: Path, cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), EMBER_CACHE_DIR=str(cache))
    args = [sys.executable, "-c", GENERATE, json.dumps(WORKLOADS), json.dumps(SHAPE)]
    p = subprocess.run(args, env=env, capture_output=True, text=True, cwd=tree, check=False)
    if p.returncode != 0:
        raise SystemExit(f"generating kernels in {tree} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def archive(rev: str, into: Path) -> Path:
    data = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=data.stdout, check=True)
    return into


def kernel(entry: dict) -> ctypes._CFuncPtr:
    from ember.backend.codegen import build

    kinds = entry["kernels"]
    # older revisions recorded a kernel's pointer count, newer ones its argument kinds
    kinds = {name: "p" * k if isinstance(k, int) else k for name, k in kinds.items()}
    if kinds != {"kernel0": "pp"}:
        raise SystemExit(f"not a single two-pointer kernel: {entry['kernels']}")
    return build.load(entry["cpp"], kinds)["kernel0"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True, help="git revision to compare against")
    p.add_argument("--blocks", type=int, default=11)
    p.add_argument("--block-s", type=float, default=0.1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cache = Path(d) / "cache"
        base = generate(archive(args.base, Path(d)), cache)
        head = generate(ROOT, cache)
    print(f"{'workload':16} {'base/head time':>14} {'others':>7}  max |head - base|")
    torch.manual_seed(0)
    x = torch.randn(SHAPE) * 4
    for name in WORKLOADS:
        fns = {"base": kernel(base[name]), "head": kernel(head[name])}
        outs = {k: torch.empty_like(x) for k in fns}
        calls = {k: (lambda f=f, o=outs[k]: f(x.data_ptr(), o.data_ptr())) for k, f in fns.items()}
        n = calls_per_block(calls["head"], (), args.block_s)
        times: dict[str, list[float]] = {"base": [], "head": []}
        others = []
        for _ in range(args.blocks):
            for k in ("base", "head"):
                r = block(calls[k], (), n)
                times[k].append(r["cpu_per_call"])
                others.append(r["others"])
        ratio = statistics.median(times["base"]) / statistics.median(times["head"])
        diff = (outs["head"] - outs["base"]).abs().nan_to_num(0, 0, 0).max().item()
        print(f"{name:16} {ratio:13.3f}x {statistics.median(others):7.0%}  {diff:.3g}")


if __name__ == "__main__":
    main()
