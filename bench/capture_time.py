"""First-call capture time of ember.compile(..., backend="eager"), in fresh processes.

The backend side of a first call is cached on disk; the capture (bytecode interpretation,
meta kernels, guards, replacement code) runs in every new process. This measures it alone for
GPT-2 tiny, the MLP block and the transformer block of bench/backend.py: each run is a new
process that imports torch, ember, ember.backend (as bench/backend.py's first call does; it
brings sympy and torch._refs, which the meta kernels need) and transformers, builds the
model, runs it eagerly once (transformers' lazy imports and PyTorch's first-dispatch work are
not ember's), then times the first compiled call under torch.no_grad(). "capture" is the
time inside ember's capture_call (with backend "eager" that is the whole capture and nothing
else); "first call" adds running the captured graph once. Medians of N processes, run one
after another (2 shared CPUs: the spread is printed too).

    .venv/bin/python bench/capture_time.py [-n 7] [--only gpt2,mlp,block] [--profile gpt2] [--bare]
        [--dynamic]

"cpu ms" is the process CPU time during the capture (less sensitive to other load than the
wall time; it counts all threads, but the capture runs on one). "import ms" is `import ember`
(+ `ember.backend`) in the same process. EMBER_SRC=DIR measures the ember package in DIR
instead of this checkout (a `git archive` of an older commit). `--dynamic` compiles with
dynamic=True: the first capture with size symbols, which builds a process's first ShapeEnv
(and imports torch._dynamo with it, unless the workload's imports already did).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

WORKLOADS = {
    "gpt2": "GPT-2 tiny",
    "mlp": "MLP 1024-4096-1024 b256",
    "block": "transformer block s128 d256 b8",
}


def _child(key: str, profile: bool, bare: bool, dynamic: bool) -> None:
    """One fresh process: everything but the compiled call happens before the clock starts."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, os.environ.get("EMBER_SRC", str(ROOT)))
    import torch
    from backend import workloads  # bench/backend.py

    t_import = time.perf_counter()
    import ember
    import ember.api

    if not bare:
        import ember.backend  # noqa: F401  (as bench/backend.py's first call imports it)
    t_import = time.perf_counter() - t_import

    if key == "gpt2":
        import transformers  # noqa: F401

    fn, inputs, _ = workloads()[WORKLOADS[key]]()
    spent = []
    original = ember.api.capture_call

    cpu = []

    def timed(*args, **kwargs):
        t, c = time.perf_counter(), time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)

    ember.api.capture_call = timed
    with torch.no_grad():
        fn(*inputs)  # eager warm-up
        compiled = ember.compile(fn, backend="eager", dynamic=dynamic)
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            compiled(*inputs)
            prof.disable()
            stats = pstats.Stats(prof, stream=sys.stderr)
            stats.sort_stats("cumulative").print_stats(45)
            stats.sort_stats("tottime").print_stats(45)
            return
        t0 = time.perf_counter()
        compiled(*inputs)
        t1 = time.perf_counter()
        compiled(*inputs)
        t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "import": t_import,
                "capture": sum(spent),
                "capture_cpu": sum(cpu),
                "first": t1 - t0,
                "second": t2 - t1,
            }
        )
    )


def _run(key: str, bare: bool, dynamic: bool) -> dict:
    extra = ["--bare"] * bare + ["--dynamic"] * dynamic
    proc = subprocess.run(
        [sys.executable, __file__, "--child", key, *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{key} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=7, help="fresh processes per workload")
    p.add_argument("--only", default=",".join(WORKLOADS))
    p.add_argument("--profile", metavar="WORKLOAD", help="cProfile one first call, print it")
    p.add_argument(
        "--bare",
        action="store_true",
        help="import only ember, not ember.backend (which imports sympy and torch._refs)",
    )
    p.add_argument("--dynamic", action="store_true", help="compile with dynamic=True")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        _child(a.child, profile=False, bare=a.bare, dynamic=a.dynamic)
        return
    if a.profile:
        _child(a.profile, profile=True, bare=a.bare, dynamic=a.dynamic)
        return
    print(
        f"{'workload':<32} {'capture ms (min-max)':>21} {'cpu ms':>7} {'first call ms':>14}"
        f" {'2nd ms':>7} {'import ms':>10}"
    )
    for key in a.only.split(","):
        runs = [_run(key, a.bare, a.dynamic) for _ in range(a.n)]
        cap = [r["capture"] * 1e3 for r in runs]
        first = statistics.median(r["first"] * 1e3 for r in runs)
        second = statistics.median(r["second"] * 1e3 for r in runs)
        imports = statistics.median(r["import"] * 1e3 for r in runs)
        cpu = statistics.median(r["capture_cpu"] * 1e3 for r in runs)
        spread = f"{statistics.median(cap):.0f} ({min(cap):.0f}-{max(cap):.0f})"
        print(
            f"{WORKLOADS[key]:<32} {spread:>21} {cpu:>7.0f} {first:>14.0f} {second:>7.1f}"
            f" {imports:>10.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
