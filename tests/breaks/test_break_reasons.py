"""Every BreakReason that can stop a capture: the reason enum (never the message text) and
the user's file:line, under fullgraph=True (raised), ember.explain (reported) and a plain
compile (the program still runs as in eager). Also explain's fields, the graph_breaks and
side_effects log channels, and that resumed functions are cached."""

from __future__ import annotations

import array
import logging
import types

import pytest
import torch
from break_harness import Case, check_case, check_counts

import ember
from ember import BreakReason
from ember.capture import cache
from ember.testing import CompileCounter, assert_same

x0 = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
HERE = "test_break_reasons.py"
G_VALUE = 1


class Obj:
    def __init__(self):
        self.a = 1

    def __delattr__(self, name):  # refused (a plain `del obj.a` is modelled)
        object.__delattr__(self, name)


def recurse(y, n):
    return y if n == 0 else recurse(y + 1, n - 1)


def r_print(x):
    y = x + 1
    print("r")
    return y


def r_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def r_item(x):
    return x * x.sum().item()


def r_grad_attr(x):
    g = (x * 3).grad  # made in the trace: its gradient is not known there
    return x * 2 if g is None else x + g


def r_c_object(x, s):
    return x * s.itemsize  # an array.array: a C object ember cannot look into


def r_list_index(x):
    i = torch.tensor(1)
    return x * [10, 20, 30][i]


def r_raise(x):
    y = x + 1
    if y.shape[0] == 3:
        raise ValueError("three rows")
    return y


def r_key_error(x):
    return x * {"a": 1}["b"]


def r_method_truth(x):
    if x.add:
        return x + 1
    return x


def r_recursion(x):
    return recurse(x, 4)


def r_del_attr(x, o):
    y = x * 2
    del o.a
    return y + 1


def r_shape_mismatch(x):
    return x @ torch.ones(2, 2)


def r_nonzero(x):
    return torch.nonzero(x > 0).shape[0] + x


def r_del_global(x):
    global G_VALUE
    del G_VALUE
    return x


def r_graph_break(x):
    y = x.sin()
    ember.graph_break()
    return y.cos()


LOG: list = []


def _logs(y):
    LOG.append(1)
    return y.sin()


def r_checkpoint_logs(x):
    return torch.utils.checkpoint.checkpoint(_logs, x + 1, use_reentrant=False)


def _args(fn):
    if fn is r_c_object:
        return (x0.clone(), array.array("d", [1.0]))
    if fn is r_del_attr:
        return (x0.clone(), Obj())
    return (x0.clone(),)


REASONS = [
    (r_print, BreakReason.UNSUPPORTED_CALL),
    (r_branch, BreakReason.DATA_DEPENDENT_BRANCH),
    (r_item, BreakReason.TENSOR_TO_PYTHON),
    (r_grad_attr, BreakReason.UNSUPPORTED_ATTRIBUTE),
    (r_c_object, BreakReason.UNSUPPORTED_OBJECT),
    (r_list_index, BreakReason.UNSUPPORTED_OPERATOR),
    (r_raise, BreakReason.EXCEPTION_RAISED),
    (r_key_error, BreakReason.EXCEPTION_RAISED),
    (r_method_truth, BreakReason.DYNAMIC_CONTROL_FLOW),
    (r_recursion, BreakReason.INLINE_DEPTH),
    (r_del_attr, BreakReason.SIDE_EFFECT),
    (r_shape_mismatch, BreakReason.TENSOR_OP_FAILED),
    (r_nonzero, BreakReason.DATA_DEPENDENT_OP),
    (r_del_global, BreakReason.UNSUPPORTED_OPCODE),
    (r_graph_break, BreakReason.FORCED),
    (r_checkpoint_logs, BreakReason.HIGHER_ORDER_OP),
]
REASON_IDS = [f"{r.name}-{fn.__name__}" for fn, r in REASONS]


