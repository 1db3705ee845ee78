"""Graph breaks inside inlined calls resume in the frame that breaks (capture/nested.py).

transformers' GPT-2 wraps forward in decorator frames (`(self, *args, **kwargs)` and
`(*args, **kwargs)`) and reads a property whose getter calls `logger.warning_once`. Breaking
at the outermost call, as before, made each callee frame a capture of its own that recorded
the same break again (three breaks where one happened). Now the break is taken in the
deepest frame that can continue as a resume function of its own, and its callers continue
after their calls: one break, the tensor work of every frame before it in one graph.

Each program is compared with eager (values, printed output, outside state, twice) and with
Dynamo's capture (no more graphs, no more breaks); the nested shapes also state ember's own
counts, so that a fallback to breaking at the outer call would fail."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from fidelity_harness import check, dynamo_counts, tensors
from torch import nn

OUT: list = []


def _state():
    return list(OUT)


def _reset():
    OUT.clear()
    _warn_once.cache_clear()


@functools.lru_cache(None)
def _warn_once(message):
    print("warning:", message)


def passthrough(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


def maybe_tuple(fn):
    """transformers' can_return_tuple: a keyword popped, the result converted after."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        as_tuple = kwargs.pop("as_tuple", False)
        out = fn(self, *args, **kwargs)
        if as_tuple and not isinstance(out, tuple):
            out = (out,)
        return out

    return wrapper


class LossModel(nn.Module):
    """GPT-2's shape: decorated forward, a property whose getter breaks, work after it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)

    @property
    def loss_function(self):
        _warn_once("no loss type set, using mse")
        return F.mse_loss

    @maybe_tuple
    @passthrough
    @passthrough
    def forward(self, x, y):
        h = self.lin(x).relu()
        loss = self.loss_function(h, y)
        return loss * 2 + h.sum()


class KeywordLossModel(LossModel):
    """As GPT-2 calls it: with `**kwargs`, so the property is read by LOAD_ATTR."""

    @maybe_tuple
    @passthrough
    @passthrough
    def forward(self, x, y, **kwargs):
        h = self.lin(x).relu()
        loss = self.loss_function(h, y, **kwargs)
        return loss * 2 + h.sum()


@pytest.mark.parametrize("model", [LossModel, KeywordLossModel])
def test_a_break_in_a_property_getter_under_decorators_is_taken_once(model):
    """Dynamo breaks in each decorator frame and, in forward, cannot resume after the
    property: it compiles forward up to it and runs the rest uncompiled (1 graph of 2 ops,
    5 breaks counted, no frame reported as skipped). ember takes one break in the getter's
    caller and captures the rest of forward as a second graph."""
    counts = check(model(), tensors((3, 4), (3, 4)), reset=_reset, dynamo=False)
    assert (counts.graphs, counts.breaks, counts.ops) == (2, 1, 6)
    theirs = dynamo_counts(model(), tensors((3, 4), (3, 4)), reset=_reset)
    assert counts.breaks < theirs.breaks and counts.ops > theirs.ops, theirs


def helper(h):
    OUT.append(("helper", h.shape[0]))
    print("in helper")
    return h * 2


@passthrough
def deep(h):
    return helper(h + 1) - 1


def nested_print(x):
    y = x.sin()
    z = deep(y)
    return z.cos() + y


def test_a_break_two_calls_deep_resumes_there_and_continues_in_each_caller():
    """One graph before the break (sin, + 1), then one per frame with work after it: the
    helper's `* 2`, deep's `- 1`, the root's `cos() + y` (Dynamo: 5 graphs, 3 breaks)."""
    counts = check(nested_print, tensors((3,)), state=_state, reset=_reset)
    assert (counts.graphs, counts.breaks) == (4, 1)


def _explicit(h):
    h = h * 3
    torch._dynamo.graph_break()
    return h + 1


_decorated_explicit = passthrough(_explicit)


def explicit_break(x):
    a = x.exp()
    return a + _decorated_explicit(a)


def decorated_in_the_trace(x):
    a = x.exp()
    return a + passthrough(_explicit)(a)


def test_torch_dynamo_graph_break_in_an_inlined_call():
    import torch._dynamo  # noqa: F401  (ember recognizes it once imported)

    counts = check(explicit_break, tensors((4,)))
    assert (counts.graphs, counts.breaks) == (3, 1)
    # a wrapper made in the trace closes over cells made in the trace, which a resume
    # function cannot take: the break is taken at the call of the wrapper, which is then
    # captured on its own (2 breaks; Dynamo counts 3)
    counts = check(decorated_in_the_trace, tensors((4,)))
    assert (counts.graphs, counts.breaks) == (4, 2)


