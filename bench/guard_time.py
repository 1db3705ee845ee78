"""Per-call guard time: how long ember and torch.compile spend deciding that a cached graph
can be reused, on tiny random transformers models (ember/testing/models.py), inference.

Both compile with backend "eager" (the guards do not depend on the backend) and run the
model once under `torch.no_grad()` (capture) and once more (the cached path). Then:

- ember: every `FrameCache.lookup` or `find` (a module class's compiled forward) a cached
  call makes (the top-level forward's and those of any resume or nested function) is
  recorded with its arguments during one call; these lookups are then replayed in a loop.
  That is the whole of ember's guard evaluation: the generated check function of the entry
  that matches (and of any tried before it).
- Dynamo: the cache entries of the model's `forward` code (`_debug_get_cache_entry_list`);
  the locals the frame would have are made by binding the call's arguments to `forward`'s
  signature (defaults applied) and adding its closure's cells, and the root guard
  manager's `check(f_locals)` of the first entry that holds (and of those before it) is
  timed the same way. This leaves out what Dynamo's C frame hook does around the check
  (building the locals, the cache walk), a little in Dynamo's favour, and covers only
  `forward`'s frame: models on which Dynamo breaks the graph have more guards than this
  counts ("Dynamo frames": how many frames it compiled for the first calls).

Timing: `--repeats` (default 7) rounds, ember's and Dynamo's interleaved, each timing
`--number` calls (default 2000), by this thread's CPU time (time.thread_time_ns: steadier
than the wall clock on a loaded machine); the median round is reported, in microseconds
per call.

    EMBER_CACHE_DIR=/tmp/x .venv/bin/python bench/guard_time.py [--only bert,gpt2]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ember  # noqa: E402
from ember.capture import cache as frame_cache  # noqa: E402
from ember.testing.models import by_name  # noqa: E402

MODELS = ("bert", "gpt2", "llama", "t5", "whisper")


def _rounds(fn: Callable[[], Any], number: int) -> float:
    """The time per call of `fn()` over `number` calls, in microseconds."""
    start = time.thread_time_ns()
    for _ in range(number):
        fn()
    return (time.thread_time_ns() - start) / number / 1000


def ember_guards(name: str) -> tuple[Callable[[], Any], int]:
    """A function doing the cache lookups of one cached call of the ember-compiled model,
    and how many there are."""
    model, inputs = by_name(name).build()
    model.eval()
    compiled = ember.compile(model, backend="eager")
    with torch.no_grad():
        compiled(**inputs)
        compiled(**inputs)
    # plain functions look up with `lookup(args, kwargs)`; the compiled forward of a module
    # class (a closure's wrapper) with `find(matches)`, its guard bound to the call
    recorded: list[tuple[Callable[..., Any], tuple]] = []
    cache_class = frame_cache.FrameCache
    originals = {name: getattr(cache_class, name) for name in ("lookup", "find")}

    def recording(name: str) -> Callable[..., Any]:
        original = originals[name]

        def method(self: Any, *args: Any) -> Any:
            if not recording_depth:
                recorded.append((functools.partial(original, self), args))
            recording_depth.append(1)
            try:
                return original(self, *args)
            finally:
                recording_depth.pop()

        return method

    recording_depth: list[int] = []
    for name in originals:
        setattr(cache_class, name, recording(name))
    try:
        with torch.no_grad():
            compiled(**inputs)
    finally:
        for name, original in originals.items():
            setattr(cache_class, name, original)
    with torch.no_grad():
        for call, args in recorded:
            assert call(*args) is not None, "a cached call missed"

    def lookups() -> None:
        for call, args in recorded:
            call(*args)

    lookups.keep = (model, compiled)  # type: ignore[attr-defined]
    return lookups, len(recorded)


def dynamo_guards(name: str) -> tuple[Callable[[], Any], int]:
    """A function running the guard checks of the torch.compile'd model's forward frame up
    to the entry that holds, and how many frames Dynamo compiled for one call."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model, inputs = by_name(name).build()
    model.eval()
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        compiled(**inputs)
        compiled(**inputs)
    frames = int(torch._dynamo.utils.counters["frames"]["ok"])
    forward = type(model).forward  # transformers' decorators: a wrapper closure
    bound = inspect.signature(forward, follow_wrapped=False).bind(model, **inputs)
    bound.apply_defaults()
    f_locals = dict(bound.arguments)  # a **kwargs parameter is a local holding a dict
    cells = zip(forward.__code__.co_freevars, forward.__closure__ or (), strict=True)
    f_locals.update((var, cell.cell_contents) for var, cell in cells)
    managers = []
    with torch.no_grad():
        for entry in _debug_get_cache_entry_list(forward.__code__):
            managers.append(entry.guard_manager.root)
            if entry.guard_manager.check(f_locals):
                break
        else:
            raise AssertionError(f"no Dynamo cache entry of {name}.forward holds")

    def check() -> None:
        for manager in managers:
            if manager.check(f_locals):
                return

    check.keep = (model, compiled)  # type: ignore[attr-defined]
    return check, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(MODELS))
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.only.split(","):
        ours, lookups = ember_guards(name)
        theirs, frames = dynamo_guards(name)
        times: tuple[list[float], list[float]] = ([], [])
        with torch.no_grad():
            for _ in range(args.repeats):  # interleaved: both see the same machine load
                times[0].append(_rounds(ours, args.number))
                times[1].append(_rounds(theirs, args.number))
        ember.reset()
        torch._dynamo.reset()
        e, d = statistics.median(times[0]), statistics.median(times[1])
        rows.append((name, e, lookups, d, frames))
        print(f"{name}: ember {e:.1f} us ({lookups} lookups), Dynamo {d:.1f} us", flush=True)
    print()
    print("| model | ember (us/call) | ember lookups | Dynamo forward (us/call) | Dynamo frames |")
    print("|---|---|---|---|---|")
    for name, e, lookups, d, frames in rows:
        print(f"| {name} | {e:.1f} | {lookups} | {d:.1f} | {frames} |")


if __name__ == "__main__":
    main()
