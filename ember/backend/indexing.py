"""Index algebra on sympy: strided offsets, floor division and modulo over loop variables.

Indices are non-negative integer expressions, so `FloorDiv` and `ModIdx` are plain C `/` and
`%`. They stay unevaluated unless their arguments are numbers or the division is exact, which
keeps printing predictable and cheap.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sympy
import sympy.tensor.tensor  # noqa: F401  (see below)

# sympy's `Add.flatten` imports sympy.tensor.tensor, and sympy.combinatorics behind it, at
# its first call (30-60 ms here): imported with ember, not inside a process's first compile.


class FloorDiv(sympy.Function):
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if a == 0:
            return sympy.Integer(0)
        return None


class ModIdx(sympy.Function):
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a, b):
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        return None


def strided(idx: Sequence[sympy.Expr], stride: Sequence[int], offset: int = 0) -> sympy.Expr:
    """The flat element offset of `idx` in a strided layout."""
    terms = [sympy.sympify(offset)] if offset else []  # an int, or a symbolic offset
    terms += [i * st for i, st in zip(idx, stride) if st != 0]
    return sympy.Add(*terms) if terms else sympy.Integer(0)


def unflatten(flat: sympy.Expr, size: Sequence[int]) -> list[sympy.Expr]:
    """Per-dimension indices of a row-major flat index into `size`."""
    out: list[sympy.Expr] = []
    first = True
    for k, s in enumerate(size):
        if s == 1:
            out.append(sympy.Integer(0))
            continue
        inner = 1
        for t in size[k + 1 :]:
            inner *= t
        q = FloorDiv(flat, inner)
        # the outermost index needs no modulo: the flat index is in bounds
        out.append(q if first else ModIdx(q, s))
        first = False
    return out


def to_c(expr: sympy.Expr) -> str:
    """C source of an index expression (int64 arithmetic)."""
    if expr.is_Integer:
        return str(int(expr)) + ("LL" if abs(int(expr)) > 2**31 - 1 else "")
    if expr.is_Symbol:
        return expr.name
    if expr.is_Add:
        parts = [to_c(a) for a in _ordered(expr.args)]
        return "(" + " + ".join(parts) + ")"
    if expr.is_Mul:
        return "(" + "*".join(to_c(a) for a in _ordered(expr.args)) + ")"
    if isinstance(expr, FloorDiv):
        return f"({to_c(expr.args[0])} / {to_c(expr.args[1])})"
    if isinstance(expr, ModIdx):
        return f"({to_c(expr.args[0])} % {to_c(expr.args[1])})"
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:  # a size squared (s0**2)
        return "(" + "*".join([to_c(expr.base)] * int(expr.exp)) + ")"
    if isinstance(expr, sympy.Max | sympy.Min):
        fn = "ember_imax" if isinstance(expr, sympy.Max) else "ember_imin"
        out = to_c(expr.args[0])
        for a in expr.args[1:]:
            out = f"{fn}({out}, {to_c(a)})"
        return out
    raise NotImplementedError(f"index expression {expr!r}")


def _ordered(args):
    return sorted(args, key=sympy.default_sort_key)


def evaluate(expr: sympy.Expr, env: dict[str, object]):
    """Evaluate an index over integer tensors/ints (the reference interpreter uses this)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return env[expr.name]
    if expr.is_Add:
        total = 0
        for a in expr.args:
            total = total + evaluate(a, env)
        return total
    if expr.is_Mul:
        total = 1
        for a in expr.args:
            total = total * evaluate(a, env)
        return total
    if isinstance(expr, FloorDiv):
        return evaluate(expr.args[0], env) // evaluate(expr.args[1], env)
    if isinstance(expr, ModIdx):
        return evaluate(expr.args[0], env) % evaluate(expr.args[1], env)
    raise NotImplementedError(f"index expression {expr!r}")


def free_names(expr: sympy.Expr) -> set[str]:
    return {s.name for s in expr.free_symbols}


