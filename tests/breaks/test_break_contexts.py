"""Breaks inside grad-mode blocks, try blocks, inlined user functions and nn.Module methods.

Grad-mode blocks resume (the grad mode is right on both sides of the break and after the
call, and results carry eager's requires_grad); try blocks and `with` blocks of context managers
written in Python resume inside the block (tests/capture/test_exceptions.py has more); a break
inside an inlined call is taken in the callee's frame (one graph up to it), whose rest and its
callers' rest after their calls continue as resume functions (capture/nested.py;
tests/capture/test_fidelity_nested.py compares such programs with Dynamo)."""

from __future__ import annotations

import pytest
import torch
from break_harness import Case, check_case, check_counts, ids

import ember
from ember.capture import cache
from ember.testing import CompileCounter, assert_same

x0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
MODES: list = []


def t() -> torch.Tensor:
    return x0.clone()


def leaf():
    return (x0.clone().requires_grad_(),)


@ember.disable
def record_mode(tag):
    """A call ember cannot trace that records the grad mode it runs under."""
    MODES.append((tag, torch.is_grad_enabled()))


def _reset_modes():
    MODES.clear()


def _modes():
    return list(MODES)


def grad(fn, graphs, breaks, eager=0, make=leaf):
    return Case(fn, make, graphs, breaks, _modes, _reset_modes, eager=eager)


# ---------------------------------------------------------------- grad mode
def no_grad_print(x):
    with torch.no_grad():
        y = x * 2
        record_mode("in")
    return y + 1


def no_grad_work_after_break(x):
    a = x.sin()
    with torch.no_grad():
        b = x * 2
        record_mode("in")
        c = b + a
    record_mode("out")
    return a + c, b, c


def no_grad_only_break(x):
    with torch.no_grad():
        record_mode("in")
    return x * 2


def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
            record_mode("inner")
            c = b * 2
        d = a + c
    return d, c


def set_grad_enabled_false_block(x):
    with torch.set_grad_enabled(False):
        y = x.exp()
        record_mode("set")
    return y, x * 2


def no_grad_two_breaks(x):
    with torch.no_grad():
        a = x + 1
        record_mode("one")
        b = a * 2
        record_mode("two")
    return b + x


def no_grad_item(x):
    with torch.no_grad():
        s = x.abs().sum().item()
    return x * s


def no_grad_branch(x):
    with torch.no_grad():
        if x.sum() > 0:
            y = x * 2
        else:
            y = x * 3
    return y + x


def no_grad_loop_break(x):
    with torch.no_grad():
        for i in range(2):
            x = x + i
            record_mode(i)
    return x


def no_grad_break_in_helper(x):
    with torch.no_grad():
        y = helper_records(x)
    return y + x


def helper_records(y):
    z = y * 2
    record_mode("helper")
    return z + 1


def no_grad_then_print_outside(x):
    with torch.no_grad():
        y = x * 2
    record_mode("after")
    return y + x


def grad_mode_statement_then_break(x):
    before = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    y = x * 2
    record_mode("off")
    torch.set_grad_enabled(before)
    return y + x


def no_grad_decorated_helper(x):
    return decorated(x) + x


@torch.no_grad()
def decorated(y):
    record_mode("decorated")
    return y * 2


GRAD_CASES = [
    grad(no_grad_print, 2, 1),
    grad(no_grad_work_after_break, 3, 2),
    grad(no_grad_only_break, 1, 1),
    grad(enable_grad_inside_no_grad, 2, 1),
    grad(set_grad_enabled_false_block, 2, 1),
    grad(no_grad_two_breaks, 3, 2),
    grad(no_grad_item, 2, 1),
    grad(no_grad_branch, 2, 1),
    grad(no_grad_loop_break, 2, 2),
    grad(no_grad_break_in_helper, 3, 1),  # taken once, in the helper (was also at its call)
    grad(no_grad_then_print_outside, 2, 1),
    grad(grad_mode_statement_then_break, 2, 1),
    grad(no_grad_decorated_helper, 2, 1),  # once, inside the decorator's `with` block
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=ids(GRAD_CASES))
@pytest.mark.parametrize("outer", [True, False], ids=["grad", "outer_no_grad"])
def test_break_in_grad_mode_block(case, outer):
    torch.set_grad_enabled(outer)
    record = check_case(case)
    check_counts(case, record)
    assert torch.is_grad_enabled() is outer


@pytest.mark.parametrize("case", GRAD_CASES, ids=ids(GRAD_CASES))
def test_break_in_grad_mode_block_through_aot(case):
    """The same programs through AOT autograd: each resume function is called in the grad
    mode outside the block and switches it in its graph, as a whole graph would."""
    record = check_case(case, backend="aot_eager")
    check_counts(case, record)
    assert torch.is_grad_enabled()


def test_grad_mode_restored_when_the_broken_call_raises():
    def boom():
        raise ValueError("boom")

    def f(x):
        with torch.no_grad():
            y = x * 2
            boom()
        return y

    compiled = ember.compile(f, backend="eager")
    for _ in range(2):
        with pytest.raises(ValueError, match="boom"):
            compiled(t())
        assert torch.is_grad_enabled()


