"""Where a compiled training step spends its time: each kernel and extern call of ember's
generated wrappers, timed inside the step (not a speed comparison: see training.py).

Wraps every `_kernelN` (ctypes) and `_opN` (torch library or fallback call) of each wrapper
ember.backend instantiates with a timer, runs forward + backward of one workload of
bench/training.py, and prints milliseconds per step, largest first, per graph (g0 is the
forward, g1.. the backward). The rest of the step is Python, autograd and allocation.

    .venv/bin/python bench/kernel_times.py [transformer|mlp] [--steps 20]
    .venv/bin/python bench/kernel_times.py resnet [--infer] [--threads 1]   # convnets.py's
    .venv/bin/python bench/kernel_times.py --model mobilenet_v2 [--infer] [--source]
        # a model of the real-model sweep (ember/testing/models.py), under ember.compile;
        # --source prints each instantiated wrapper

Times are the process's CPU time (`time.process_time`), so use --threads 1: on a loaded
machine wall-clock per call moves more than the differences looked for.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from typing import Any

_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "17179869184"}
if __name__ == "__main__" and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_MALLOC})

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from convnets import CONVNETS, workload  # noqa: E402
from training import WORKLOADS  # noqa: E402

import ember.backend  # noqa: E402
from ember.backend.codegen import wrapper  # noqa: E402

SPENT: dict[str, float] = collections.defaultdict(float)
WHAT: dict[str, str] = {}
SOURCES: list[str] = []
_clock = time.perf_counter


def _timed(key: str, fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = _clock()
        out = fn(*args, **kwargs)
        SPENT[key] += _clock() - start
        return out

    return call


def _instrumented(instantiate: Any) -> Any:
    graphs = iter(range(1 << 30))

    def instantiate_timed(source: str, kernels: dict, constants: dict, device=None) -> Any:
        g = next(graphs)
        SOURCES.append(source)
        timed = {name: _timed(f"g{g}:{name}", fn) for name, fn in kernels.items()}
        call = instantiate(source, timed, constants, device)
        scope = call.__globals__  # the extern ops are globals of the generated source
        for name in [n for n in scope if n.startswith("_op")]:
            key = f"g{g}:{name[1:]}"
            WHAT[key] = getattr(scope[name], "__name__", str(scope[name]))
            scope[name] = _timed(key, scope[name])
        return call

    return instantiate_timed


def main() -> None:
    p = argparse.ArgumentParser()
    names = sorted(WORKLOADS) + sorted(CONVNETS)
    p.add_argument("workload", nargs="?", default="transformer", choices=names)
    p.add_argument("--model", default="", help="a case of ember/testing/models.py instead")
    p.add_argument("--source", action="store_true", help="print the wrappers")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--infer", action="store_true", help="eval-mode forward under no_grad")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    wrapper.instantiate = _instrumented(wrapper.instantiate)
    torch.manual_seed(0)
    if a.model:
        step, name = _model_step(a.model, a.infer), a.model
    else:
        step, name = _workload_step(a.workload, a.infer), a.workload
    for _ in range(3):
        step()
    SPENT.clear()
    global _clock
    _clock = time.process_time if a.threads == 1 else time.perf_counter
    start = _clock()
    for _ in range(a.steps):
        step()
    total = (_clock() - start) / a.steps * 1e3
    inside = sum(SPENT.values()) / a.steps * 1e3
    what = "forward" if a.infer else "forward + backward"
    print(f"{name}: {what} {total:.3f} ms per step, {inside:.3f} ms in calls")
    for key, sec in sorted(SPENT.items(), key=lambda kv: -kv[1]):
        print(f"{key:14} {sec / a.steps * 1e3:8.3f} ms  {WHAT.get(key, 'kernel')}")
    if a.source:
        for i, src in enumerate(SOURCES):
            print(f"# ---- wrapper g{i}\n{src}")


def _workload_step(name: str, infer: bool) -> Any:
    if name in CONVNETS:
        model, inputs, returns_loss = workload(name)
    else:
        factory, shape = WORKLOADS[name]
        model, inputs, returns_loss = factory(), (torch.randn(shape),), False
    model.train(not infer)
    compiled = torch.compile(model, backend=ember.backend.compile_graph, dynamic=False)

    def step() -> None:
        if infer:
            with torch.no_grad():
                compiled(*inputs)
        else:
            out = compiled(*inputs)
            (out if returns_loss else out.square().mean()).backward()

    return step


def _model_step(name: str, infer: bool) -> Any:
    from ember.testing.models import by_name, loss_of

    model, inputs = by_name(name).build()
    model.train(not infer)
    compiled = ember.compile(model)

    def step() -> None:
        if infer:
            with torch.no_grad():
                compiled(**inputs)
        else:
            loss_of(compiled(**inputs)).backward()

    return step


if __name__ == "__main__":
    main()
