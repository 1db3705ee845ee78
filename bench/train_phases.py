"""A training step split per phase (forward, backward, optimizer step), compiled variants of
one sweep model (ember/testing/models.py) in one process, blocks alternated.

    PYTHONPATH=. .venv/bin/python bench/train_phases.py resnet,mobilenet_v2 \\
        [--variants inductor,ember,ember_cl] [--blocks 9] [--steps 10]

Per variant and phase: min / median over blocks of the process CPU time per step (one
thread: what a step costs on a machine other jobs load, BENCHMARKING.md). Variants:
`eager`, `inductor`, `ember`, `ember_cl` (ember compiled under
EMBER_CONV_LAYOUT=channels_last: training graphs traced channels-last, aot/channels_last.py)
and `ember_nchw` (under EMBER_CONV_LAYOUT=eager: every graph in eager's layout).
Which phase trails is what the sweep's one number per row (bench/models.py) cannot say.

Each ember variant's copy of the model gets a forward with its own code object: capture's
cache is keyed by code, and its guards do not tell two copies of one model apart, so a
second `ember.compile` of a copy would otherwise run the first copy's compiled graphs
(before session 17, `ember_cl` listed after `ember` timed ember's NCHW graphs).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ember  # noqa: E402
import ember.backend  # noqa: E402,F401  (the compiler's code, loaded before timing)
from ember import config  # noqa: E402
from ember.testing.models import by_name, loss_of  # noqa: E402

PHASES = ("forward", "backward", "step", "total")


def _variant(base: torch.nn.Module, inputs: dict, name: str) -> Any:
    """(a step function timing its phases) for one compiled copy, warmed up."""
    model = copy.deepcopy(base)
    call = {"eager": model, "inductor": None}.get(name)
    if name == "inductor":
        call = torch.compile(model)
    elif call is None:
        _own_code(model, name)
        call = ember.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    clock = time.process_time

    def step() -> tuple[float, float, float]:
        t0 = clock()
        loss = loss_of(call(**inputs))
        t1 = clock()
        loss.backward()
        t2 = clock()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1, clock() - t2

    layout = {"ember_cl": "channels_last", "ember_nchw": "eager"}.get(
        name, config.current().conv_layout
    )
    with config.patch(conv_layout=layout):  # compiled on the first calls
        for _ in range(3):
            step()
    return step


def _own_code(model: torch.nn.Module, tag: str) -> None:
    """`model.forward` as a function of its own code object (named after `tag`)."""
    f = type(model).forward
    code = f.__code__.replace(co_name=f"{f.__code__.co_name}_{tag}")
    g = types.FunctionType(code, f.__globals__, code.co_name, f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    model.forward = types.MethodType(g, model)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models")
    p.add_argument("--variants", default="inductor,ember")
    p.add_argument("--blocks", type=int, default=9)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    torch.set_num_threads(1)
    for model_name in a.models.split(","):
        base, inputs = by_name(model_name).build()
        base.train(True)
        steps = {v: _variant(base, inputs, v) for v in a.variants.split(",")}
        times: dict[str, dict[str, list[float]]] = {v: {k: [] for k in PHASES} for v in steps}
        for _ in range(a.blocks):
            for v, step in steps.items():
                sums = [0.0, 0.0, 0.0]
                for _ in range(a.steps):
                    sums = [s + t for s, t in zip(sums, step(), strict=True)]
                for k, s in zip(PHASES, [*sums, sum(sums)], strict=True):
                    times[v][k].append(s / a.steps * 1e3)
        for v, by_phase in times.items():
            cells = [f"{k} {min(x):.2f}/{statistics.median(x):.2f}" for k, x in by_phase.items()]
            print(f"{model_name:14} {v:9} " + "  ".join(cells) + "  ms (min/median)", flush=True)


if __name__ == "__main__":
    main()