def test_every_reason_has_a_case():
    # the recompile limit is no construct at a line: test_fidelity_crashes covers it
    assert {r for _, r in REASONS} | {BreakReason.RECOMPILE_LIMIT} == set(BreakReason)


@pytest.fixture
def shallow_inlining():
    with ember.config.patch(inline_depth=2):
        yield


def _eager(fn):
    """What eager does: (result, None) or (None, exception type)."""
    global G_VALUE
    G_VALUE = 1
    try:
        return fn(*_args(fn)), None
    except Exception as exc:
        return None, type(exc)
    finally:
        G_VALUE = 1


@pytest.mark.usefixtures("shallow_inlining")
@pytest.mark.parametrize("fn,reason", REASONS, ids=REASON_IDS)
def test_fullgraph_raises_the_reason_at_the_users_line(fn, reason):
    compiled = ember.compile(fn, backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported) as info:
        compiled(*_args(fn))
    assert info.value.reason is reason
    assert HERE in info.value.location
    assert info.value.source_line  # the user's source text
    assert int(info.value.location.rsplit(":", 1)[1]) > 0


@pytest.mark.usefixtures("shallow_inlining")
@pytest.mark.parametrize("fn,reason", REASONS, ids=REASON_IDS)
def test_explain_reports_the_reason(fn, reason):
    global G_VALUE
    try:
        out = ember.explain(fn)(*_args(fn))
    except Exception:
        # programs that raise in eager raise under explain too; the reason is in the cache
        out = None
    finally:
        G_VALUE = 1
    if out is not None:
        assert out.break_reasons, "no break reported"
        first = out.break_reasons[0]
        assert first.reason is reason
        assert HERE in first.location
        assert first.user_stack and HERE in first.user_stack[-1]
        assert out.graph_break_count == len(out.break_reasons)
        assert out.graph_count == len(out.graphs) == len(out.ops_per_graph)
        assert reason.value in str(out)


@pytest.mark.usefixtures("shallow_inlining")
@pytest.mark.parametrize("fn,reason", REASONS, ids=REASON_IDS)
def test_plain_compile_behaves_as_eager(fn, reason):
    global G_VALUE
    compiled = ember.compile(fn, backend="eager")
    for _ in range(2):
        expected, expected_error = _eager(fn)
        G_VALUE = 1
        if expected_error is not None:
            with pytest.raises(expected_error):
                compiled(*_args(fn))
        else:
            assert_same(compiled(*_args(fn)), expected)
        G_VALUE = 1
    stopped = [e.graph_break for c in cache._caches.values() for e in c.entries if e.graph_break]
    stopped += [c.eager_reason for c in cache._caches.values() if c.eager_reason is not None]
    if fn is r_raise:  # a raise leaving the function is raised by its replacement code
        assert not stopped  # (tests/capture/test_exceptions.py)
        return
    assert stopped and stopped[0].reason is reason
    assert HERE in stopped[0].location


# ---------------------------------------------------------------- explain
def two_prints(x):
    a = x.sin()
    print("one")
    b = a.cos()
    print("two")
    return b + a


def test_explain_fields_for_two_breaks(capsys):
    out = ember.explain(two_prints)(x0)
    assert out.graph_count == 3 and out.graph_break_count == 2
    assert [b.reason for b in out.break_reasons] == [BreakReason.UNSUPPORTED_CALL] * 2
    assert all("print" in b.source_line for b in out.break_reasons)
    lines = [int(b.location.rsplit(":", 1)[1]) for b in out.break_reasons]
    assert lines[1] == lines[0] + 2
    names = [[getattr(op, "__name__", str(op)) for op in ops] for ops in out.ops_per_graph]
    assert names == [["sin"], ["cos"], ["add"]]
    assert len(out.out_guards) == 3
    text = str(out)
    assert "Graph Count: 3" in text and "Graph Break Count: 2" in text
    assert capsys.readouterr().out == "one\ntwo\n"