def test_gradients_flow_through_a_resumed_function():
    def f(x, w):
        h = x @ w
        record_mode("mid")
        return (h.relu() * 2).sum()

    w0 = torch.randn(3, 5)
    grads = []
    for run in (f, ember.compile(f, backend="eager")):
        x, w = t().requires_grad_(), w0.clone().requires_grad_()
        run(x, w).backward()
        grads.append((x.grad, w.grad))
    assert_same(grads[1], grads[0])


# ---------------------------------------------------------------- try blocks
def try_print(x):
    try:
        y = x * 2
        print("inside try")
    except RuntimeError:
        y = x
    return y + 1


def try_finally_print(x, out):
    try:
        y = x * 2
        print("try")
    finally:
        out.append("finally")
    return y


def try_item(x):
    try:
        s = x.sum().item()
    except ValueError:
        s = 0.0
    return x * s


def try_break_raises_and_is_caught(x):
    try:
        y = x * 2
        int("not a number")
    except ValueError:
        y = x * 3
    return y


def with_user_context_break(x, out):
    with Recorder(out):
        y = x + 1
        print("in recorder")
    return y


class Recorder:
    def __init__(self, out):
        self.out = out

    def __enter__(self):
        self.out.append("enter")
        return self

    def __exit__(self, *exc):
        self.out.append("exit")
        return False


def break_before_try(x):
    y = x * 2
    print("before")
    try:
        z = y + 1
    except RuntimeError:
        z = y
    return z


TRY_CASES = [
    Case(try_print, lambda: (t(),), 2, 1),
    Case(try_finally_print, lambda: (t(), []), 1, 1),
    Case(try_item, lambda: (t(),), 2, 1),
    Case(try_break_raises_and_is_caught, lambda: (t(),), 1, 0),  # traced: int() raises
    Case(with_user_context_break, lambda: (t(), []), 1, 1),
    Case(break_before_try, lambda: (t(),), 2, 1),
]


@pytest.mark.parametrize("case", TRY_CASES, ids=ids(TRY_CASES))
def test_break_in_try_block(case):
    check_counts(case, check_case(case))


# ---------------------------------------------------------------- inlined functions
def inner_print(y):
    z = y * 3
    print("inner")
    return z + 1


def middle(y):
    return inner_print(y * 2) - 1


def calls_inner(x):
    a = x + 1
    b = inner_print(a)
    return b - 1


def calls_middle(x):
    return middle(x.cos()).sin()


def calls_inner_twice(x):
    return inner_print(x) + inner_print(x * 2)


def inner_branch(y):
    if y.sum() > 0:
        return y * 2
    return -y


def calls_inner_branch(x):
    return inner_branch(x + 1) + 1


def inner_mutates(y, out):
    out.append(1)
    print(len(out))
    out.append(2)
    return y * len(out)


def calls_inner_mutates(x, out):
    out.append(0)
    return inner_mutates(x, out) + len(out)


def inner_kw(y, *, scale=1.0, shift=0.0):
    print("kw", scale, shift)
    return y * scale + shift


def calls_inner_kwargs(x):
    return inner_kw(x, scale=2.0, shift=1.0)


def inner_varargs(*ys):
    print(len(ys))
    return sum(ys)


def calls_inner_varargs(x):
    return inner_varargs(x, x * 2, x * 3)


def make_adder(k):
    def add(y):
        print("adder", k)
        return y + k

    return add


ADD3 = make_adder(3)


def calls_closure(x):
    return ADD3(x) * 2


def calls_lambda_with_break(x):
    f = lambda y: y * (y.sum().item() > 0)  # noqa: E731  (a lambda is what is under test)
    return f(x) + 1


class Helper:
    def __init__(self):
        self.count = 0

    def run(self, y):
        self.count += 1
        print("helper", self.count)
        return y * self.count


HELPER = Helper()


def calls_method(x):
    return HELPER.run(x) + HELPER.count


# Dynamo (torch 2.13, counted as tests/capture/fidelity_harness.py does) breaks once per
# frame on the way: 4/2, 6/3, 4/3, 4/2, 2/2, 1/2, 2/2, 2/2, 3/2 graphs/breaks in this order.
INLINE_CASES = [
    Case(calls_inner, lambda: (t(),), 3, 1),
    Case(calls_middle, lambda: (t(),), 4, 1),
    Case(calls_inner_twice, lambda: (t(),), 4, 2),
    Case(calls_inner_branch, lambda: (t(),), 3, 1),
    Case(calls_inner_mutates, lambda: (t(), []), 2, 1),
    Case(calls_inner_kwargs, lambda: (t(),), 1, 1),
    Case(calls_inner_varargs, lambda: (t(),), 2, 1),
    Case(calls_closure, lambda: (t(),), 2, 1),
    Case(calls_lambda_with_break, lambda: (t(),), 3, 1),
]


@pytest.mark.parametrize("case", INLINE_CASES, ids=ids(INLINE_CASES))
def test_break_in_inlined_function(case):
    check_counts(case, check_case(case))


