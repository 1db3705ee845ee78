"""Index algebra: simplification must preserve values at every point of the loop ranges."""

from __future__ import annotations

import itertools

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.backend import indexing
from ember.backend.indexing import FloorDiv, ModIdx

x0, x1, x2 = (sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(3))


def _points(ranges):
    return itertools.product(*[range(r) for r in ranges.values()])


def _same(expr, ranges):
    simple = indexing.simplify(expr, ranges)
    names = {s.name: s for s in ranges}
    for point in _points(ranges):
        env = dict(zip(names, point))
        assert indexing.evaluate(expr, env) == indexing.evaluate(simple, env), (expr, simple)
    return simple


sizes = st.lists(st.integers(1, 6), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(src=sizes, dst_perm=st.permutations([0, 1, 2]))
def test_reshape_round_trip_simplifies_and_keeps_values(src, dst_perm):
    n = 1
    for s in src:
        n *= s
    # iterate a 2-d space of n elements, unflatten into `src`, flatten back with strides
    a = max(1, n // max(src[0], 1))
    ranges = {x0: n // a, x1: a} if n % a == 0 else {x0: n, x1: 1}
    flat = x0 * ranges[x1] + x1
    idx = indexing.unflatten(flat, src)
    strides = [1] * len(src)
    for k in range(len(src) - 2, -1, -1):
        strides[k] = strides[k + 1] * src[k + 1]
    expr = indexing.strided(idx, strides)
    simple = _same(expr, ranges)
    assert not simple.has(FloorDiv, ModIdx)


@settings(max_examples=60, deadline=None)
@given(c=st.integers(1, 8), d_mult=st.integers(1, 5), r0=st.integers(1, 7), r1=st.integers(1, 9))
def test_floordiv_and_mod_rules(c, d_mult, r0, r1):
    ranges = {x0: r0, x1: r1}
    d = c * d_mult
    for expr in (
        FloorDiv(c * x0 + x1, d),
        ModIdx(c * x0 + x1, d),
        FloorDiv(x1, d) * d + ModIdx(x1, d),
    ):
        _same(expr, ranges)


@settings(max_examples=60, deadline=None)
@given(outer=st.lists(st.integers(1, 6), min_size=2, max_size=3), c=st.integers(1, 9))
def test_channels_last_row_view_is_one_offset(outer, c):
    """A flat row index over (N, *spatial) read from a channels-last tensor: the pieces of
    the split, each times its stride, join back into `row * C + channel` (batch norm's
    per-channel sums of a channels-last input read memory in order this way)."""
    rows = 1
    for s in outer:
        rows *= s
    ranges = {x0: rows, x1: c}
    n, *spatial = indexing.unflatten(x0, outer)
    inner = 1
    strides = []
    for s in reversed(outer[1:]):
        strides.insert(0, inner * c)
        inner *= s
    expr = indexing.strided([n, x1, *spatial], [inner * c, 1, *strides])
    assert not _same(expr, ranges).has(FloorDiv, ModIdx)


def test_c_printing():
    assert indexing.to_c(3 * x0 + FloorDiv(x1, 4)) in ("((3*x0) + (x1 / 4))", "((x1 / 4) + (3*x0))")
    assert indexing.to_c(ModIdx(x2, 5)) == "(x2 % 5)"


s0, s1 = (sympy.Symbol(f"s{i}", integer=True, positive=True) for i in range(2))
_TERMS = [
    sympy.Integer(1),
    s0,
    s1,
    s0 * s1,
    s0**2,
    FloorDiv(64 * s0 - 1, 64),
    FloorDiv(64 * s0 - 1, s0),
    FloorDiv(3 * s1 + 2, 4 * s1),
    ModIdx(s0, 4),
    sympy.Max(s0, 3),
]


@settings(max_examples=200, deadline=None)
@given(
    coeffs=st.lists(
        st.sampled_from([-767, -3, -1, 0, 0, 0, 0, 1, 2, 64, 768]),
        min_size=len(_TERMS),
        max_size=len(_TERMS),
    )
)
def test_positivity_by_terms_agrees_with_sympy_and_holds(coeffs):
    """The quick positivity proof the index algebra tries before sympy's assumptions (see
    _below): never "positive" where a size value makes the expression <= 0, never "not
    provable" where sympy proves it (the generated index code would change), and whatever
    it cannot classify is left to sympy."""
    e = sympy.Add(*[c * t for c, t in zip(coeffs, _TERMS)])
    quick = indexing._positive_by_terms(e)
    if quick is True:
        for a, b in itertools.product([1, 2, 3, 7, 64, 65, 1000], repeat=2):
            assert e.xreplace({s0: a, s1: b}) > 0, e
    if e.is_positive is True:
        assert quick is not False, e
