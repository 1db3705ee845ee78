"""Probe round 13 (issue 12): small programs over Python corners that model code and
Dynamo's own tests use (tensor attributes, generators' return values, `in` and `remove` on
lists of tensors, seeds, modules made in the trace, ...), each compared with eager and with
Dynamo's counts through fidelity_harness."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
from fidelity_harness import check, tensors

import ember

# wrong answers


def p_tensor_class_is_its_type(x):
    cls = x.__class__
    return cls is torch.Tensor, x.__class__.__name__, (x + 1).__class__ is type(x)


def p_parameter_class(x):
    p = torch.nn.Parameter(torch.ones(4))
    return p.__class__ is torch.nn.Parameter, x * p.detach()


def p_generator_return_value_through_next(x):
    def inner():
        yield 1
        return x * 3

    it = inner()
    next(it)
    seen = []
    for _ in range(2):  # the value comes with the first StopIteration only
        try:
            next(it)
        except StopIteration as e:
            seen.append((e.value, e.args))
    return seen


def p_generator_return_value_through_yield_from(x):
    def inner():
        yield 1
        return x * 3

    def outer():
        v = yield from inner()
        return v + 1

    it = outer()
    next(it)
    try:
        next(it)
    except StopIteration as e:
        return e.value


def p_generator_send_bare_return(x):
    def inner():
        a = yield 1
        if a is None:
            return
        yield 2

    it = inner()
    next(it)
    try:
        it.send(None)
    except StopIteration as e:
        return e.value, e.args, x


def p_tensor_in_list_compares_with_eq(x):
    y = x + 0
    try:
        found = y in [x]  # not the same object: `y == x`, whose truth is ambiguous
    except RuntimeError:
        found = "ambiguous"
    return found, y in [y], x in [x, y]


def p_list_remove_compares_with_eq(x):
    y = x + 1
    items = [x, y]
    try:
        items.remove(y)  # `x == y` first
    except RuntimeError:
        return len(items), "ambiguous"
    return len(items)


@pytest.mark.parametrize(
    "program",
    [
        p_tensor_class_is_its_type,
        p_parameter_class,
        p_generator_return_value_through_next,
        p_generator_return_value_through_yield_from,
        p_generator_send_bare_return,
        p_tensor_in_list_compares_with_eq,
        p_list_remove_compares_with_eq,
    ],
)
def test_wrong_answers(program):
    check(program, tensors((4,)))


def p_module_made_in_trace_leaves_the_generator(x):
    lin = torch.nn.Linear(4, 4)  # made at a break: capturing it must draw nothing
    return lin(x), torch.rand(2)


def test_module_made_in_trace_leaves_the_generator():
    check(
        p_module_made_in_trace_leaves_the_generator,
        tensors((4,)),
        reset=lambda: torch.manual_seed(0),
    )


# crashes


def p_seed_then_draw(x):
    torch.random.manual_seed(3)  # torch.manual_seed before torch._dynamo replaces it
    a = torch.rand(4)
    return x + a + torch.randn(4)


def p_seed_then_module(x):
    torch.random.manual_seed(0)
    return torch.nn.Linear(4, 4)(x)


@pytest.mark.parametrize("program", [p_seed_then_draw, p_seed_then_module])
def test_seeding_runs_in_python(program):
    check(program, tensors((4,)))


def p_register_buffer_on_module_made_in_trace(x):
    m = torch.nn.Module()
    m.register_buffer("b", torch.ones(4))  # breaks inside: one module, not one per frame
    return x + m.b, [name for name, _ in m.named_buffers()]


def p_init_functions_on_module_made_in_trace(x):
    m = torch.nn.Linear(4, 4)

    def init(mod):
        if isinstance(mod, torch.nn.Linear):
            torch.nn.init.constant_(mod.weight, 0.5)
            torch.nn.init.zeros_(mod.bias)

    m.apply(init)
    return m(x)


def p_local_lru_cache(x):
    @functools.lru_cache(None)
    def k(n):
        return n * 2

    return x * k(3) + k(3)


def test_register_buffer_on_module_made_in_trace():
    # Dynamo: 1 graph, no break; ember breaks twice inside register_buffer (a module made
    # in the trace holds no tensors yet)
    check(p_register_buffer_on_module_made_in_trace, tensors((4,)), dynamo=False)


def test_init_functions_on_module_made_in_trace():
    check(p_init_functions_on_module_made_in_trace, tensors((4,)))


def test_local_lru_cache():
    # Dynamo: 1 graph, 1 break; ember breaks inside lru_cache's decorator
    counts = check(p_local_lru_cache, tensors((4,)), dynamo=False)
    assert counts.eager_frames == 0


class _Overriding(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


PARAM = torch.nn.Parameter(torch.ones(4))


def p_has_torch_function(x):
    checks = torch.overrides
    return (
        checks.has_torch_function_variadic(x, PARAM),
        checks.has_torch_function_unary(x),
        checks.has_torch_function((x, PARAM, 3)),
        x + 1,
    )


def test_has_torch_function_of_plain_tensors_and_parameters():
    check(p_has_torch_function, tensors((4,)))


def test_has_torch_function_of_a_subclass():
    def make():
        return (torch.ones(4).as_subclass(_Overriding),)

    def fn(x):
        return torch.overrides.has_torch_function_unary(x)

    assert ember.compile(fn, backend="eager")(*make()) is True


# whole frames that ran eagerly


class _Named:
    def __init__(self, n):
        self.n = n

    def __repr__(self):
        return f"Named({self.n})"

    def __str__(self):
        return f"<{self.n}>"


class _OnlyRepr:
    def __repr__(self):
        return "R"


class _Formatted:
    def __format__(self, spec):
        return "F" + spec


NAMED = _Named(5)


def p_objects_own_text_methods(x):
    o = _Named(3)
    r = _OnlyRepr()
    texts = (str(o), repr(o), f"{o}", f"{o!r}", f"{o!s:>6}", str(r), f"{r}")
    return x + o.n, texts, str(NAMED)


def p_objects_own_format(x):
    return x * 2, f"{_Formatted():xy}", format(_Formatted(), "q")


@pytest.mark.parametrize("program", [p_objects_own_text_methods, p_objects_own_format])
def test_objects_own_text_methods(program):
    # in one graph (they ran eagerly, at FORMAT_VALUE); Dynamo fails on both programs
    # (AttributeError in the object's repr; InternalTorchDynamoError on __format__)
    check(program, tensors((4,)), dynamo=False, fullgraph=True)


def p_grad_mode_decorating_a_local_function(x):
    @torch.no_grad()
    def f(y):
        return y * 2

    return f(x).requires_grad, f(x), x * 3


def p_set_grad_enabled_object_as_decorator(x):
    g = torch.set_grad_enabled(False)
    y = x * 2
    torch.set_grad_enabled(True)

    @g
    def f(t):
        return t + 1

    return f(x).requires_grad, y.requires_grad, torch.is_grad_enabled()


def _requiring_grad():
    return (torch.ones(4, requires_grad=True),)


def test_grad_mode_contexts_as_decorators():
    # traced as Dynamo traces it (round 13b; it was a break at the decoration)
    check(p_grad_mode_decorating_a_local_function, _requiring_grad)
    # a set_grad_enabled object (which set the mode when made): a break at the decoration
    # (the context is made again there) where the frame ran eagerly; Dynamo traces the
    # decorated call without a break
    counts = check(p_set_grad_enabled_object_as_decorator, _requiring_grad, dynamo=False)
    assert counts.breaks == 1


def p_slice_objects(x):
    s = slice(1, None, 2)
    items = list(range(6))
    return x[s], items[s], s.start, s.indices(6), x[slice(None)]


def p_range_methods(x):
    r = range(2, 10, 3)
    return x + len(r) + r[1] + r[-1] + (5 in r), list(r[::-1]), r.index(5), r.count(8)


@pytest.mark.parametrize("program", [p_slice_objects, p_range_methods])
def test_slice_and_range_methods(program):
    # slice.indices ran the frame eagerly (a slice made in the trace could not be rebuilt);
    # range.index broke
    check(program, tensors((6,)))


# where ember broke and Dynamo did not


class _Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return (self.x, self.y) == (other.x, other.y)

    __hash__ = None


def p_not_equal_from_eq_only(x):
    p = _Point(1, 2)
    return x + (p == _Point(1, 2)) + (p != _Point(2, 1)), p != _Point(1, 2)


def test_not_equal_from_eq_only():
    check(p_not_equal_from_eq_only, tensors((4,)))


def p_functools_wraps_in_trace(x):
    def deco(fn):
        @functools.wraps(fn)
        def inner(*a):
            return fn(*a) * 2

        return inner

    @deco
    def base(t):
        "doc"
        return t + 1

    base.tag = 5
    return base(x), base.__name__, base.__doc__, base.__wrapped__(x), sorted(base.__dict__)


def p_wrapped_function_alive_at_a_break(x):
    def base(t):
        return t + 1

    @functools.wraps(base)
    def inner(t):
        return base(t) * 2

    print("break")
    return inner(x), inner.__name__, inner.__qualname__, inner.__wrapped__ is base


def p_local_contextmanager(x):
    log = []

    @contextlib.contextmanager
    def cm(tag):
        log.append("in " + tag)
        try:
            yield tag * 2
        finally:
            log.append("out " + tag)

    with cm("a") as v, cm("b"):
        y = x + len(v)
    return y, log


@pytest.mark.parametrize(
    "program",
    [p_functools_wraps_in_trace, p_wrapped_function_alive_at_a_break, p_local_contextmanager],
)
def test_function_attributes_written_in_trace(program):
    # functools.wraps broke at its first attribute write on a function made in the trace
    check(program, tensors((4,)))


def test_is_leaf_of_an_input_is_guarded():
    # a wrong answer: the graph captured for a leaf answered True for `x * 2` too
    def fn(x):
        return x.is_leaf, x.grad_fn is None, x * 2

    compiled = ember.compile(fn, backend="eager")
    leaf = torch.ones(2, requires_grad=True)
    for x in (leaf, leaf * 2, leaf, torch.ones(2), leaf * 3):
        expected, actual = fn(x), compiled(x)
        assert actual[:2] == expected[:2]
        torch.testing.assert_close(actual[2], expected[2])


def p_autograd_history_in_graph(x):
    y = x * 2
    z = y.detach() + 1
    return y.is_leaf, z.grad_fn is None, z.is_leaf, x.is_leaf, x.grad_fn is None, y.requires_grad


def test_autograd_history_in_graph():
    check(p_autograd_history_in_graph, _requiring_grad)


@pytest.mark.parametrize(
    ("method", "inputs"),
    [
        ("storage_offset", lambda: [torch.arange(8.0)[:4], torch.arange(8.0)[2:6]]),
        ("is_conj", lambda: [torch.ones(2, dtype=torch.complex64), torch.ones(2) * 1j]),
        ("is_shared", lambda: [torch.ones(2), torch.ones(2).share_memory_()]),
    ],
)
def test_storage_state_of_inputs(method, inputs):
    # wrong answers: the graph captured for the first tensor answered for the second (an
    # offset of 0, no conjugate bit, not shared)
    def fn(x):
        return getattr(x, method)(), x + 1

    first, second = inputs()
    if method == "is_conj":
        second = second.conj()
    compiled = ember.compile(fn, backend="eager")
    for x in (first, second, first, second):
        assert compiled(x)[0] == fn(x)[0]
