"""Values made in the trace and alive across a graph break are rebuilt as real Python
objects by the break code (issue 12; Dynamo's `reconstruct`): functions made by
MAKE_FUNCTION (defaults, keyword defaults, annotations, closures), `functools.partial` of
them, and the cells they close over. Before, any of them alive at a break made the whole
frame run eagerly.

A cell of the frame is one object shared by the rebuilt functions and the frame's resume
function (which receives its cells as cell objects): a write after the break on either
side is seen by the other, as in Python. Each program is compared with eager (values,
printed output, identities, twice) and with Dynamo's capture (no more graphs, breaks or
eager frames)."""

from __future__ import annotations

import functools

import pytest
import torch
from fidelity_harness import check, tensors

import ember
from ember.testing import CountingBackend


def closure_with_defaults(x):
    k = x.cos()

    def f(y, scale=2, *, shift=1):
        return y * scale + shift + k

    print("break")
    return f(x), f(x, 3, shift=2)


def cell_written_after_the_break(x):
    k = 1

    def get():
        return k

    x = x + 1
    print("break")
    k = 5
    return x * get(), get()


def closure_writes_nonlocal_after_the_break(x):
    total = x.sum()

    def add(v):
        nonlocal total
        total = total + v

    print("break")
    add(x.max())
    add(2)
    return total


def callee_at_the_break_writes_nonlocal(x):
    seen = []
    count = 0

    def note(v):
        nonlocal count
        count += 1
        print("note", count)
        seen.append(v)

    note(x.sum())
    count = count * 10
    note(x.max())
    return seen, count


def partial_of_a_closure(x):
    bias = x.sin()

    def h(a, b, c=1):
        return a * b + c + bias

    p = functools.partial(h, 3, c=2)
    q = p
    print("break")
    return p(x), q is p, p.args, sorted(p.keywords)


def partial_of_a_torch_function(x):
    g = functools.partial(torch.add, alpha=2)
    print("break")
    return g(x, x)


def lambdas_in_a_list(x):
    fs = [lambda t: t.sin(), lambda t, n=2: t * n]
    x = x * 2
    print("break")
    return [f(x) for f in fs]


def recursive_local_function(x):
    def power(t, n):
        return t if n == 1 else t * power(t, n - 1)

    print("break")
    return power(x, 3)


def returns_closures_sharing_a_cell(x):
    n = x.sum()

    def bump(by=1):
        nonlocal n
        n = n + by
        return n

    def read() -> torch.Tensor:
        return n

    print("break")
    bump()
    return bump, read


def annotated_local_function(x):
    def f(a: torch.Tensor, b: int = 1) -> torch.Tensor:
        return a + b

    print("break")
    return f(x), f.__annotations__, f.__name__, f.__qualname__, f.__defaults__


def empty_cell_at_the_break(x):
    def g():
        return k * x

    print("break")
    k = 3
    return g()


def default_made_from_a_tensor(x):
    y = x.cos()

    def f(t, bias=y):
        return t + bias

    print("break")
    return f(x), f.__defaults__[0] is y


PROGRAMS = [
    empty_cell_at_the_break,
    default_made_from_a_tensor,
    closure_with_defaults,
    cell_written_after_the_break,
    closure_writes_nonlocal_after_the_break,
    callee_at_the_break_writes_nonlocal,
    partial_of_a_closure,
    partial_of_a_torch_function,
    lambdas_in_a_list,
    recursive_local_function,
    annotated_local_function,
]


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_value_alive_across_a_break_is_rebuilt(fn):
    counts = check(fn, tensors((3,)))
    assert counts.eager_frames == 0 and counts.breaks >= 1


HOOKS: list = []


def closure_escapes_to_a_global_list(x):
    scale = x.sum()

    def hook(t):
        return t * scale

    HOOKS.append(hook)
    print("break")
    scale = scale + 1
    return hook(x)


def test_a_closure_stored_outside_shares_the_cell_the_frame_writes_later():
    """The hook appended to a global list (a ledger write) is the rebuilt function over the
    same cell as the resume function's `scale`: calling it afterwards sees the new value."""
    check(
        closure_escapes_to_a_global_list,
        tensors((2,)),
        state=lambda: [h(torch.ones(2)) for h in HOOKS],
        reset=HOOKS.clear,
    )


def apply_twice(x, f):
    return f(f(x)) + 1


def make_adder(t):
    def add(v):
        return v + t

    return add


