"""Autotuning of generated Triton kernels (`mode="max-autotune"`): at a kernel's first launch
in a size bucket, each launch configuration of its tuning space is run and timed on the
device, and the fastest is kept, in memory and on disk.

The tuning space is the kernel plan's (triton_code.KernelWriter.tune_space, printed into the
module as `TUNE_<kernel>`): block sizes the plan allows, num_warps, num_stages; the first is
the default mode's blocks. Trials run on copies of the launch's tensors (aliasing kept: an
in-place kernel reads what it writes), restored before each configuration, so the real
buffers see exactly one launch; each configuration's results are compared with the first's
(a configuration that disagrees beyond reordering noise, or fails to compile, is skipped
with its reason logged). Timing is do_bench-style: warm-up launches, then the median of
several timed launches (CUDA events on a GPU; under Triton's interpreter on the CPU the
clock is the host's and the timings are meaningless, but the mechanism is the same).

The choice is stored at `<cache_dir>/autotune/xx/<key>.json`, keyed by the module's source
and the kernel's name, Triton's version, the device (name and compute capability) and the
size bucket (each integer argument rounded up to a power of two), so a warm process, or a
fresh load of the same graph, launches the stored choice without timing anything.
`EMBER_LOGS=autotune` shows each configuration's time and the choice.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ember import config, logs
from ember.backend.codegen.build import atomic_write

LAUNCH_OPTIONS = ("num_warps", "num_stages")
WARMUP, REPEATS = 2, 7  # launches before timing, timed launches (the median is kept)
stats: Counter[str] = Counter()
"""'timed' (kernels whose configurations were timed), 'disk_hits' (choices read from the
disk cache), 'skipped' (configurations that failed or disagreed), 'in_capture' (first
launches inside a CUDA graph capture, which cannot time and launch the default)."""


def measure(run: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds per launch of `run`: the median of REPEATS timed launches after WARMUP
    untimed ones (CUDA events on a GPU, the host clock elsewhere). Tests replace this
    function to decide which configuration wins."""
    for _ in range(WARMUP):
        run()
    times = []
    if device.type == "cuda":
        for _ in range(REPEATS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bucket(args: tuple) -> tuple[int, ...]:
    """The size bucket of a launch: each integer argument (a size) rounded up to a power of
    two. Static kernels take none: one bucket."""
    return tuple(
        1 << max(0, (a - 1).bit_length())
        for a in args
        if isinstance(a, int) and not isinstance(a, bool)
    )


def cache_key(source: str, name: str, version: str, tag: str, size_bucket: tuple) -> str:
    text = f"{source}\n{name}\n{version}\n{tag}\n{size_bucket}"
    return hashlib.sha256(text.encode()).hexdigest()


def _path(key: str) -> Path:
    return Path(config.current().cache_dir) / "autotune" / key[:2] / f"{key}.json"


def _load_choice(key: str, configs: list[dict]) -> dict | None:
    try:
        data = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return None
    choice = data.get("config") if isinstance(data, dict) else None
    return choice if choice in configs else None  # a stale or foreign entry is a miss


def _store_choice(key: str, choice: dict, timings: list) -> None:
    payload = json.dumps({"config": choice, "timings": timings}, indent=1).encode()
    try:
        atomic_write(_path(key), payload)
    except OSError as e:  # an unwritable cache only costs timing again next time
        logs.log("autotune", "autotune choice not written (%s): %s", _path(key), e)


def _copies(args: tuple) -> tuple[tuple, list[tuple[Any, Any]]]:
    """The launch's arguments with each tensor's storage copied once (tensors sharing a
    storage share the copy), and (original, copy) storage pairs to restore from."""
    copies: dict[int, tuple[Any, Any]] = {}
    out = []
    for a in args:
        if not isinstance(a, torch.Tensor):
            out.append(a)
            continue
        storage = a.untyped_storage()
        pair = copies.setdefault(storage.data_ptr(), (storage, storage.clone()))
        t = torch.empty(0, dtype=a.dtype, device=a.device)
        out.append(t.set_(pair[1], a.storage_offset(), a.size(), a.stride()))
    return tuple(out), list(copies.values())


def _tolerance(dtype: torch.dtype) -> float:
    if dtype in (torch.bfloat16, torch.float16):
        return 1e-2
    return 1e-4 if dtype == torch.float32 else 1e-9


def _disagreement(got: list, want: list) -> str | None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.dtype.is_floating_point:
            tol = _tolerance(g.dtype)
            same = torch.allclose(g, w, rtol=tol, atol=tol, equal_nan=True)
        else:
            same = torch.equal(g, w)
        if not same:
            return f"argument {i} differs from the first configuration's (max diff {_diff(g, w)})"
    return None


def _diff(g: torch.Tensor, w: torch.Tensor) -> float:
    finite = torch.isfinite(g) & torch.isfinite(w)
    return float((g.double() - w.double())[finite].abs().max()) if finite.any() else float("nan")


def _split(cfg: dict) -> tuple[dict, dict]:
    """(constexpr block sizes, launch options) of a configuration."""
    return (
        {k: v for k, v in cfg.items() if k not in LAUNCH_OPTIONS},
        {k: v for k, v in cfg.items() if k in LAUNCH_OPTIONS},
    )


class Autotuned:
    """A generated kernel launched with its tuned configuration: `kernel[grid](*args,
    **blocks)` like the plain kernel (the wrapper's blocks are the default ones and are
    replaced by the choice for the launch's size bucket)."""

    def __init__(
        self, kernel: Any, name: str, source: str, configs: list[dict], device: torch.device
    ) -> None:
        from ember.backend.codegen import triton_runtime  # the loader imports this module

        self.kernel, self.name, self.source, self.configs = kernel, name, source, configs
        self.device = device
        self.version, self.tag = triton_runtime.version(), triton_runtime.device_tag(device)
        self.chosen: dict[tuple, dict] = {}  # size bucket -> configuration

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **blocks: int) -> Any:
            size_bucket = bucket(args)
            cfg = self.chosen.get(size_bucket)
            if cfg is None:
                cfg = self.chosen[size_bucket] = self._choose(grid, args, size_bucket)
            consts, options = _split(cfg)
            return self.kernel[grid](*args, **consts, **options)

        return launch

    def _choose(self, grid: Any, args: tuple, size_bucket: tuple) -> dict:
        key = cache_key(self.source, self.name, self.version, self.tag, size_bucket)
        cached = _load_choice(key, self.configs)
        if cached is not None:
            stats["disk_hits"] += 1
            logs.log("autotune", "%s %s: %s (from the disk cache)", self.name, size_bucket, cached)
            return cached
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            stats["in_capture"] += 1  # a recording cannot time: launch the default
            logs.log("autotune", "%s: first launch inside a CUDA graph capture", self.name)
            return self.configs[0]
        return self._time(grid, args, size_bucket, key)

    def _run(self, grid: Any, args: tuple, cfg: dict) -> None:
        consts, options = _split(cfg)
        self.kernel[grid](*args, **consts, **options)

    def _time(self, grid: Any, args: tuple, size_bucket: tuple, key: str) -> dict:
        trial, storages = _copies(args)
        tensors = [a for a in trial if isinstance(a, torch.Tensor)]
        first: list | None = None
        timings: list[tuple[float, dict]] = []
        for cfg in self.configs:
            for original, copy in storages:
                copy.copy_(original)
            try:
                self._run(grid, trial, cfg)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            except Exception as e:  # e.g. out of shared memory / registers at this size
                stats["skipped"] += 1
                logs.log("autotune", "%s: %s skipped: %s: %s", self.name, cfg, type(e).__name__, e)
                continue
            result = [t.clone() for t in tensors]
            why = _disagreement(result, first) if first is not None else None
            if why is not None:
                stats["skipped"] += 1
                logs.log("autotune", "%s: %s skipped: %s", self.name, cfg, why)
                continue
            first = first if first is not None else result
            ms = measure(lambda cfg=cfg: self._run(grid, trial, cfg), self.device)
            timings.append((ms, cfg))
        stats["timed"] += 1
        if not timings:
            logs.log("autotune", "%s: no configuration ran; launching the default", self.name)
            return self.configs[0]
        best = min(timings, key=lambda t: t[0])[1]
        if logs.enabled("autotune"):
            table = "\n".join(
                f"  {ms:9.4f} ms  {cfg}{'  <- chosen' if cfg is best else ''}"
                for ms, cfg in timings
            )
            logs.log("autotune", "%s %s on %s:\n%s", self.name, size_bucket, self.tag, table)
        _store_choice(key, best, [[ms, cfg] for ms, cfg in timings])
        return best


def tune(kernels: dict[str, Any], module: Any, source: str, device: torch.device) -> dict[str, Any]:
    """The module's kernels, each autotuned over its `TUNE_<name>` space (a kernel without
    one, or with a single configuration, is launched as it is)."""
    out = {}
    for name, kernel in kernels.items():
        configs = getattr(module, f"TUNE_{name}", None)
        tunable = isinstance(configs, list) and len(configs) > 1
        out[name] = Autotuned(kernel, name, source, configs, device) if tunable else kernel
    return out