def test_explain_of_a_function_without_breaks():
    out = ember.explain(lambda x: (x + 1).relu())(x0)
    assert (out.graph_count, out.graph_break_count, out.break_reasons) == (1, 0, [])


def test_explain_leaves_no_cache_behind():
    cnt = CompileCounter()
    compiled = ember.compile(two_prints, backend=cnt)
    ember.explain(two_prints)(x0)
    compiled(x0)
    assert cnt.frame_count == 3  # explain's captures were not reused by this compile


# ---------------------------------------------------------------- logs
def logged(x, out):
    out.append(1)
    y = x * 2
    print("log me")
    out.append(2)
    return y


def test_graph_breaks_log_names_reason_and_place(caplog):
    ember.set_logs("graph_breaks")
    with caplog.at_level(logging.DEBUG, logger="ember.graph_breaks"):
        ember.compile(logged, backend="eager")(x0, [])
    records = [r for r in caplog.records if r.name == "ember.graph_breaks"]
    assert records
    text = records[0].getMessage()
    assert BreakReason.UNSUPPORTED_CALL.value in text
    assert HERE in text and "print" in text


def test_side_effects_log_names_each_replayed_mutation(caplog):
    ember.set_logs("side_effects")
    with caplog.at_level(logging.DEBUG, logger="ember.side_effects"):
        ember.compile(logged, backend="eager")(x0, [])
    messages = [r.getMessage() for r in caplog.records if r.name == "ember.side_effects"]
    assert len(messages) == 2  # one before the break, one in the resume function
    assert all("out" in m for m in messages)


def test_logs_carry_their_channel_names(caplog):
    from ember import logs

    ember.set_logs("graph_breaks", "side_effects")
    with caplog.at_level(logging.DEBUG, logger="ember"):
        ember.compile(logged, backend="eager")(x0, [])
    handler = logs._handler  # the stderr handler set_logs installs
    lines = [handler.format(r) for r in caplog.records if r.name.startswith("ember.")]
    assert any(line.startswith("[ember.graph_breaks]") for line in lines)
    assert any(line.startswith("[ember.side_effects]") for line in lines)


# ---------------------------------------------------------------- caching
def resumed(x, k):
    y = x * k
    print("cached?")
    return y + k


def test_resumed_function_is_cached():
    cnt = CompileCounter()
    compiled = ember.compile(resumed, backend=cnt)
    compiled(x0, 2)
    assert cnt.frame_count == 2
    for _ in range(3):
        compiled(torch.randn(3, 3), 2)  # same kinds of inputs: nothing new
    assert cnt.frame_count == 2
    resume_caches = [
        c for k, c in cache._caches.items() if k[0].co_name.startswith("__resume_") and c.entries
    ]
    assert len(resume_caches) == 1 and len(resume_caches[0].entries) == 1


def test_changed_constant_recompiles_both_halves_once():
    cnt = CompileCounter()
    compiled = ember.compile(resumed, backend=cnt)
    compiled(x0, 2)
    compiled(x0, 3)
    compiled(x0, 3)
    assert cnt.frame_count == 4


def test_changed_shape_recompiles_only_what_sees_it():
    def f(x, y):
        a = x * 2
        print("shape", a.shape)
        return y + 1

    cnt = CompileCounter()
    compiled = ember.compile(f, backend=cnt)
    compiled(x0, torch.ones(2))
    compiled(torch.ones(5, 5), torch.ones(2))  # only the first graph sees x
    assert cnt.frame_count == 3
    compiled(torch.ones(5, 5), torch.ones(2))
    assert cnt.frame_count == 3


def test_break_in_resume_of_resume_is_cached():
    cnt = CompileCounter()
    compiled = ember.compile(two_prints, backend=cnt)
    for _ in range(3):
        compiled(x0)
    assert cnt.frame_count == 3