def test_closures_passed_in_are_guarded_by_code_and_cells():
    """A closure argument made anew on each call is guarded by its code and its cell's
    contents (a tensor: its metadata), not by its identity: no recompile per call."""
    ember.reset()
    compiled = ember.compile(apply_twice, backend=CountingBackend("eager"))
    for i in range(4):
        t = torch.full((2,), float(i))
        torch.testing.assert_close(compiled(torch.ones(2), make_adder(t)), 1 + 2 * t + 1)
    assert ember.stats()["recompiles"] == 0
    torch.testing.assert_close(compiled(torch.ones(2), lambda v: v * 3), torch.full((2,), 10.0))


def test_closures_returned_after_a_break_share_their_cell():
    """The functions returned are real closures over one cell: calling them afterwards,
    outside the compiled code, behaves as the eager ones do."""
    x = torch.arange(3.0)
    bump, read = returns_closures_sharing_a_cell(x)
    ember.reset()
    cbump, cread = ember.compile(returns_closures_sharing_a_cell, backend="eager")(x)
    assert ember.stats()["eager_frames"] == 0
    assert cbump.__closure__[0] is cread.__closure__[0]
    assert (cbump.__name__, cbump.__qualname__, cbump.__defaults__) == (
        bump.__name__,
        bump.__qualname__,
        bump.__defaults__,
    )
    assert cread.__annotations__ == read.__annotations__
    bump(10)
    cbump(10)
    torch.testing.assert_close(cread(), read())


def test_rebuilt_closures_do_not_recompile():
    """The resume function receives a new function object on every call: it is guarded by
    its code and cell contents, not its identity, so later calls reuse the capture, and a
    changed cell content is seen (a recompile, not a stale value)."""
    ember.reset()
    compiled = ember.compile(closure_with_defaults, backend=CountingBackend("eager"))
    for _ in range(3):
        x = torch.randn(3)
        for got, want in zip(compiled(x), closure_with_defaults(x)):
            torch.testing.assert_close(got, want)
    assert ember.stats()["recompiles"] == 0


def make_scaler(k):
    def scale(x):
        return x * k

    return scale


def test_closures_of_one_code_keep_their_own_cells():
    """Two closures of the same code compiled with the same options: each reads its own
    cell (the cache is per closure). Before, a closure called at a graph break, wrapped
    anew on each call, could find the entries of an earlier closure and compute with that
    closure's cells."""
    ember.reset()

    def outer(x, k):
        def f(y):
            print("in f")
            return y * k

        return f(x) + 1

    compiled = ember.compile(outer, backend="eager")
    x = torch.ones(2)
    for k in (2, 3, 3, 4, 2):
        torch.testing.assert_close(compiled(x, k), x * k + 1)
    a, b = ember.compile(make_scaler(2)), ember.compile(make_scaler(3))
    torch.testing.assert_close(a(x), x * 2)
    torch.testing.assert_close(b(x), x * 3)


# Lazy iterators alive across a break. One that can be computed ahead without a visible
# side effect is (its items enter the graph before the break); one that cannot (a callback
# that prints, appends or draws random numbers) is made again lazily by the break code over
# its rebuilt function and the iterators it pulls, and CPython pulls it after the break, in
# order. A list or tuple iterator (and a map, filter or zip over them) that a resume
# function receives is traced over its sequence from where it stands.


def map_with_a_printing_callback(x):
    def f(t):
        print("f", t.sum().item() > -100)
        return t * 2

    m = map(f, [x, x + 1, x + 2])
    first = next(m)
    print("break")
    return first, list(m)


def zip_enumerate_filter_in_locals(x):
    xs = [x, x * 2, x * 3]
    z = zip(xs, range(3))
    e = enumerate(xs, 1)
    flt = filter(lambda t: t.sum() > 0, xs)
    next(e)
    print("break")
    return list(z), list(e), list(flt)


def map_as_a_loop_iterator(x):
    out = []
    for y in map(lambda t: t + 1, [x, x * 2]):
        print("item")
        out.append(y)
    return out


def list_iterator_sees_appends_after_the_break(x):
    xs = [x, x + 1]
    it = iter(xs)
    a = next(it)
    print("break")
    xs.append(x + 2)
    return a, list(it)


def tuple_iterator_argument(x, it):
    first = next(it)
    return x * first, [x + v for v in it]


ITERATOR_PROGRAMS = [
    zip_enumerate_filter_in_locals,
    map_as_a_loop_iterator,
    list_iterator_sees_appends_after_the_break,
]