def test_break_in_method_of_global_object():
    HELPER.count = 0
    compiled = ember.compile(calls_method, backend="eager")
    first = compiled(t())
    HELPER.count = 0
    assert_same(first, calls_method(t()))
    assert HELPER.count == 1


def test_the_break_is_taken_in_the_callee():
    """The callee is not captured again on its own (its rest runs as a resume function),
    and the graph before the break holds the caller's and the callee's work."""
    cnt = CompileCounter()
    compiled = ember.compile(calls_inner, backend=cnt)
    compiled(t())
    assert not cache.cache_for(inner_print.__code__).entries
    first = [getattr(n.target, "__name__", "") for n in cnt.graphs[0].graph.nodes]
    assert first.count("add") == 1 and first.count("mul") == 1  # x + 1, then y * 3


# ---------------------------------------------------------------- modules
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.seen = 0

    def forward(self, x):
        self.seen += 1
        h = self.lin(x)
        print("block", self.seen)
        return h.tanh()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Block()
        self.second = torch.nn.Linear(3, 2)

    def forward(self, x):
        h = self.first(x)
        return self.second(h).relu()


class HelperMethodNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def helper(self, h):
        if h.sum() > 0:
            return h * 2
        return h

    def forward(self, x):
        return self.helper(self.lin(x)) + 1


class DataDependentNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.steps: list = []

    def forward(self, x):
        h = self.lin(x)
        n = int(h.abs().sum().item()) % 3
        self.steps.append(n)
        for _ in range(n):
            h = h * 0.5
        return h


def twin(cls):
    torch.manual_seed(3)
    a = cls()
    b = cls()
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("cls", [Block, Net, HelperMethodNet, DataDependentNet])
def test_module_with_break_matches_eager(cls):
    eager, comp = twin(cls)
    compiled = ember.compile(comp, backend="eager")
    for _ in range(2):
        x = t().requires_grad_()
        assert_same(compiled(x), eager(x))
    assert_same(vars(comp).get("seen"), vars(eager).get("seen"))
    assert_same(getattr(comp, "steps", None), getattr(eager, "steps", None))
    for p, q in zip(comp.parameters(), eager.parameters()):
        assert_same(p, q)


def test_a_break_in_a_submodule_forward_is_taken_inside_it():
    eager, comp = twin(Net)
    cnt = CompileCounter()
    compiled = ember.compile(comp, backend=cnt)
    assert_same(compiled(t()), eager(t()))
    assert not cache.cache_for(Block.forward.__code__).entries
    ops = [[getattr(n.target, "__name__", "") for n in g.graph.nodes] for g in cnt.graphs]
    assert "linear" in ops[0]  # the block's linear is in the graph before the break
    assert cnt.frame_count == 3  # before the print, tanh, the second linear and relu
    assert_same(compiled(t()), eager(t()))  # `seen` changed: guarded, captured again


def test_long_for_loop_of_breaks_settles_into_eager():
    """Each iteration's resume function sees a shorter rest of the range (a new guard), so
    after the recompile limit the rest of the loop runs eagerly, with the right result."""

    def f(x, n):
        for _ in range(n):
            x = x + 1
            record_mode("step")
        return x

    _reset_modes()
    compiled = ember.compile(f, backend="eager")
    with pytest.warns(UserWarning, match="recompile limit"):
        assert_same(compiled(t(), 60), f(t(), 60))


def test_long_while_loop_of_breaks_does_not_exhaust_the_stack():
    """A data-dependent while loop breaks at its test on every iteration and continues in the
    same resume function; the nesting is cut off before Python's recursion limit."""

    def f(x):
        while x.sum() < 1500:
            x = x + 1
        return x

    cnt = CompileCounter()
    compiled = ember.compile(f, backend=cnt)
    for _ in range(2):
        assert_same(compiled(torch.zeros(1)), f(torch.zeros(1)))
    assert cnt.frame_count <= 3  # the first graph and the loop's resume functions, reused


_SCRATCH = None


def raise_in_block_after_resume(x, fail):
    global _SCRATCH
    with torch.no_grad():
        y = x * 2
        record_mode("in")
        _SCRATCH = 2
        del _SCRATCH  # a break ember cannot resume after: the resume function runs eagerly
        y = y * 2
        z = (y + 1) * check(fail)  # raises with values on the stack above the block's
    return z


def check(fail):
    if fail:
        raise ValueError("late")
    return 1


@pytest.mark.parametrize("fail", [False, True])
def test_exception_in_a_resumed_grad_block_runs_its_handler(fail):
    """The resume function's copy of the block keeps the handler with the original stack
    depth: the exception leaves the block (grad mode restored) and reaches the caller."""
    compiled = ember.compile(raise_in_block_after_resume, backend="eager")
    for _ in range(2):
        if fail:
            with pytest.raises(ValueError, match="late"):
                compiled(leaf()[0], True)
        else:
            assert_same(compiled(leaf()[0], False), raise_in_block_after_resume(leaf()[0], False))
        assert torch.is_grad_enabled()
    resumed = [k[0] for k, c in cache._caches.items() if c.eager_reason is not None]
    assert any(code.co_name.startswith("__resume_") for code in resumed)