def _branch(h):
    if h.sum() > 0:
        return h + 10
    return h - 10


def branch_in_callee(x):
    y = x * 2
    return _branch(y) * y


def test_a_jump_on_a_tensor_in_an_inlined_call_resumes_on_both_sides():
    check(branch_in_callee, tensors((5,)))
    check(branch_in_callee, lambda: (-torch.ones(5),))


def _loop(h, n):
    for i in range(n):
        print("step", i)
        h = h + i
    return h


def loop_in_callee(x):
    return _loop(x.relu(), 3).sum()


def test_a_break_in_a_loop_of_an_inlined_call():
    check(loop_in_callee, tensors((4,)))


def _middle(x, items):
    items.append(x.shape[0])
    out = [x.sum()]
    out.append(helper(x))
    return out


def stack_below_the_call(x):
    items = []
    parts = _middle(x * 2, items)
    total = x + parts[0] + parts[1]
    items.append(len(parts))
    return total, items


def test_callers_keep_their_stack_and_locals_and_the_order_of_side_effects():
    check(stack_below_the_call, tensors((3,)), state=_state, reset=_reset)


def _closure(scale):
    def scaled(h):
        print("scaled by", scale)
        return h * scale

    return scaled


SCALED = _closure(3.0)


def keywords_and_closures(x, bias=1.0):
    return passthrough(SCALED)(h=x + bias) + bias


def test_keywords_and_closure_cells_of_inlined_frames():
    check(keywords_and_closures, tensors((3,)))


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        print("inner", tuple(h.shape))
        return h.tanh()


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x.relu()) * 2


def test_a_break_in_a_submodule_forward():
    counts = check(Outer(), tensors((2, 3)))
    assert (counts.graphs, counts.breaks) == (3, 1)


class Boom(Exception):
    pass


def _raises_after(h):
    print("before the raise")
    if h.shape[0] == 3:
        raise Boom("three")
    return h


def raise_after_break(x):
    OUT.append("start")
    return passthrough(_raises_after)(x + 1)


def test_an_exception_after_the_break_leaves_through_the_callers():
    compiled = ember_compile(raise_after_break)
    for fn in (raise_after_break, compiled, compiled):
        _reset()
        try:
            fn(torch.ones(3))
        except Boom as exc:
            assert str(exc) == "three"
        else:
            raise AssertionError("no exception")
        assert OUT == ["start"]


def _guarded(h):
    try:
        print("inside try")
        return h * 2
    except RuntimeError:
        return h


def try_in_callee(x):
    return _guarded(x + 1) + 1


def test_a_break_inside_a_try_block_of_an_inlined_call_stays_correct():
    check(try_in_callee, tensors((3,)))


def _caller_with_try(h):
    try:
        return helper(h)
    except RuntimeError:
        return h


def try_in_caller(x):
    return _caller_with_try(x.cos())


def test_a_caller_inside_a_try_block_takes_the_break_itself():
    check(try_in_caller, tensors((3,)), state=_state, reset=_reset)


def _gen(h):
    for i in range(2):
        print("yield", i)
        yield h + i


def generator_in_callee(x):
    return sum(_gen(x * 2))


def test_a_break_in_a_generator_frame_is_taken_by_a_caller():
    """The generator's frame cannot continue as a function: the break is taken where `sum`
    pulls it, and the print makes computing it ahead impossible, so the graph ends where
    the generator is made (`x * 2` captured; CPython makes and sums it). Dynamo skips the
    frame; before, ember ran it eagerly too."""
    counts = check(generator_in_callee, tensors((3,)))
    assert counts.graphs == 1 and counts.eager_frames == 0


def ember_compile(fn):
    import ember

    return ember.compile(fn, backend="eager")


def _keeps_a_local_function(h):
    def scale(v, *, k=2):
        return v * k

    print("inner")
    return scale(h)


def unrebuildable_local_in_the_callee(x):
    y = x.sin()
    return _keeps_a_local_function(y) + y


def test_a_callee_with_a_local_function_with_keyword_defaults_takes_the_break():
    """Break code for the callee's frame rebuilds `scale` (a function made in the trace with
    keyword defaults; before, it could not, and the callee ran eagerly): the break is taken
    in the callee (Dynamo: 3 graphs, 2 breaks)."""
    counts = check(unrebuildable_local_in_the_callee, tensors((3,)))
    assert (counts.graphs, counts.breaks) == (3, 1)
