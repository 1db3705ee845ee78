"""The real-model sweep: ember against eager and torch.compile on tiny random transformers
models (ember/testing/models.py), inference and one training step.

Per model and mode: ember's graphs and breaks (ember.explain) beside Dynamo's on the same call
(torch._dynamo.explain), break reasons, and correctness of `ember.compile(model)` (backend
"ember") against eager, with the graphs its backend gave up on (run as aten ops): outputs,
and in training the loss, every parameter's gradient and the parameters after an SGD step.
With --speed, steady-state time of eager, Inductor and ember in one process (interleaved
blocks, medians, BENCHMARKING.md) and the ratios; with --first-call, the first call in fresh
processes with cold and warm caches.

    .venv/bin/python bench/models.py [--only bert,gpt2] [--modes infer,train] [--speed]
        [--first-call] [--threads 1] [--clock cpu] [--json out.json]

With --speed it ends with a markdown table (the README's): per row the steady-state time of
eager, and Inductor's and ember's speedups over it; with --first-call, the first call (first
training step) cold and warm. `--clock cpu` times the process's CPU time per call (with one
thread, what a call costs on a machine other jobs load; wall-clock medians there move 10%).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from timing import block, calls_per_block  # noqa: E402

import ember  # noqa: E402
from ember.backend.compile import stats as backend_stats  # noqa: E402
from ember.testing.models import CASES, by_name, loss_of, outputs  # noqa: E402


def _run(model: torch.nn.Module, inputs: dict, train: bool) -> Any:
    if not train:
        with torch.no_grad():
            return model(**inputs)
    return model(**inputs)


def _step(model: torch.nn.Module, inputs: dict, opt: torch.optim.Optimizer) -> torch.Tensor:
    loss = loss_of(model(**inputs))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _max_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape or g.dtype != w.dtype:
            return math.inf
        scale = max(1.0, w.abs().max().item()) if w.numel() else 1.0
        worst = max(worst, (g - w).abs().max().item() / scale if w.numel() else 0.0)
    return worst


def counts(case_name: str, train: bool) -> dict:
    """Graphs and breaks of one call under ember's capture and under Dynamo's."""
    case = by_name(case_name)
    model, inputs = case.build()
    model.train(train)
    ours = ember.explain(model)(**inputs) if train else _no_grad(ember.explain(model), inputs)
    torch._dynamo.reset()
    theirs = (
        torch._dynamo.explain(model)(**inputs)
        if train
        else _no_grad(torch._dynamo.explain(model), inputs)
    )
    return {
        "ember_graphs": ours.graph_count,
        "ember_breaks": ours.graph_break_count,
        "ember_reasons": sorted({str(r).splitlines()[0] for r in ours.break_reasons}),
        "dynamo_graphs": theirs.graph_count,
        "dynamo_breaks": theirs.graph_break_count,
    }


def _no_grad(fn, inputs):
    with torch.no_grad():
        return fn(**inputs)


def correctness(case_name: str, train: bool) -> float:
    """Largest difference (relative to the value's scale) of ember.compile against eager:
    outputs; in training also gradients and the parameters after one SGD step."""
    case = by_name(case_name)
    model, inputs = case.build()
    model.train(train)
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin)
    if not train:
        return _max_diff(
            outputs(_run(compiled, inputs, False)), outputs(_run(model, inputs, False))
        )
    got, want = [], []
    for m, run in ((model, model), (twin, compiled)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch.manual_seed(0)  # the same random draws for both, should anything draw
        result = run(**inputs)
        loss_of(result).backward()
        grads = [p.grad.clone() for p in m.parameters() if p.grad is not None]
        opt.step()
        params = [p.detach().clone() for p in m.parameters()]
        (want if m is model else got).extend([*outputs(result), *grads, *params])
    return _max_diff([t.detach() for t in got], [t.detach() for t in want])


def speed(case_name: str, train: bool, blocks: int, block_s: float, clock: str) -> dict:
    """Steady-state speedups over eager of Inductor and ember.compile, one process, with
    eager's own time per call (`clock`: timing.block's key, wall or CPU time)."""
    case = by_name(case_name)
    base, inputs = case.build()
    base.train(train)
    variants = {"eager": base, "inductor": None, "ember": None}
    runners = {}
    for name in variants:
        model = copy.deepcopy(base)
        call = {"eager": model, "inductor": None, "ember": None}[name]
        if name == "inductor":
            call = torch.compile(model)
        elif name == "ember":
            call = ember.compile(model)
        if train:
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)
            runners[name] = lambda c=call, o=opt: _step(c, inputs, o)
        else:
            runners[name] = lambda c=call: _run(c, inputs, False)
        runners[name]()  # compile
        runners[name]()
    n = calls_per_block(runners["eager"], (), block_s)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(blocks):
        for k, fn in runners.items():
            times[k].append(block(fn, (), n)[clock])
    eager = statistics.median(times["eager"])
    out = {f"{k}_x": eager / statistics.median(v) for k, v in times.items() if k != "eager"}
    return out | {"eager_ms": eager * 1e3}


FIRST = """
import sys, time, torch
torch.set_num_threads({threads!r})
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
import ember
from ember.testing.models import by_name, loss_of
model, inputs = by_name({name!r}).build()
model.train({train!r})
compiled = torch.compile(model) if {variant!r} == "inductor" else ember.compile(model)
t1 = time.perf_counter()
if {train!r}:
    loss_of(compiled(**inputs)).backward()
else:
    with torch.no_grad():
        compiled(**inputs)