def test_reset_forgets_resume_functions_too():
    cnt = CompileCounter()
    compiled = ember.compile(resumed, backend=cnt)
    compiled(x0, 2)
    ember.reset()
    compiled(x0, 2)
    assert cnt.frame_count == 4


def test_fullgraph_and_plain_compiles_keep_separate_caches():
    plain = ember.compile(resumed, backend="eager")
    plain(x0, 2)
    strict = ember.compile(resumed, backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported):
        strict(x0, 2)
    assert_same(plain(x0, 2), resumed(x0, 2))


# ---------------------------------------------------------------- seed 002 with a break
log: list = []


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        log.append(self.calls)
        print("calls", self.calls)
        return x * 2


def test_seed_002_example_with_a_print_in_forward(capsys):
    log.clear()
    m = ember.compile(Model(), backend="eager")
    m(torch.randn(4))
    m(torch.randn(4))
    assert (m.calls, log) == (2, [1, 2])
    assert capsys.readouterr().out == "calls 1\ncalls 2\n"


def module_attr_program(x):
    mod.flag = not mod.flag
    print(mod.flag)
    mod.count += 1
    return x + mod.count


mod = types.ModuleType("ember_test_scratch")
mod.flag = False
mod.count = 0


def test_python_module_attributes_across_break():
    def state():
        return (mod.flag, mod.count)

    def reset():
        mod.flag = False
        mod.count = 0

    case = Case(module_attr_program, lambda: (x0.clone(),), 1, 1, state, reset)
    check_counts(case, check_case(case))


# ---------------------------------------------------------------- liveness
def dead_int_local(x, n):
    k = n * 2
    y = x * k
    print("dead k")
    return y + 1


def test_dead_locals_do_not_travel_to_the_resume_function():
    cnt = CompileCounter()
    compiled = ember.compile(dead_int_local, backend=cnt)
    for n in (1, 2, 3):
        assert_same(compiled(x0, n), dead_int_local(x0, n))
    # the first half specializes on n, then (automatic dynamic) takes it as an int symbol;
    # the resume function sees only y
    assert cnt.frame_count == 3


def dead_tensor_local(x):
    tmp = x * 3
    y = tmp.sin()
    print("dead tmp")
    return y


def test_dead_tensors_are_not_graph_outputs():
    cnt = CompileCounter()
    compiled = ember.compile(dead_tensor_local, backend=cnt)
    assert_same(compiled(x0), dead_tensor_local(x0))
    output = next(n for n in cnt.graphs[0].graph.nodes if n.op == "output")
    assert len(output.args[0]) == 1  # y, not tmp


def live_on_one_side(x, flag):
    a = x + 1
    b = x + 2
    if x.sum() > 0:
        return a
    return b * flag


@pytest.mark.parametrize("sign", [1, -1])
def test_locals_live_on_either_side_of_a_branch_travel(sign):
    compiled = ember.compile(live_on_one_side, backend="eager")
    for _ in range(2):
        assert_same(compiled(x0.abs() * sign, 3), live_on_one_side(x0.abs() * sign, 3))


def test_ember_logs_environment_variable(tmp_path):
    """EMBER_LOGS=graph_breaks,side_effects, read at import, logs each break with its reason
    and place and each replayed mutation, on stderr."""
    import os
    import subprocess
    import sys

    script = tmp_path / "program.py"
    script.write_text(
        "import torch, ember\n"
        "def f(x, out):\n"
        "    out.append(1)\n"
        "    y = x * 2\n"
        "    print('mid')\n"
        "    return y\n"
        "ember.compile(f, backend='eager')(torch.ones(2), [])\n"
    )
    env = {**os.environ, "EMBER_LOGS": "graph_breaks,side_effects"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "mid\n"
    assert "[ember.graph_breaks]" in done.stderr
    assert BreakReason.UNSUPPORTED_CALL.value in done.stderr
    assert "program.py:5" in done.stderr
    assert "[ember.side_effects] replay contents of L['out']" in done.stderr
