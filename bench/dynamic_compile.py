"""Compile time of a dynamic graph against its static one, stage by stage (issue 13: <= 1.5x).

Per workload (bench/dynamic.py's rows at their bench size: softmax, layer norm, MLP, the
transformer block, GPT-2 tiny), each round has Dynamo capture the function twice, static
(`dynamic=False`) and with the row's dims marked dynamic, and ember's backend compile each
graph as a first compile: a new cache directory, sympy's cache cleared, the process's GEMM
choices forgotten. Dynamo's capture is not timed. Rounds alternate static and dynamic; a
first round only warms the process up.

Stages: aot (ember/aot: the trace, functionalization, the runtime: the backend call less
the stages below), lowering (to the loop IR, less GEMM timing), gemm choice (timing oneDNN
against torch.mm: in the static compile's lowering; for a dynamic batch at the first call of
a size bucket, counted here too), scheduling, codegen (C++ and wrapper source), g++ (and
loading the library and wrapper). Printed: median seconds per stage, static / dynamic, and
the ratio of the medians; the load average and the CPU share others took.

    .venv/bin/python bench/dynamic_compile.py [--only softmax,MLP] [--repeats 5]
    .venv/bin/python bench/dynamic_compile.py --profile "transformer block" [--static]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import sympy
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamic import _marked, workloads  # noqa: E402
from timing import _cpu_jiffies  # noqa: E402

import ember.backend  # noqa: E402
from ember import config  # noqa: E402
from ember.backend import compile as backend_compile  # noqa: E402
from ember.backend.lowering import gemm  # noqa: E402

ROWS = ("softmax", "layer norm", "MLP", "transformer block", "GPT-2 tiny")
STAGES = {  # compile.py's stage names -> the columns printed
    "graph cache lookup": "cache key",
    "lowering to the loop IR": "lowering",
    "scheduling": "scheduling",
    "C++ generation": "codegen",
    "g++ and loading the kernels": "g++",
    "loading the wrapper": "g++",
}
COLUMNS = ("aot", "cache key", "lowering", "gemm choice", "scheduling", "codegen", "g++")


class GemmTimer:
    """Wraps gemm._onednn_faster (the timed choice between oneDNN and torch.mm) to count the
    seconds spent deciding; `forget` drops the process's decisions."""

    def __init__(self) -> None:
        self.decide = gemm._onednn_faster
        self.seconds = 0.0
        gemm._onednn_faster = self

    def __call__(self, *args):
        start = time.perf_counter()
        try:
            return self.decide(*args)
        finally:
            self.seconds += time.perf_counter() - start

    def forget(self) -> None:
        self.decide.cache_clear()
        gemm._BY_BUCKET.clear()


class StagedBackend:
    """ember's backend, splitting each call's seconds into COLUMNS."""

    def __init__(self, choices: GemmTimer, profiler: cProfile.Profile | None = None) -> None:
        self.choices = choices
        self.profiler = profiler
        self.seconds: Counter[str] = Counter()

    def __call__(self, gm, example_inputs):
        stages0 = Counter(backend_compile.stage_seconds)
        choice0 = self.choices.seconds
        start = time.perf_counter()
        if self.profiler is not None:
            self.profiler.enable()
        try:
            fn = ember.backend(gm, example_inputs)
        finally:
            if self.profiler is not None:
                self.profiler.disable()
        total = time.perf_counter() - start
        staged = Counter(backend_compile.stage_seconds)
        staged.subtract(stages0)
        choice = self.choices.seconds - choice0
        for stage, s in staged.items():
            self.seconds[STAGES.get(stage, stage)] += s
        self.seconds["lowering"] -= choice
        self.seconds["gemm choice"] += choice
        self.seconds["aot"] += total - sum(staged.values())
        return fn