print(time.perf_counter() - t1)
"""


def first_call(case_name: str, train: bool, threads: int) -> dict:
    """First call (compile and run) in fresh processes: cold caches, then warm."""
    out = {}
    for variant in ("inductor", "ember"):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, EMBER_CACHE_DIR=d, TORCHINDUCTOR_CACHE_DIR=d)
            script = FIRST.format(
                root=str(ROOT), name=case_name, train=train, variant=variant, threads=threads
            )
            for temp in ("cold", "warm"):
                p = subprocess.run(
                    [sys.executable, "-c", script], env=env, capture_output=True, text=True
                )
                last = p.stdout.strip().splitlines()[-1:] or ["nan"]
                out[f"{variant}_{temp}_s"] = float(last[0]) if p.returncode == 0 else math.nan
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--speed", action="store_true")
    p.add_argument("--first-call", action="store_true")
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--block-s", type=float, default=0.2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--json", default="")
    args = p.parse_args()
    clock = "per_call" if args.clock == "wall" else "cpu_per_call"
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.clock} clock", flush=True)
    torch._dynamo.config.cache_size_limit = 64
    names = args.only.split(",") if args.only else [c.name for c in CASES]
    rows = []
    for name in names:
        for mode in args.modes.split(","):
            train = mode == "train"
            row: dict[str, Any] = {"model": name, "mode": mode}
            start = time.perf_counter()
            try:
                row |= counts(name, train)
                before = backend_stats["graph_fallbacks"]
                row["max_diff"] = correctness(name, train)
                row["fallbacks"] = backend_stats["graph_fallbacks"] - before
                if args.speed:
                    row |= speed(name, train, args.blocks, args.block_s, clock)
                if args.first_call:
                    row |= first_call(name, train, args.threads)
            except Exception as e:  # noqa: BLE001  (a sweep reports failures, it does not stop)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            row["sweep_s"] = round(time.perf_counter() - start, 1)
            rows.append(row)
            print(_line(row), flush=True)
            ember.reset()
            torch._dynamo.reset()
    _summary(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _line(row: dict) -> str:
    if "error" in row and "ember_graphs" not in row:
        return f"{row['model']:13} {row['mode']:5} ERROR {row['error']}"
    text = (
        f"{row['model']:13} {row['mode']:5} ember {row['ember_graphs']}g/{row['ember_breaks']}b"
        f"  dynamo {row['dynamo_graphs']}g/{row['dynamo_breaks']}b"
        f"  diff {row.get('max_diff', math.nan):.2g}"
    )
    if row.get("fallbacks"):  # graphs the backend gave up on (run as aten ops)
        text += f"  BACKEND FALLBACKS {row['fallbacks']}"
    for key in ("inductor_x", "ember_x", "inductor_cold_s", "ember_cold_s"):
        if key in row:
            text += f"  {key} {row[key]:.2f}"
    if row.get("error"):
        text += f"  ERROR {row['error']}"
    if row.get("ember_reasons"):
        text += "\n      " + "\n      ".join(row["ember_reasons"][:4])
    return text


def _summary(rows: list[dict]) -> None:
    worse = [r for r in rows if r.get("ember_graphs", 0) > r.get("dynamo_graphs", 0)]
    wrong = [r for r in rows if not r.get("max_diff", math.inf) <= 1e-4]
    fell_back = [(r["model"], r["mode"]) for r in rows if r.get("fallbacks")]
    print(f"\n{len(rows)} rows; more graphs than Dynamo: {[r['model'] for r in worse]}")
    print(f"not matching eager (or failed): {[(r['model'], r['mode']) for r in wrong]}")
    print(f"graphs the backend ran as aten ops (EMBER_LOGS=kernels says why): {fell_back}")
    timed = [r for r in rows if "ember_x" in r]
    if timed:
        _speed_table(timed)


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(map(math.log, values)))


def _speed_table(rows: list[dict]) -> None:
    """The README's table: speedups over eager, ember over Inductor, first calls."""
    first = any("ember_cold_s" in r for r in rows)
    head = "| model | mode | graphs ember / Dynamo | eager | Inductor | ember | ember / Inductor |"
    if first:
        head += " first call cold: Inductor, ember (ratio) | warm: Inductor, ember |"
    print("\n" + head + "\n" + "|---" * (head.count("|") - 1) + "|")
    for r in rows:
        line = (
            f"| {r['model']} | {r['mode']} | {r['ember_graphs']} / {r['dynamo_graphs']} "
            f"| {r['eager_ms']:.2f} ms | {r['inductor_x']:.2f}x | {r['ember_x']:.2f}x "
            f"| {r['ember_x'] / r['inductor_x']:.2f}x |"
        )
        if first:
            ic, ec, iw, ew = (r.get(f"{v}_s", math.nan) for v in _FIRST_KEYS)
            line += f" {ic:.1f} s, {ec:.2f} s ({ic / ec:.0f}x) | {iw:.1f} s, {ew:.2f} s |"
        print(line)
    ratios = [r["ember_x"] / r["inductor_x"] for r in rows]
    print(
        f"geomean over {len(rows)} rows: Inductor {_geomean([r['inductor_x'] for r in rows]):.2f}x"
        f" eager, ember {_geomean([r['ember_x'] for r in rows]):.2f}x eager,"
        f" ember / Inductor {_geomean(ratios):.2f}x; rows where ember is slower than Inductor:"
        f" {[(r['model'], r['mode']) for r, x in zip(rows, ratios, strict=True) if x < 1]}"
    )


_FIRST_KEYS = ("inductor_cold", "ember_cold", "inductor_warm", "ember_warm")


if __name__ == "__main__":
    main()
