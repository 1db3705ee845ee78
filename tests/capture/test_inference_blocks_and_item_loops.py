"""Two gaps of probe round 13b (issue 12), each against eager and Dynamo's counts:

- `with torch.inference_mode():` inside a compiled function (and `@torch.inference_mode()`
  on a function it calls) broke 5 times (its constructor, `_InferenceMode`, `__enter__`,
  `__exit__`...) against Dynamo's 1. The block is now captured in the graph
  (capture/values/inference_mode.py): enter and exit nodes around its ops, which then make
  inference tensors as eagerly (`is_inference()` compared through the results).
- `[l.item() for l in losses]` after a break: a break per item (the comprehension's resume
  function was captured again for each, its iterator one further), Dynamo 1. A resume
  function that breaks, before any graph work, where it resumes itself now runs as written
  (capture/frame.py `_ResumesIntoItself`).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fidelity_harness import check, classification_batch, restoring, tensors
from torch import nn

import ember
from ember.testing import CompileCounter, CountingBackend, assert_same


def _leaf(*shape: int):
    """An argument maker: one tensor that requires grad (the same values each call)."""

    def make() -> tuple:
        gen = torch.Generator().manual_seed(0)
        return (torch.randn(*shape, generator=gen).requires_grad_(),)

    return make


def _net(out: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, out))


# torch.inference_mode() inside compiled code

EVAL_NET = _net()


def eval_in_step(x, y):
    loss = F.cross_entropy(EVAL_NET(x), y)
    loss.backward()
    with torch.inference_mode():
        logits = EVAL_NET(x)
        pred = logits.argmax(-1)
    return loss.detach(), pred, logits, logits * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_evaluation_block_inside_a_training_step(backend):
    """Dynamo: 2 graphs, 1 break (backward); ember before: 3 graphs, 5 breaks."""
    counts = check(eval_in_step, classification_batch, backend=backend, **restoring(EVAL_NET))
    assert counts.breaks == 1 and counts.graphs == 2


DECORATED_NET = _net()


@torch.inference_mode()
def _predict(x):
    return DECORATED_NET(x) * 2


def decorated_call(x):
    y = _predict(x)
    return y, y + 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_decorated_function_called_from_compiled_code(backend):
    """`@torch.inference_mode()` at import: its wrapper makes a fresh block per call
    (`clone()`), traced. Results are inference tensors, as eagerly."""
    counts = check(decorated_call, tensors((5, 4)), backend=backend)
    assert counts.breaks == 0 and counts.graphs == 1


def test_is_inference_of_the_results():
    """`is_inference()` asks the real tensor (a break), as Dynamo does: 1 break each."""

    def f(x):
        y = _predict(x)
        with torch.inference_mode():
            z = x * 3
        return y.is_inference(), z.is_inference(), (x + 1).is_inference(), y, z

    check(f, tensors((5, 4)))


def test_modes_queried_inside_the_block():
    def f(x):
        before = torch.is_inference_mode_enabled(), torch.is_grad_enabled()
        with torch.inference_mode():
            inside = torch.is_inference_mode_enabled(), torch.is_grad_enabled()
            y = x.sin()
        after = torch.is_inference_mode_enabled(), torch.is_grad_enabled()
        return before, inside, after, y

    counts = check(f, _leaf(3), compare_args=False)
    assert counts.breaks == 0
    with torch.no_grad():
        check(f, tensors((3,)))


def test_break_inside_the_block():
    """The graph leaves inference mode at the break; break code enters a real block for
    the rest, whose `__exit__` gives back the grad mode outside it."""

    def f(x):
        with torch.inference_mode():
            y = x * 2
            print("inside", torch.is_inference_mode_enabled())
            z = y + 1
        return y, z, torch.is_grad_enabled(), torch.is_inference_mode_enabled(), x.exp()

    check(f, _leaf(3), compare_args=False)


def test_enable_grad_inside_the_block_breaks():
    """enable_grad inside inference mode records nothing: the trace (whose examples would
    say requires_grad) breaks there instead."""

    def f(x):
        with torch.inference_mode():
            with torch.enable_grad():
                y = x * 2
                inner = torch.is_grad_enabled(), y.requires_grad
            z = y + 1
        return y, z, inner, z.requires_grad

    check(f, _leaf(3), compare_args=False, dynamo=False)


def test_requires_grad_under_the_callers_inference_mode():
    """Called under inference mode, `enable_grad` inside still records no autograd: the
    trace's examples said `requires_grad` (a wrong answer from before this change)."""

    def f(x):
        with torch.enable_grad():
            y = x * 2
            return y, y.requires_grad, torch.is_grad_enabled()

    with torch.inference_mode():
        check(f, _leaf(3), compare_args=False)


