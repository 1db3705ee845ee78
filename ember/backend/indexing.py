"""Index algebra on sympy: strided offsets, floor division and modulo over loop variables.

Indices are non-negative integer expressions, so `FloorDiv` and `ModIdx` are plain C `/` and
`%`. They stay unevaluated unless their arguments are numbers or the division is exact, which
keeps printing predictable and cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy


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
    terms = [sympy.Integer(offset)] if offset else []
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
    if isinstance(expr, FloorDiv | ModIdx):
        a = simplify(expr.args[0], ranges)
        d = int(expr.args[1])
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
        if _max(small, ranges) < c:
            return c, big, small
    return 1, a, sympy.Integer(0)


def _floordiv(a: sympy.Expr, d: int, ranges) -> sympy.Expr:
    keep, rest = _split_multiples(a, d)
    if rest == 0 or _max(rest, ranges) < d:
        return keep
    c, big, _ = _coarse(rest, d, ranges)
    if c > 1:
        return keep + _floordiv(big, d // c, ranges)
    return keep + FloorDiv(rest, d)


def _mod(a: sympy.Expr, d: int, ranges) -> sympy.Expr:
    _, rest = _split_multiples(a, d)
    if _max(rest, ranges) < d:
        return rest
    c, big, small = _coarse(rest, d, ranges)
    if c > 1:
        return c * _mod(big, d // c, ranges) + small
    return ModIdx(rest, d)


def _recombine(expr: sympy.Expr) -> sympy.Expr:
    """k*d*(a / d) + k*(a % d) -> k*a, the two halves of an index split and joined again."""
    terms = list(sympy.Add.make_args(expr))
    for i, t in enumerate(terms):
        k, f = t.as_coeff_Mul()
        if not isinstance(f, ModIdx):
            continue
        a, d = f.args
        for j, u in enumerate(terms):
            kj, g = u.as_coeff_Mul()
            if j != i and g == FloorDiv(a, d) and kj == k * d:
                rest = [x for n, x in enumerate(terms) if n not in (i, j)]
                return _recombine(sympy.Add(*rest, k * a))
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


def _max(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> float:
    """An upper bound of a non-negative index expression (inf when unknown)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return ranges[expr] - 1 if expr in ranges else float("inf")
    if expr.is_Add:
        return sum(_max(a, ranges) for a in expr.args)
    if expr.is_Mul:
        c, rest = expr.as_coeff_Mul()
        if c.is_Integer and int(c) >= 0:
            return int(c) * _max(rest, ranges)
        return float("inf")
    if isinstance(expr, FloorDiv):
        return _max(expr.args[0], ranges) // int(expr.args[1])
    if isinstance(expr, ModIdx):
        return min(int(expr.args[1]) - 1, _max(expr.args[0], ranges))
    return float("inf")