def simplify(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Remove div/mod that the loop ranges make exact: (a*c + b) / c -> a when 0 <= b < c,
    and c*(a / c) + a % c -> a.

    A reshape read through a lazy value produces such terms; without this the inner loop would
    divide per element and would not vectorize.
    """
    if not expr.has(FloorDiv, ModIdx):
        return expr
    return _simplified(expr, frozenset(ranges.items()))


@functools.lru_cache(maxsize=4096)
def _simplified(expr: sympy.Expr, ranges_items: frozenset) -> sympy.Expr:
    """`simplify`, remembered: the scheduler and the kernel planner simplify the same load
    indices over the same ranges many times (24 distinct of 122 in a transformer block),
    and with symbolic sizes each costs milliseconds of sympy."""
    ranges = dict(ranges_items)
    if isinstance(expr, FloorDiv | ModIdx):
        a = simplify(expr.args[0], ranges)
        d = expr.args[1]
        if not d.is_Integer:  # a symbolic divisor: only exact multiples are taken out
            return _by_size(expr.func, a, d, ranges)
        d = int(d)
        if isinstance(expr, FloorDiv):
            return _floordiv(a, d, ranges)
        return _mod(a, d, ranges)
    out = expr.func(*[simplify(a, ranges) for a in expr.args])
    return _recombine(out) if out.is_Add else out


def _coarse(a: sympy.Expr, d: int, ranges) -> tuple[int, sympy.Expr, sympy.Expr]:
    """(c, A, b) with a == c*A + b, c dividing d and 0 <= b < c; c == 1 when none exists."""
    coeffs = sorted(
        {int(t.as_coeff_Mul()[0]) for t in sympy.Add.make_args(a)} - {0, 1}, reverse=True
    )
    for c in coeffs:
        if c <= 0 or d % c:
            continue
        big, small = _split_multiples(a, c)
        if _below(_max(small, ranges), c):
            return c, big, small
    return 1, a, sympy.Integer(0)


def _floordiv(a: sympy.Expr, d: int, ranges) -> sympy.Expr:
    keep, rest = _split_multiples(a, d)
    if rest == 0 or _below(_max(rest, ranges), d):
        return keep
    c, big, _ = _coarse(rest, d, ranges)
    if c > 1:
        return keep + _floordiv(big, d // c, ranges)
    return keep + FloorDiv(rest, d)


def _mod(a: sympy.Expr, d: int, ranges) -> sympy.Expr:
    _, rest = _split_multiples(a, d)
    if _below(_max(rest, ranges), d):
        return rest
    c, big, small = _coarse(rest, d, ranges)
    if c > 1:
        return c * _mod(big, d // c, ranges) + small
    return ModIdx(rest, d)


def _by_size(func, a: sympy.Expr, d: sympy.Expr, ranges) -> sympy.Expr:
    """(a / d or a % d) for a symbolic divisor d (a reshape of a dynamic dimension): terms
    of `a` that are multiples of d leave the division, and the rest is dropped from it when
    it provably stays below d, for every value of the size symbols (they are positive)."""
    keep, rest = [], []
    for term in sympy.Add.make_args(a):
        q = term / d
        num, den = sympy.fraction(q)
        (keep if den == 1 and num.as_coeff_Mul()[0].is_Integer else rest).append(q)
    below = _below(_max(sympy.Add(*rest) * d, ranges), d)
    rest_expr = sympy.expand(sympy.Add(*rest) * d)
    if func is FloorDiv:
        if below:
            return sympy.Add(*keep)
        return sympy.Add(*keep) + func(rest_expr, d) if keep else func(a, d)
    return rest_expr if below else func(rest_expr if keep else a, d)


@functools.lru_cache(maxsize=4096)
def _below(m, d) -> bool:
    """Whether the bound m is provably smaller than d."""
    if m == float("inf"):
        return False
    if isinstance(m, int) and isinstance(d, int):
        return m < d
    diff = sympy.expand(d - m)
    decided = _positive_by_terms(diff)
    # sympy's assumption system takes milliseconds a query: only what the terms leave open
    return decided if decided is not None else bool(diff.is_positive)


def _positive_by_terms(e: sympy.Expr) -> bool | None:
    """Whether e > 0 for all values of the size symbols (positive integers), from a lower
    bound of its terms: a monomial with a positive coefficient is at least its value with
    the symbols at 1, a div/mod at least 0. Without div/mod terms that bound is e's value at
    1, so a bound <= 0 is False. None where the bound decides nothing, for sympy to decide:
    a term with a negative coefficient (768*s0**2 - 767*s0 + 1 is positive, and sympy proves
    it; -s0 + s1 is not), a div/mod term when the bound is <= 0, any other term."""
    low, attained = 0, True
    for term in sympy.Add.make_args(e):
        c, rest = term.as_coeff_Mul()
        if not c.is_Rational:
            return None
        if rest == 1:
            low += c
            continue
        factors = sympy.Mul.make_args(rest)
        unbounded = all(_positive_factor(f) or isinstance(f, FloorDiv | ModIdx) for f in factors)
        if not unbounded or c < 0:
            return None
        if all(_positive_factor(f) for f in factors):
            low += c
        else:
            attained = False
    return True if low > 0 else (False if attained else None)


def _positive_factor(f: sympy.Expr) -> bool:
    """A positive size symbol or a positive power of one (at least 1)."""
    base = f.base if f.is_Pow and f.exp.is_Integer and f.exp > 0 else f
    return base.is_Symbol and bool(base.is_positive)


def _recombine(expr: sympy.Expr) -> sympy.Expr:
    """k*d*(a / d) + k*(a % d) -> k*a, the two halves of an index split and joined again;
    and k*d*((a / d) % e) + k*(a % d) -> k*(a % (d*e)), two middle pieces of one split (a
    flat index over (N, H, W) read from a channels-last tensor: its n, h and w, each times
    its stride, join back into one term this way, then the first rule)."""
    terms = list(sympy.Add.make_args(expr))
    for i, t in enumerate(terms):
        k, f = t.as_coeff_Mul()
        if not isinstance(f, ModIdx):
            continue
        a, d = f.args
        for j, u in enumerate(terms):
            kj, g = u.as_coeff_Mul()
            if j == i or kj != k * d:
                continue
            rest = [x for n, x in enumerate(terms) if n not in (i, j)]
            if g == FloorDiv(a, d):
                return _recombine(sympy.Add(*rest, k * a))
            if isinstance(g, ModIdx) and g.args[0] == FloorDiv(a, d):
                return _recombine(sympy.Add(*rest, k * ModIdx(a, d * g.args[1])))
    return expr


def _split_multiples(a: sympy.Expr, d: int) -> tuple[sympy.Expr, sympy.Expr]:
    """(sum of a's terms divisible by d, divided by d; the other terms)."""
    keep, rest = [], []
    for term in sympy.Add.make_args(a):
        c, factor = term.as_coeff_Mul()
        if c.is_Integer and int(c) % d == 0:
            keep.append(sympy.Integer(int(c) // d) * factor)
        else:
            rest.append(term)
    return sympy.Add(*keep), sympy.Add(*rest)


def _max(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> Any:
    """An upper bound of a non-negative index expression (inf when unknown): an int, or a
    sympy expression of the size symbols where ranges are symbolic."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        if expr in ranges:
            return ranges[expr] - 1
        return expr if _is_size(expr) else float("inf")
    if expr.is_Add:
        parts = [_max(a, ranges) for a in expr.args]
        return float("inf") if float("inf") in parts else sum(parts)
    if expr.is_Mul:
        c, rest = expr.as_coeff_Mul()
        if not (c.is_Integer and int(c) >= 0):
            return float("inf")
        out: Any = int(c)
        for f in sympy.Mul.make_args(rest):  # non-negative factors: bounds multiply
            m = _max(f, ranges)
            if m == float("inf"):
                return m
            out = out * m
        return out
    if isinstance(expr, FloorDiv):
        m, d = _max(expr.args[0], ranges), expr.args[1]
        if m == float("inf"):
            return m
        return m // int(d) if d.is_Integer and isinstance(m, int) else FloorDiv(m, d)
    if isinstance(expr, ModIdx):
        d = expr.args[1]
        if d.is_Integer:
            m = _max(expr.args[0], ranges)
            return int(d) - 1 if m == float("inf") or not isinstance(m, int) else min(int(d) - 1, m)
        return d - 1
    return float("inf")


def _is_size(e: Any) -> bool:
    """A size symbol of the graph (positive), or a product/sum of them and integers."""
    if isinstance(e, int):
        return True
    return isinstance(e, sympy.Expr) and all(s.name.startswith("s") for s in e.free_symbols)
