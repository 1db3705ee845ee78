"""Sizes of a graph with symbolic shapes: expressions, hints, and where the wrapper reads them.

A static size is a Python int, as it always was; a symbolic one is a sympy expression over
the size symbols of the graph's ShapeEnv (`s0`, `s77`: positive integers), written with
ember's index functions (`indexing.FloorDiv`, `indexing.ModIdx`), so loop bounds, index
expressions, strides and buffer sizes are all one kind of expression. Kernels take the
symbols as `int64_t` arguments; the wrapper reads each one from an input at call time
(`s0 = in0.shape[0]`, or an int input of the graph), so one compiled library serves every
size.

Nothing here turns a symbol into a number to decide what code computes. Choices that only
change speed (loop order by stride, buffer reuse by bytes, prefetching) read the *hint*, the
value a symbol had in the example inputs; `hint()` reads it from the hints of the graph
being compiled (set by `hinting` around one compile: a context variable rather than an
argument threaded through every lowering).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import sympy
import torch
from torch.utils._sympy import functions as tf

from ember.backend.indexing import FloorDiv, ModIdx

Size = int | sympy.Expr

_hints: contextvars.ContextVar[dict[sympy.Symbol, int] | None] = contextvars.ContextVar(
    "ember_size_hints", default=None
)


class UnsupportedSize(Exception):
    """A size expression ember cannot compute in kernels (float sizes, unbacked symbols)."""


@contextlib.contextmanager
def hinting(hints: dict[sympy.Symbol, int]) -> Iterator[None]:
    token = _hints.set(hints)
    try:
        yield
    finally:
        _hints.reset(token)


def is_static(v: Any) -> bool:
    return isinstance(v, int) or (isinstance(v, sympy.Expr) and v.is_number)


def hint(v: Size) -> int:
    """The example value of a size (a number for decisions about speed only)."""
    if isinstance(v, int):
        return v
    value = sympy.sympify(v.xreplace(_hints.get() or {}))
    if not value.is_number:
        raise UnsupportedSize(f"no example value for size {v}")
    return int(value)


def hints(vs: Sequence[Size]) -> tuple[int, ...]:
    return tuple(hint(v) for v in vs)


def hint_prod(vs: Sequence[Size]) -> int:
    n = 1
    for v in vs:
        n *= hint(v)
    return n


def same(a: Size, b: Size) -> bool:
    """Equal for every value of the symbols."""
    if isinstance(a, int) and isinstance(b, int) or a == b:
        return a == b
    hints = _hints.get()
    if hints:
        # sizes that differ at the example's values differ (expand takes milliseconds)
        at = [sympy.sympify(sympy.sympify(v).xreplace(hints)) for v in (a, b)]
        if all(v.is_Integer for v in at) and at[0] != at[1]:
            return False
    return sympy.expand(a - b) == 0


def expr_of(v: Any) -> Any:
    """A size as the backend holds it: ints stay ints, a SymInt becomes its expression in
    ember's index functions (an int when its ShapeEnv knows the value)."""
    if isinstance(v, torch.SymInt):
        expr = v.node.expr
        return int(expr) if expr.is_number else _convert(expr)
    if isinstance(v, torch.SymFloat | torch.SymBool):
        raise UnsupportedSize(f"a symbolic {type(v).__name__} ({v.node.expr})")
    return v


