"""Timing helpers shared by the backend benchmarks: blocks with CPU-contention records,
and the triad bandwidth ceiling (see ../shared/BENCHMARKING.md)."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence

import torch


def _cpu_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:9]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def block(fn: Callable, inputs: Sequence, n: int) -> dict:
    """Time n calls: seconds per call, share of CPUs used by others, page faults per call."""
    busy0, total0 = _cpu_jiffies()
    own0 = _own_cpu_s()
    flt0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    for _ in range(n):
        fn(*inputs)
    elapsed = time.perf_counter() - start
    flt1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    own1 = _own_cpu_s()
    busy1, total1 = _cpu_jiffies()
    hz = os.sysconf("SC_CLK_TCK")
    total_s = (total1 - total0) / hz
    others = max(0.0, (busy1 - busy0) / hz - (own1 - own0))
    return {
        "per_call": elapsed / n,
        "cpu_per_call": (own1 - own0) / n,
        "others": others / total_s if total_s > 0 else 0.0,
        "faults": (flt1 - flt0) / n,
    }


def calls_per_block(fn: Callable, inputs: Sequence, block_s: float) -> int:
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn(*inputs)
        elapsed = time.perf_counter() - start
        if elapsed > block_s / 4:
            return max(1, int(n * block_s / elapsed))
        n *= 4


def triad_gbs(mib: int = 128, reps: int = 10) -> float:
    """a = b + s * c over `mib` MiB arrays with torch's threads; best of `reps`, in GB/s."""
    n = mib * (1 << 20) // 4
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        best = min(best, time.perf_counter() - start)
    return 3 * n * 4 / best / 1e9
