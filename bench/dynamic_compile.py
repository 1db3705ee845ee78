"""Compile time of a dynamic graph against its static one, stage by stage (issue 13: <= 1.5x).

Per workload (bench/dynamic.py's rows at their bench size: softmax, layer norm, MLP, the
transformer block, GPT-2 tiny), each round has Dynamo capture the function twice, static
(`dynamic=False`) and with the row's dims marked dynamic, and ember's backend compile each
graph as a first compile: a new cache directory, sympy's and ember's in-memory caches
cleared, the process's GEMM choices forgotten. Dynamo's capture is not timed. Rounds
alternate which variant goes first; a first round only warms the process up.

Stages: aot (ember/aot: the trace, functionalization, the runtime: the backend call less
the stages below), cache key, lowering (to the loop IR, less GEMM timing), gemm choice
(timing oneDNN against torch.mm: in the static compile's lowering; for a dynamic batch at
the first call of its size bucket, counted here too), scheduling, codegen (C++ and wrapper
source), g++ (and loading the library and the wrapper).

Printed per stage: median CPU seconds (this process and its g++ processes: steadier than
wall time on a shared machine) static / dynamic, and the median over rounds of each round's
ratio; then the same for the total, and the total less the GEMM choice (the same timing in
both, which hides the rest where it dominates), in CPU and in wall seconds; the load
average and the share of the CPUs others took.

    .venv/bin/python bench/dynamic_compile.py [--only softmax,MLP] [--repeats 7]
    .venv/bin/python bench/dynamic_compile.py --profile "transformer block" [--static]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
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
from ember.aot import symbolic_meta  # noqa: E402
from ember.backend import compile as backend_compile  # noqa: E402
from ember.backend import indexing  # noqa: E402
from ember.backend.compile import cpu_seconds  # noqa: E402
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
# what a process remembers across compiles (forgotten before each: every compile a first)
CACHES = (
    indexing._simplified,
    indexing._below,
    symbolic_meta._result_dtype,
    symbolic_meta._contiguity,
)
COLUMNS = ("aot", "cache key", "lowering", "gemm choice", "scheduling", "codegen", "g++")


def _clock() -> Counter[str]:
    return Counter(wall=time.perf_counter(), cpu=cpu_seconds())


class GemmTimer:
    """Wraps gemm._onednn_faster (the timed choice between oneDNN and torch.mm) to count the
    seconds spent deciding; `forget` drops the process's decisions."""

    def __init__(self) -> None:
        self.decide = gemm._onednn_faster
        self.spent: Counter[str] = Counter()
        gemm._onednn_faster = self

    def __call__(self, *args):
        start = _clock()
        try:
            return self.decide(*args)
        finally:
            self.spent.update(_clock() - start)

    def forget(self) -> None:
        self.decide.cache_clear()
        gemm._BY_BUCKET.clear()


class StagedBackend:
    """ember's backend, splitting each call's wall and CPU seconds into COLUMNS."""

    def __init__(self, choices: GemmTimer, profiler: cProfile.Profile | None = None) -> None:
        self.choices = choices
        self.profiler = profiler
        self.seconds = {"wall": Counter(), "cpu": Counter()}

    def __call__(self, gm, example_inputs):
        before = {"wall": Counter(backend_compile.stage_seconds)}
        before["cpu"] = Counter(backend_compile.stage_cpu_seconds)
        choice0, start = Counter(self.choices.spent), _clock()
        if self.profiler is not None:
            self.profiler.enable()
        try:
            fn = ember.backend(gm, example_inputs)
        finally:
            if self.profiler is not None:
                self.profiler.disable()
        total = _clock() - start
        after = {"wall": backend_compile.stage_seconds, "cpu": backend_compile.stage_cpu_seconds}
        for clock, seconds in self.seconds.items():
            staged = Counter(after[clock])
            staged.subtract(before[clock])
            for stage, s in staged.items():
                seconds[STAGES.get(stage, stage)] += s
            choice = self.choices.spent[clock] - choice0[clock]
            seconds["lowering"] -= choice
            seconds["aot"] += total[clock] - sum(staged.values())
        return fn