def _convert(e: sympy.Expr) -> sympy.Expr:
    if e.is_Integer:
        return e
    if e.is_Symbol:
        if not e.name.startswith("s"):
            raise UnsupportedSize(f"size symbol {e} has no value at compile or call time")
        return e
    args = [_convert(a) for a in e.args]
    if isinstance(e, sympy.Add | sympy.Mul):
        return e.func(*args)
    if isinstance(e, tf.FloorDiv | tf.CleanDiv):
        return FloorDiv(*args)
    if isinstance(e, tf.CeilDiv):
        return FloorDiv(args[0] + args[1] - 1, args[1])
    if isinstance(e, tf.ModularIndexing):
        return ModIdx(FloorDiv(args[0], args[1]), args[2])
    if isinstance(e, tf.PythonMod | tf.Mod | sympy.Mod):
        return ModIdx(*args)
    if isinstance(e, tf.Max | sympy.Max):
        return sympy.Max(*args)
    if isinstance(e, tf.Min | sympy.Min):
        return sympy.Min(*args)
    if isinstance(e, tf.PowByNatural | sympy.Pow) and args[1].is_Integer and args[1] > 0:
        return sympy.Mul(*[args[0]] * int(args[1]))
    raise UnsupportedSize(f"size expression {e} ({type(e).__name__})")


def exprs_of(vs: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(expr_of(v) for v in vs)


def symbols(*exprs: Any) -> set[sympy.Symbol]:
    """The size symbols in sizes, index expressions, or nested tuples of them."""
    out: set[sympy.Symbol] = set()
    for e in exprs:
        if isinstance(e, sympy.Basic):
            out |= {s for s in e.free_symbols if s.name.startswith("s")}
        elif isinstance(e, tuple | list):
            out |= symbols(*e)
    return out


def py(e: Size) -> str:
    """Python source of a size (the wrapper computes sizes from its bound symbols)."""
    if isinstance(e, int):
        return str(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if e.is_Add:
        return "(" + " + ".join(py(a) for a in e.args) + ")"
    if e.is_Mul:
        return "(" + "*".join(py(a) for a in e.args) + ")"
    if e.is_Pow and e.exp.is_Integer and e.exp > 0:
        return f"({py(e.base)}**{int(e.exp)})"
    if isinstance(e, FloorDiv):
        return f"({py(e.args[0])} // {py(e.args[1])})"
    if isinstance(e, ModIdx):
        return f"({py(e.args[0])} % {py(e.args[1])})"
    if isinstance(e, sympy.Max | sympy.Min):
        return f"{type(e).__name__.lower()}({', '.join(py(a) for a in e.args)})"
    raise UnsupportedSize(f"size expression {e!r}")


def py_tuple(vs: Sequence[Size]) -> str:
    inner = ", ".join(py(v) for v in vs)
    return f"({inner}{',' if len(vs) == 1 else ''})"


def sources(values: Sequence[Any], names: Sequence[str]) -> dict[sympy.Symbol, str]:
    """Where the wrapper reads each size symbol: from an int input that is the symbol, or
    a size (else a stride) of a tensor input whose size is the symbol. `values` are the
    placeholders' traced values (meta/fake tensors or SymInts), `names` their parameters."""
    out: dict[sympy.Symbol, str] = {}
    for v, name in zip(values, names):
        if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
            out.setdefault(v.node.expr, name)
    for kind in ("shape", "stride()"):
        for v, name in zip(values, names):
            if not isinstance(v, torch.Tensor):
                continue
            dims = v.shape if kind == "shape" else v.stride()
            for d, s in enumerate(dims):
                if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol:
                    out.setdefault(s.node.expr, f"{name}.{kind}[{d}]")
    return out


def hints_of(values: Sequence[Any], examples: Sequence[Any]) -> dict[sympy.Symbol, int]:
    """Each size symbol's value in the example inputs (the hint)."""
    out: dict[sympy.Symbol, int] = {}
    for v, ex in zip(values, examples):
        if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
            out[v.node.expr] = _example_int(ex, v)
        elif isinstance(v, torch.Tensor) and isinstance(ex, torch.Tensor):
            for sym_dims, real_dims in ((v.shape, ex.shape), (v.stride(), ex.stride())):
                for s, r in zip(sym_dims, real_dims):
                    if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol:
                        out.setdefault(s.node.expr, int(r))
    return out


def _example_int(ex: Any, v: torch.SymInt) -> int:
    if isinstance(ex, torch.SymInt):
        return ex.node.hint if ex.node.hint is not None else int(v.node.hint)
    return int(ex)
