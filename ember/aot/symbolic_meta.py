"""Meta results of aten ops on symbolic layouts without running torch's symbolic shape code.

On tensors with symbolic sizes an op's meta kernel is a Python reference (torch._refs,
through the Python dispatcher) doing its shape arithmetic on SymInts: each product,
comparison or contiguity check builds sympy expressions and asks the ShapeEnv, 1-40 ms an op
where the static trace takes 0.1-5 ms (the symbolic traces of the transformer block and
GPT-2 tiny took 5-6x their static ones: bench/dynamic_compile.py). Two shortcuts, both
exact, leave the rest to the meta kernels:

- `SymbolicMeta.recall`: an op applied to arguments with the same layouts (sizes, strides,
  offset as expressions of the size symbols; dtype) as an earlier op of the same trace has
  the earlier result's layout. Every layer of a model repeats its ops on the same layouts.
  The earlier run's guards are about the same expressions, so none is lost.
- `contiguous_view`: a view of a contiguous tensor is the contiguous layout of the new shape,
  when the element counts are equal for every value of the symbols (a -1 is their exact
  quotient); that needs no guard either.

A shortcut's result is a fresh meta tensor of the recalled layout, or for a view op a view
of the op's input, as the meta kernel's would be. tests/aot/test_aot_dynamic.py traces
graphs with the shortcuts and without and requires the same layouts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ember.aot.functionalize import is_view_op
from ember.aot.symbolic import meta_like

aten = torch.ops.aten

ENABLED = True  # tests turn the shortcuts off to compare against the meta kernels
stats: Counter[str] = Counter()  # "recalled" and "contiguous view" results, for tests
_VIEWS = (aten.view.default, aten._unsafe_view.default)
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout)
_PLAIN += (torch.memory_format,)


class _Unkeyed(Exception):
    """An argument whose effect on the result a layout key cannot capture."""


def _expr(v: Any) -> Any:
    return v.node.expr if isinstance(v, torch.SymInt) else v


def _key(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        if a.dim() == 0:  # a wrapped Python number promotes differently from a tensor
            raise _Unkeyed
        return (
            torch.Tensor,
            a.dtype,
            a.layout,
            a.is_conj(),
            a.is_neg(),
            tuple(_expr(s) for s in a.shape),
            tuple(_expr(s) for s in a.stride()),
            _expr(a.storage_offset()),
        )
    if isinstance(a, torch.SymInt):
        return (torch.SymInt, a.node.expr)
    if isinstance(a, list | tuple):
        return (type(a), tuple(_key(x) for x in a))
    if isinstance(a, _PLAIN):
        return (type(a), a)  # the type too: 1, 1.0 and True are equal keys otherwise
    raise _Unkeyed


def _recallable(func: Any) -> bool:
    if func._schema.is_mutable:
        return False
    tags = func.tags
    return not (torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags)


def _tensors(out: Any) -> Sequence[torch.Tensor] | None:
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, tuple | list) and all(isinstance(o, torch.Tensor) for o in out):
        return out
    return None


class SymbolicMeta:
    """The shortcuts of one symbolic trace: its recalled layouts, by op and argument key."""

    def __init__(self) -> None:
        self._seen: dict[Any, Any] = {}

    def _lookup_key(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if not _recallable(func):
            return None
        try:
            key = (func, _key(args), _key(tuple(sorted(kwargs.items()))))
            hash(key)
        except (_Unkeyed, TypeError):
            return None
        return key

    def result(self, func: Any, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        """(the op's meta result or None when no shortcut applies, the key to `remember`
        a computed result under)."""
        if not ENABLED:
            return None, None
        key = self._lookup_key(func, args, kwargs)
        if key is not None and key in self._seen:
            stats["recalled"] += 1
            return _rebuild(func, args, self._seen[key]), None
        view = contiguous_view(func, args, kwargs)
        if view is not None:
            stats["contiguous view"] += 1
            return view, None
        return None, key

    def remember(self, key: Any, out: Any) -> None:
        if key is not None and _tensors(out) is not None:
            self._seen[key] = out


def _rebuild(func: Any, args: tuple, out: Any) -> Any:
    """A result with the layouts of `out`: views of the op's input for a view op."""
    if is_view_op(func):
        src = args[0]

        def make(o: torch.Tensor) -> torch.Tensor:
            return src.as_strided(o.shape, o.stride(), o.storage_offset())
    else:

        def make(o: torch.Tensor) -> torch.Tensor:
            return meta_like(o, requires_grad=False)

    if isinstance(out, torch.Tensor):
        return make(out)
    return type(out)(make(o) for o in out)


def _sym(v: Any) -> sympy.Expr:
    return v.node.expr if isinstance(v, torch.SymInt) else sympy.Integer(v)


def _product(values: Sequence[Any]) -> Any:
    out: Any = 1
    for v in values:
        out = out * v
    return out


def _divides(d: sympy.Expr, n: sympy.Expr) -> bool:
    """Whether n / d is a polynomial with integer coefficients (an exact quotient for every
    value of the symbols)."""
    quotient = sympy.cancel(n / d)
    if quotient.is_Integer:
        return True
    if sympy.fraction(quotient)[1] != 1 or not quotient.is_polynomial():
        return False
    return all(c.is_Integer for c in sympy.Poly(quotient, *quotient.free_symbols).coeffs())


def contiguous_view(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """`view(x, size)` (or `_unsafe_view`) of a contiguous `x` with symbolic sizes: the
    contiguous layout of `size`, computed with SymInt products; None when `x` is not
    provably contiguous or the element counts not provably equal."""
    if func not in _VIEWS or kwargs or len(args) != 2:
        return None
    src, size = args
    if not isinstance(src, torch.Tensor) or _sym(src.storage_offset()) != 0:
        return None
    numel = sympy.Integer(1)
    for s, st in zip(reversed(src.shape), reversed(src.stride())):
        e = _sym(s)
        if e != 1 and _sym(st) != numel:
            return None
        numel = numel * e
    size = list(size)
    free = [i for i, s in enumerate(size) if type(s) is int and s == -1]
    given = [s for i, s in enumerate(size) if i not in free]
    known = _product(_sym(s) for s in given)
    if len(free) > 1:
        return None
    if free:
        if not _divides(known, numel):
            return None
        size[free[0]] = _product(src.shape) // _product(given)
    elif sympy.expand(numel - known) != 0:
        return None
    strides: list[Any] = []
    acc: Any = 1
    for s in reversed(size):
        strides.append(acc)
        acc = acc * s
    strides.reverse()
    if func is aten.view.default:
        return src.as_strided(size, strides, 0)
    return torch.empty_strided(size, strides, dtype=src.dtype, device=src.device)