@pytest.mark.parametrize("fn", ITERATOR_PROGRAMS, ids=lambda f: f.__name__)
def test_iterator_alive_across_a_break_is_rebuilt(fn):
    check(fn, tensors((3,)))


def test_a_rebuilt_map_calls_its_callback_through_ember():
    """The rebuilt map's callback is compiled when CPython calls it (its `t.sum()` and
    `t * 2` are in graphs), lazily, in eager's order. It breaks at `.item()` (ember has no
    symbolic floats; Dynamo's capture of `item() > -100` keeps more of it in its graphs) and
    at the print, and each place that pulls the map sees those breaks again: 3 graphs, 7
    breaks, 4 ops here, where Dynamo has 4 graphs, 6 breaks, 6 ops. Before the callback was
    compiled, it ran uncaptured (1 graph, 3 breaks, 2 ops)."""
    counts = check(map_with_a_printing_callback, tensors((3,)), dynamo=False)
    assert counts.eager_frames == 0
    assert counts.ops >= 4


def test_iterators_from_outside_are_traced_and_left_where_eager_leaves_them():
    """A tuple iterator passed in is pulled in the trace and moved on by the replay: the
    caller's iterator is exhausted afterwards, as eagerly."""

    def make():
        return torch.ones(2), iter((1.0, 2.0, 3.0))

    ember.reset()
    compiled = ember.compile(tuple_iterator_argument, backend=CountingBackend("eager"))
    for _ in range(2):
        x, it = make()
        got = compiled(x, it)
        assert list(it) == []
        x2, it2 = make()
        want = tuple_iterator_argument(x2, it2)
        torch.testing.assert_close(got, want)
    stats = ember.stats()
    assert (stats["graph_breaks"], stats["eager_frames"], stats["recompiles"]) == (0, 0, 0)
    half = iter((1.0, 2.0, 3.0))
    next(half)
    out = compiled(torch.ones(2), half)  # another position: guarded, captured again
    torch.testing.assert_close(out[0], torch.full((2,), 2.0))


def zip_of_a_printing_map_in_a_comprehension(x):
    def f(t):
        print("f")
        return t + 1

    z = zip(map(f, [x, x * 2]), "ab")
    print("break")
    return [(t * 2, c) for t, c in z]


def test_a_pull_whose_callback_breaks_resumes_the_loop():
    """The map's function breaks while the comprehension's FOR_ITER pulls it: break code
    runs the pull (`next(it, <end>)`) and resumes the loop's body, or past the loop. Before,
    the frame ran eagerly. Each pull is a break of its own here (3 graphs, 3 breaks, no
    eager frame) where Dynamo counts 2 and 2: it runs the rest of the comprehension in
    CPython."""
    counts = check(zip_of_a_printing_map_in_a_comprehension, tensors((3,)), dynamo=False)
    assert counts.eager_frames == 0


def generator_with_prints_across_a_break(x):
    def gen():
        for i in range(3):
            print("gen", i)
            yield x * i

    g = gen()
    first = next(g)
    print("break")
    return first, list(g)


def test_a_generator_that_cannot_be_rebuilt_ends_the_graph_where_it_is_made():
    """A generator's frame cannot be made again by break code, and pulling it ahead would
    print early: the graph ends where the generator is made (CPython makes it and pulls
    it; the rest of the frame is captured), and the reason names the generator, the break
    and the line that made it. Dynamo skips the frame (0 graphs, 1 break, 1 frame skipped);
    before, ember ran it eagerly too."""
    counts = check(generator_with_prints_across_a_break, tensors((2,)))
    assert counts.eager_frames == 0
    reason = ember.stats()["break_reasons"][0]
    assert "generator generator_with_prints_across_a_break.<locals>.gen is made here" in reason
    assert "alive at the graph break at" in reason
    assert "test_fidelity_rebuild.py:" in reason


def p_builtin_method_of_a_c_object(x):
    import random

    r = random.Random(0)
    a = r.random()  # the bound C method is alive at the break (its call breaks)
    return x * a, a


def test_a_builtin_method_alive_at_a_break_is_rebuilt():
    """`obj.method()` of a C object ember cannot call: LOAD_METHOD made a builtin method in
    the trace and its call breaks, so break code rebuilds it (`descriptor.__get__(obj)`).
    Before, the frame ran eagerly ("cannot be rebuilt after the graph"). Not compared with
    Dynamo: it models random.Random and makes no break here (ember: 2)."""
    counts = check(p_builtin_method_of_a_c_object, tensors((3,)), dynamo=False)
    assert counts.eager_frames == 0
    assert counts.graphs == 1
