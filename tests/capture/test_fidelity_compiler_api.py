"""Issue 12: the compiler-control API that libraries written for torch.compile call is
honoured with Dynamo's meaning (graph_break, disable as decorator and call,
is_compiling, allow_in_graph, assume_constant_result), and ember's public names do the same.
Each program is compared with eager and with Dynamo's capture (see fidelity_harness)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from fidelity_harness import check, tensors

import ember
from ember import BreakReason, Unsupported
from ember.testing import CompileCounter

LOG: list = []


def p_dynamo_graph_break(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos()


def p_ember_graph_break(x):
    y = x.sin()
    ember.graph_break()
    return y.cos()


def _helper(x):
    LOG.append(torch.compiler.is_compiling())
    return x * 2


dynamo_disabled = torch._dynamo.disable(_helper)
compiler_disabled = torch.compiler.disable(_helper)
ember_disabled = ember.disable(lambda x: LOG.append(torch.compiler.is_compiling()) or x * 3)


def p_disabled_decorated(x):
    return dynamo_disabled(x.sin()) + compiler_disabled(x)


def p_ember_disabled(x):
    return ember_disabled(x.sin()) + 1


def p_disable_called_in_the_trace(x):
    return torch.compiler.disable(_helper)(x + 1) - 1


def _state():
    return list(LOG)


@pytest.mark.parametrize(
    "fn",
    [p_dynamo_graph_break, p_disabled_decorated, p_disable_called_in_the_trace],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
def test_dynamo_api(fn):
    check(fn, tensors((3,)), state=_state, reset=LOG.clear)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (p_ember_graph_break, p_dynamo_graph_break),
        (p_ember_disabled, p_disable_called_in_the_trace),
    ],
)
def test_ember_names_capture_as_dynamos_do(ours, theirs):
    """Dynamo does not know ember's names: they must capture as Dynamo's own names do."""
    mine = check(ours, tensors((3,)), state=_state, reset=LOG.clear, dynamo=False)
    assert mine == check(theirs, tensors((3,)), state=_state, reset=LOG.clear)


def test_graph_break_splits_the_graph_and_raises_under_fullgraph():
    counts = check(p_dynamo_graph_break, tensors((3,)))
    assert (counts.graphs, counts.breaks) == (2, 1)
    with pytest.raises(Unsupported) as info:
        ember.compile(p_ember_graph_break, backend="eager", fullgraph=True)(torch.ones(2))
    assert info.value.reason is BreakReason.FORCED


def test_disabled_functions_run_in_plain_python():
    LOG.clear()
    ember.compile(p_disabled_decorated, backend="eager")(torch.ones(2))
    ember.compile(p_ember_disabled, backend="eager")(torch.ones(2))
    assert LOG == [False, False, False]


def p_is_compiling(x):
    flags = (
        torch.compiler.is_compiling(),
        torch.compiler.is_dynamo_compiling(),
        torch._dynamo.is_compiling(),
    )
    return flags, _helper(x), dynamo_disabled(x)


def test_is_compiling_true_in_the_graph_false_at_a_break():
    """The one program whose answer differs from eager's by design: as under torch.compile."""
    LOG.clear()
    ours = ember.compile(p_is_compiling, backend="eager")(torch.ones(2))
    ember_log = list(LOG)
    LOG.clear()
    torch._dynamo.reset()
    theirs = torch.compile(p_is_compiling, backend="eager")(torch.ones(2))
    assert ours[0] == theirs[0] == (True, True, True)
    assert ember_log == LOG == [True, False]  # inlined, then run in Python
    assert ember.is_compiling() is False


def _opaque(x):
    return (x * 2).tanh()


torch._dynamo.allow_in_graph(_opaque)
ember_opaque = ember.allow_in_graph(lambda x: x.abs() + 1)


def p_allow_in_graph(x):
    return _opaque(x.sin()) + ember_opaque(x)


def test_allow_in_graph_is_one_node():
    counter = CompileCounter()
    check(p_allow_in_graph, tensors((3,)))
    ember.reset()
    ember.compile(p_allow_in_graph, backend=counter, fullgraph=True)(torch.ones(3))
    targets = [n.target for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert _opaque in targets and ember_opaque in targets


SCALE = {"value": 3}


@torch._dynamo.assume_constant_result
def _scale():
    return SCALE["value"]


def p_assume_constant_result(x):
    return x * _scale()


def test_assume_constant_result_is_baked_in_without_a_guard():
    check(p_assume_constant_result, tensors((3,)))
    counter = CompileCounter()
    compiled = ember.compile(p_assume_constant_result, backend=counter, fullgraph=True)
    x = torch.ones(2)
    assert compiled(x).tolist() == [3.0, 3.0]
    SCALE["value"] = 5
    try:
        assert compiled(x).tolist() == [3.0, 3.0]  # as under torch.compile: no guard
    finally:
        SCALE["value"] = 3
    assert counter.frame_count == 1
