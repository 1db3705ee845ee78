"""The harness of the fidelity tests (issue 12): a program runs eagerly and under
`ember.compile` on fresh copies of the same inputs, twice; the results (values, types, and
which results are the very objects passed in), the arguments afterwards, outside state and
what was printed must agree. Then the same program runs under `torch.compile` with a counting
backend, and ember must capture no less of it: no more frames left to run eagerly than
Dynamo skips, and where Dynamo captured every frame, no more graphs and no more graph breaks;
where it skipped some, at least as many ops in graphs."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
from collections.abc import Callable
from typing import Any

import torch

import ember
from ember.testing import CompileCounter, CountingBackend, assert_same


@dataclasses.dataclass(frozen=True)
class Counts:
    graphs: int
    breaks: int
    ops: int
    eager_frames: int = 0


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flat(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _flat(item)]
    return [value]


def _identities(result: Any, args: tuple) -> list[int | None]:
    """For each leaf of the result, the position of the argument leaf it *is* (or None):
    `return x.add_(1)` must hand back the caller's own tensor."""
    inputs = _flat(args)
    found = []
    for leaf in _flat(result):
        position = next((i for i, a in enumerate(inputs) if a is leaf), None)
        found.append(position if not isinstance(leaf, (int, float, str, bool)) else None)
    return found


def _run(fn: Callable[..., Any], make: Callable[[], tuple], state, reset) -> tuple:
    if reset is not None:
        reset()
    args = make()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = fn(*args)
    after = copy.deepcopy(state()) if state is not None else None
    return result, args, after, out.getvalue(), _identities(result, args)


def dynamo_counts(fn: Callable[..., Any], make: Callable[[], tuple], reset=None) -> Counts:
    """What torch.compile captures of one call of `fn`. Dynamo counts a break under
    "graph_break", or under "unimplemented" when it resumes at a jump (a branch on a
    tensor); a frame it skips (runs eagerly) is one it did not finish ("frames")."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounter()
    if reset is not None:
        reset()
    with contextlib.redirect_stdout(io.StringIO()):
        torch.compile(fn, backend=counter)(*make())
    breaks = sum(counters["graph_break"].values()) + sum(counters["unimplemented"].values())
    skipped = counters["frames"]["total"] - counters["frames"]["ok"]
    torch._dynamo.reset()
    return Counts(counter.frame_count, breaks, counter.op_count, skipped)


def check(
    fn: Callable[..., Any],
    make: Callable[[], tuple],
    *,
    state: Callable[[], Any] | None = None,
    reset: Callable[[], None] | None = None,
    eager_frames: int = 0,
    compare_args: bool = True,
    dynamo: bool = True,
    backend: str = "eager",
    fullgraph: bool = False,
) -> Counts:
    """Differential check of `fn` against eager, then of ember's capture against Dynamo's.
    Returns ember's counts (of the first run) for further assertions."""
    ember.reset()
    counter = CountingBackend(backend)
    compiled = ember.compile(fn, backend=counter, fullgraph=fullgraph)
    counts = None
    for run in range(2):
        expected = _run(fn, make, state, reset)
        actual = _run(compiled, make, state, reset)
        assert_same(actual[0], expected[0], path=f"run {run}: result")
        if compare_args:
            assert_same(actual[1], expected[1], path=f"run {run}: arguments after the call")
        assert_same(actual[2], expected[2], path=f"run {run}: outside state")
        assert actual[3] == expected[3], f"run {run}: printed {actual[3]!r} != {expected[3]!r}"
        assert actual[4] == expected[4], f"run {run}: identities {actual[4]} != {expected[4]}"
        if run == 0:
            stats = ember.stats()
            counts = Counts(
                counter.frame_count, stats["graph_breaks"], counter.op_count, stats["eager_frames"]
            )
    assert counts.eager_frames == eager_frames, (
        f"{counts.eager_frames} frame(s) ran eagerly: {ember.stats()['break_reasons']}"
    )
    if dynamo:
        compare_with_dynamo(counts, dynamo_counts(fn, make, reset))
    return counts


def compare_with_dynamo(ours: Counts, theirs: Counts) -> None:
    text = f"ember {ours} vs Dynamo {theirs}: {ember.stats()['break_reasons']}"
    assert ours.eager_frames <= theirs.eager_frames, text
    if theirs.eager_frames == 0:
        assert ours.graphs <= theirs.graphs, text
        assert ours.breaks <= theirs.breaks, text
    else:
        assert ours.ops >= theirs.ops, text


def tensors(*shapes: tuple[int, ...]) -> Callable[[], tuple]:
    """An argument maker: fresh random tensors of the given shapes (the same each call)."""

    def make() -> tuple:
        gen = torch.Generator().manual_seed(0)
        return tuple(torch.randn(*shape, generator=gen) for shape in shapes)

    return make


def train_check(fn, make, *, backend="eager", params=(), dynamo=True) -> Counts:
    """Forward and backward of `fn` eagerly and under ember (twice, the second from the
    cache): outputs, the gradients of its arguments and of `params` must agree; then the
    capture is compared with Dynamo's."""

    def run(f):
        for p in params:
            p.grad = None
        args = make()
        out = f(*args)
        loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(_tensors(out)))
        loss.backward()
        grads = [a.grad for a in args if isinstance(a, torch.Tensor)]
        return out, grads, [p.grad for p in params]

    ember.reset()
    counter = CountingBackend(backend)
    compiled = ember.compile(fn, backend=counter)
    counts = None
    for attempt in range(2):
        torch.manual_seed(attempt)
        expected = run(fn)
        torch.manual_seed(attempt)
        actual = run(compiled)
        assert_same(actual, expected, path=f"run {attempt}")
        if counts is None:
            stats = ember.stats()
            counts = Counts(counter.frame_count, stats["graph_breaks"], counter.op_count)
    if dynamo:
        compare_with_dynamo(counts, dynamo_counts(fn, make))
    return counts


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for item in out for t in _tensors(item)] if isinstance(out, list | tuple) else []


def leaf_tensors(*shapes, grad=(True,)):
    def make():
        gen = torch.Generator().manual_seed(0)
        out = []
        for i, shape in enumerate(shapes):
            needs = grad[i] if i < len(grad) else grad[-1]
            out.append(torch.randn(*shape, generator=gen).requires_grad_(needs))
        return tuple(out)

    return make


def classification_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Eight 4-feature rows and their labels among 3 classes, the same on every call."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen)


def restoring(model: torch.nn.Module) -> dict:
    """`check`'s reset/state for a program that changes the model's parameters and gradients:
    each run starts from the same parameters, and what it left is compared."""
    saved = copy.deepcopy(model.state_dict())

    def reset() -> None:
        model.load_state_dict(saved)
        for p in model.parameters():
            p.grad = None

    def state() -> list:
        return [(p.detach().clone(), p.grad) for p in model.parameters()]

    return {"reset": reset, "state": state}