def test_in_place_write_to_an_input_inside_the_block():
    def f(x, buf):
        with torch.inference_mode():
            buf.add_(x)
        return buf * 2

    check(f, tensors((3,), (3,)))


def test_inference_mode_false_still_breaks_correctly():
    def f(x):
        with torch.inference_mode(False):
            y = x + 1
        return y, y.requires_grad

    check(f, _leaf(3), compare_args=False, dynamo=False)


def test_graph_with_a_block_under_the_ember_backend():
    """aot runs a graph that enters inference mode as captured (its traces would drop the
    mode switch); the rest of a program is compiled as usual."""
    model = _net()

    def f(x):
        h = model(x).relu()
        with torch.inference_mode():
            p = model(x).softmax(-1)
        return h, p

    x = torch.randn(4, 4)
    ember.reset()
    got = ember.compile(f, backend=CountingBackend("ember"))(x)
    want = f(x)
    assert_same(got, want, rtol=1e-5, atol=1e-6)
    assert [t.is_inference() for t in got] == [t.is_inference() for t in want]
    assert got[0].requires_grad and not got[1].requires_grad


# .item() in a loop after a break

ITEM_NET = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def losses_as_numbers(x):
    losses = [ITEM_NET(xb).sum() for xb in x.split(2)]
    total = torch.stack(losses).sum()
    total.backward()
    return [loss.item() for loss in losses]


def test_item_of_each_loss_after_backward():
    """Dynamo 1 graph, 2 breaks (backward, item); ember before: 4 breaks (3 items)."""
    make = tensors((8, 4))
    counts = check(losses_as_numbers, make, **restoring(ITEM_NET))
    assert counts.breaks == 2


def test_item_loop_runs_as_written_for_any_length():
    """No break or recompile per item: each new length recompiles the frames before the
    loop (their list lengths are guarded) and breaks once at its first `.item()`."""
    ember.reset()
    compiled = ember.compile(losses_as_numbers)
    for rows in (8, 12, 4, 12):
        x = torch.randn(rows, 4)
        assert_same(compiled(x), losses_as_numbers(x), rtol=1e-5, atol=1e-6)
    reasons = ember.stats()["break_reasons"]
    assert sum("item()" in r for r in reasons) == 3, reasons


def test_item_in_a_for_loop_with_work_between():
    """Tensor work in every iteration: each iteration keeps its graph (not run as
    written)."""

    def f(xs):
        total = xs[0] * 0
        values = []
        for x in xs:
            total = total + x.sin()
            values.append(x.sum().item())
        return total, values

    counts = check(f, lambda: (list(tensors((3,), (3,), (3,))()),))
    assert counts.graphs >= 3


def test_item_in_a_plain_for_loop():
    def f(x):
        x.sum().backward()
        out = []
        for row in x.detach():
            out.append(row.sum().item())
        return out

    check(f, _leaf(4, 3), compare_args=False)


def test_loop_that_mutates_outside_state_between_items():
    """A resume function run as written does everything itself, side effects included."""
    seen = []

    def f(xs):
        xs = [x * 2 for x in xs]
        torch._dynamo.graph_break()
        for x in xs:
            seen.append(x.item())
        return len(seen)

    def reset():
        seen.clear()

    check(f, lambda: (list(tensors((1,), (1,), (1,))()),), state=lambda: list(seen), reset=reset)


@torch.compiler.disable
def _opaque_block(x):
    return x.cos()


def blocks_then_head(x):
    for _ in range(3):
        x = _opaque_block(x)
    return x * 2 + 1


def test_a_loop_of_breaks_with_work_after_it_compiles_the_work():
    """Each iteration breaks at a disabled call and does nothing else (the resume function
    resumes into itself), but after the loop comes tensor work: it must reach a graph, not run
    as written with the loop (a loop over FSDP1 blocks, then the head)."""
    ember.reset()
    counter = CompileCounter()
    compiled = ember.compile(blocks_then_head, backend=counter)
    for _ in range(2):
        x = torch.randn(4)
        assert_same(compiled(x), blocks_then_head(x))
    assert counter.op_count == 2, counter.op_count
    counts = check(blocks_then_head, tensors((4,)))
    assert counts.ops == 2