def compile_once(
    fn, args, dims, dynamic: bool, choices: GemmTimer, profiler: cProfile.Profile | None = None
) -> Counter[str]:
    """Seconds per stage of one first compile (and first call) of `fn`; `profiler` profiles
    the backend's calls."""
    torch._dynamo.reset()
    sympy.core.cache.clear_cache()
    choices.forget()
    backend = StagedBackend(choices, profiler)
    compiled = torch.compile(fn, backend=backend, dynamic=None if dynamic else False)
    first = _marked(args, dims) if dynamic else args
    with tempfile.TemporaryDirectory(prefix="ember-bench-compile-") as cache:
        with config.patch(cache_dir=cache), torch.no_grad():
            before = choices.seconds
            compiled(*first)
    seconds = backend.seconds
    seconds["gemm choice"] = choices.seconds - before  # at compile and at the first call
    return seconds


def _own_cpu_s() -> float:
    """CPU seconds of this process and its g++ children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(name: str, repeats: int, choices: GemmTimer) -> dict:
    factory, size, _ = workloads()[name]
    fn, make, dims = factory()
    args = make(size)
    runs: dict[bool, list[Counter[str]]] = {False: [], True: []}
    busy0, total0 = _cpu_jiffies()
    own0 = _own_cpu_s()
    for i in range(repeats + 1):
        for dynamic in (False, True) if i % 2 else (True, False):
            seconds = compile_once(fn, args, dims, dynamic, choices)
            if i:  # round 0 warms up
                runs[dynamic].append(seconds)
    busy1, total1 = _cpu_jiffies()
    hz = os.sysconf("SC_CLK_TCK")
    others = max(0.0, (busy1 - busy0) / hz - (_own_cpu_s() - own0)) / ((total1 - total0) / hz)
    for r in (*runs[False], *runs[True]):
        r["total"] = sum(r[c] for c in COLUMNS)
    out = {}
    for c in (*COLUMNS, "total"):
        static = [r[c] for r in runs[False]]
        dynamic = [r[c] for r in runs[True]]
        # the ratio within each round (static and dynamic compiled back to back, under
        # about the same load), then the median over rounds
        ratios = [d / s for s, d in zip(static, dynamic) if s > 1e-3]
        out[c] = (
            statistics.median(static),
            statistics.median(dynamic),
            statistics.median(ratios) if ratios else None,
        )
    return {"stages": out, "others": others}


def _cell(static: float, dynamic: float, ratio: float | None) -> str:
    return f"{static:.3f} / {dynamic:.3f} ({'-' if ratio is None else f'{ratio:.2f}x'})"


def profile(name: str, dynamic: bool, choices: GemmTimer, top: int) -> None:
    """cProfile of one first compile in ember's backend (Dynamo's capture not profiled)."""
    factory, size, _ = workloads()[name]
    fn, make, dims = factory()
    args = make(size)
    compile_once(fn, args, dims, dynamic, choices)  # warm-up
    prof = cProfile.Profile()
    seconds = compile_once(fn, args, dims, dynamic, choices, prof)
    print(", ".join(f"{c} {seconds[c]:.3f}" for c in COLUMNS))
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated rows (default: all)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", default="", help="profile one row's compile instead")
    ap.add_argument("--static", action="store_true", help="profile the static compile")
    ap.add_argument("--top", type=int, default=40)
    opts = ap.parse_args()
    torch.manual_seed(0)
    choices = GemmTimer()
    warm = torch.compile(lambda x: x + 1, backend=ember.backend)
    warm(torch.randn(3))  # imports (Dynamo, ember's compiler) stay out of the timings
    if opts.profile:
        profile(opts.profile, not opts.static, choices, opts.top)
        return
    rows = opts.only.split(",") if opts.only else ROWS
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {opts.repeats} rounds")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print(
        "\nmedian seconds static / dynamic (median of the rounds' ratios)\n\n| workload | "
        + " | ".join((*COLUMNS, "total"))
        + " | others |\n|"
        + "---|" * (len(COLUMNS) + 3)
    )
    for name in rows:
        r = measure(name, opts.repeats, choices)
        cells = [_cell(*r["stages"][c]) for c in (*COLUMNS, "total")]
        print(f"| {name} | " + " | ".join(cells) + f" | {r['others']:.0%} |", flush=True)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