def compile_once(
    fn, args, dims, dynamic: bool, choices: GemmTimer, profiler: cProfile.Profile | None = None
) -> dict[str, Counter[str]]:
    """Wall and CPU seconds per stage of one first compile (and first call) of `fn`;
    `profiler` profiles the backend's calls."""
    torch._dynamo.reset()
    sympy.core.cache.clear_cache()
    for cache in CACHES:
        cache.cache_clear()
    choices.forget()
    backend = StagedBackend(choices, profiler)
    compiled = torch.compile(fn, backend=backend, dynamic=None if dynamic else False)
    first = _marked(args, dims) if dynamic else args
    with tempfile.TemporaryDirectory(prefix="ember-bench-compile-") as cache:
        with config.patch(cache_dir=cache, background_build=False), torch.no_grad():
            before = Counter(choices.spent)
            compiled(*first)
    for clock, seconds in backend.seconds.items():
        # at compile (static) and at the first call (a dynamic batch's bucket)
        seconds["gemm choice"] = choices.spent[clock] - before[clock]
        seconds["total"] = sum(seconds[c] for c in COLUMNS)
        seconds["less gemm"] = seconds["total"] - seconds["gemm choice"]
    return backend.seconds


def _cell(static: list[float], dynamic: list[float]) -> str:
    """Medians static / dynamic, and the median of the rounds' ratios (static and dynamic
    of a round compiled back to back, under about the same load)."""
    ratios = [d / s for s, d in zip(static, dynamic) if s > 1e-3]
    ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
    return f"{statistics.median(static):.3f} / {statistics.median(dynamic):.3f} ({ratio})"


def measure(name: str, repeats: int, choices: GemmTimer) -> str:
    """One table row: the workload's compiles, `repeats` rounds after a warm-up round."""
    factory, size, _ = workloads()[name]
    fn, make, dims = factory()
    args = make(size)
    runs: dict[bool, list[dict[str, Counter[str]]]] = {False: [], True: []}
    busy0, total0 = _cpu_jiffies()
    own0 = cpu_seconds()
    for i in range(repeats + 1):
        for dynamic in (False, True) if i % 2 else (True, False):
            seconds = compile_once(fn, args, dims, dynamic, choices)
            if i:
                runs[dynamic].append(seconds)
    busy1, total1 = _cpu_jiffies()
    hz = os.sysconf("SC_CLK_TCK")
    others = max(0.0, (busy1 - busy0) / hz - (cpu_seconds() - own0)) / ((total1 - total0) / hz)
    cells = [
        _cell([r[clock][c] for r in runs[False]], [r[clock][c] for r in runs[True]])
        for clock, c in [("cpu", c) for c in (*COLUMNS, "total", "less gemm")]
        + [("wall", "total"), ("wall", "less gemm")]
    ]
    return f"| {name} | " + " | ".join(cells) + f" | {others:.0%} |"


def profile(name: str, dynamic: bool, choices: GemmTimer, top: int) -> None:
    """cProfile of one first compile in ember's backend (Dynamo's capture not profiled)."""
    factory, size, _ = workloads()[name]
    fn, make, dims = factory()
    args = make(size)
    compile_once(fn, args, dims, dynamic, choices)  # warm-up
    prof = cProfile.Profile()
    seconds = compile_once(fn, args, dims, dynamic, choices, prof)
    print(", ".join(f"{c} {seconds['cpu'][c]:.3f}" for c in (*COLUMNS, "total")), "(CPU s)")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated rows (default: all)")
    ap.add_argument("--repeats", type=int, default=7)
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
    header = [f"{c} (CPU s)" for c in (*COLUMNS, "total", "total less gemm choice")]
    header += ["total (wall s)", "total less gemm choice (wall s)", "others"]
    print("\nmedian seconds static / dynamic (median of the rounds' ratios)\n")
    print("| workload | " + " | ".join(header) + " |\n|" + "---|" * (len(header) + 1))
    for name in rows:
        print(measure(name, opts.repeats, choices), flush=True)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
