"""Graph breaks: the supported regions are captured, the rest runs in CPython, resume
functions continue the capture, and results and Python state equal eager's."""

from __future__ import annotations

import pytest
import torch

import ember
from ember import BreakReason
from ember.testing import CompileCounter, assert_same

x0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))


def prints(x):
    a = x * 2
    print("between graphs")
    return a + 1


def branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def item(x):
    scale = x.abs().max().item()
    return x / scale


def tolist(x):
    values = x[0].tolist()
    return x * len(values)


def helper_prints(y):
    print("inside helper")
    return y * 3


def inline_break(x):
    a = x + 1
    b = helper_prints(a)
    return b - 1


def breaks_twice(x):
    a = x.sin()
    print("one")
    b = a.cos()
    print("two")
    return b + a


def loop_break(x):
    out = x
    for _ in range(3):
        out = out * 2
        if out.sum() > 100:
            out = out / 100
    return out


def no_grad_break(x):
    with torch.no_grad():
        y = x * 2
        print("inside no_grad")
    return y + 1


def try_break(x):
    try:
        y = x * 2
        print("inside try")
    except RuntimeError:
        y = x
    return y + 1


def numpy_call(x):
    y = x + 1
    z = torch.from_numpy(y.numpy() * 2)
    return z + y


def kwargs_break(x):
    y = x.relu()
    s = "{a}-{b}".format(a=1, b=2)  # noqa: UP032  (the call under test)
    return y * len(s)


def mutation_then_break(x, out):
    out.append(1)
    y = x * 2
    print(len(out))
    out.append(2)
    return y


CASES = [
    (prints, 2),
    (branch, 2),
    (item, 2),
    (tolist, 2),
    (inline_break, 3),
    (breaks_twice, 3),
    (numpy_call, 1),  # the resumed part holds a numpy array: it runs in Python
    (kwargs_break, 1),  # str.format on constants folds: no break at all
]


@pytest.mark.parametrize("fn,graphs", CASES, ids=[c[0].__name__ for c in CASES])
def test_break_matches_eager_and_counts_graphs(fn, graphs, capsys):
    cnt = CompileCounter()
    compiled = ember.compile(fn, backend=cnt)
    for sign in (1, 1, -1):
        x = x0 * sign
        expected = fn(x.clone())
        assert_same(compiled(x.clone()), expected)
    assert cnt.frame_count >= graphs
    frames_after_warmup = cnt.frame_count
    compiled(x0.clone())
    assert cnt.frame_count == frames_after_warmup  # the resumed code is cached too


@pytest.mark.parametrize("sign", [1, -1])
def test_branch_takes_both_sides(sign):
    compiled = ember.compile(branch, backend="eager")
    x = x0.abs() * sign
    assert torch.equal(compiled(x), branch(x))


def test_print_output_in_order(capsys):
    compiled = ember.compile(breaks_twice, backend="eager")
    compiled(x0)
    assert capsys.readouterr().out == "one\ntwo\n"


@pytest.mark.parametrize("fn", [loop_break, no_grad_break, try_break])
def test_unresumable_places_run_correctly(fn):
    compiled = ember.compile(fn, backend="eager")
    for _ in range(2):
        assert_same(compiled(x0.clone()), fn(x0.clone()))


def test_no_grad_break_restores_grad_mode():
    compiled = ember.compile(no_grad_break, backend="eager")
    x = x0.clone().requires_grad_()
    out = compiled(x)
    assert torch.is_grad_enabled()
    assert out.requires_grad == no_grad_break(x).requires_grad


def test_ledger_settled_before_the_break():
    compiled = ember.compile(mutation_then_break, backend="eager")
    out_c, out_e = [], []
    assert torch.equal(compiled(x0, out_c), mutation_then_break(x0, out_e))
    assert out_c == out_e == [1, 2]


def test_inline_break_compiles_the_callee_on_its_own():
    cnt = CompileCounter()
    compiled = ember.compile(inline_break, backend=cnt)
    compiled(x0)
    ops = [[n.target for n in g.graph.nodes if n.op == "call_function"] for g in cnt.graphs]
    names = [[getattr(t, "__name__", str(t)) for t in graph] for graph in ops]
    assert ["add"] in names and ["mul"] in names and ["sub"] in names


REASONS = [
    (prints, BreakReason.UNSUPPORTED_CALL),
    (branch, BreakReason.DATA_DEPENDENT_BRANCH),
    (item, BreakReason.TENSOR_TO_PYTHON),
    (tolist, BreakReason.TENSOR_TO_PYTHON),
    (numpy_call, BreakReason.TENSOR_TO_PYTHON),
]


@pytest.mark.parametrize("fn,reason", REASONS, ids=[r[0].__name__ for r in REASONS])
def test_fullgraph_raises_with_reason_and_location(fn, reason):
    compiled = ember.compile(fn, backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported) as info:
        compiled(x0)
    assert info.value.reason is reason
    assert "test_graph_breaks.py" in info.value.location


def test_explain_reports_graphs_and_breaks():
    out = ember.explain(breaks_twice)(x0)
    assert out.graph_count == 3
    assert out.graph_break_count == 2
    assert all(b.reason is BreakReason.UNSUPPORTED_CALL for b in out.break_reasons)
    assert all("test_graph_breaks.py" in b.location for b in out.break_reasons)
    assert all("print" in b.source_line for b in out.break_reasons)
    assert len(out.ops_per_graph) == 3 and len(out.out_guards) >= 3
    text = str(out)
    assert "Graph Break Count: 2" in text


def test_explain_inline_break_has_user_stack():
    out = ember.explain(inline_break)(x0)
    assert out.graph_break_count >= 1
    first = out.break_reasons[0]
    assert len(first.user_stack) >= 2  # the helper's line and the caller's line
