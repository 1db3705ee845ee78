"""Meta results of aten ops on symbolic layouts without running torch's symbolic shape code.

On tensors with symbolic sizes an op's meta kernel is a Python reference (torch._refs,
through the Python dispatcher) doing its shape arithmetic on SymInts: each product,
comparison or contiguity check builds sympy expressions and asks the ShapeEnv, 1-40 ms an op
where the static trace takes 0.1-5 ms (the symbolic traces of the transformer block and
GPT-2 tiny took 5-6x their static ones: bench/dynamic_compile.py). These shortcuts, all
exact, leave the rest to the meta kernels:

- recalled layouts: an op applied to arguments with the same layouts (sizes, strides,
  offset as expressions of the size symbols; dtype) as an earlier op of the same trace has
  the earlier result's layout. Every layer of a model repeats its ops on the same layouts.
  The earlier run's guards are about the same expressions, so none is lost.
- `contiguous_view`: a view of a contiguous tensor is the contiguous layout of the new shape,
  when the element counts are equal for every value of the symbols (a -1 is their exact
  quotient); that needs no guard either.
- `pointwise`: an elementwise op on contiguous operands, one of which has the shape of the
  result (the others broadcast to it without a guard), is contiguous in that shape; its
  dtype comes from the op run on one-element stand-ins (static: cheap).
- `matmul`: mm, bmm and addmm whose inner sizes are one expression give a contiguous result;
  `same_size_expand`: an expand to the sizes a tensor already has is its own layout.

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
from ember.aot.symbolic import SYM_TYPES, meta_like

aten = torch.ops.aten

ENABLED = True  # tests turn the shortcuts off to compare against the meta kernels
stats: Counter[str] = Counter()  # results per shortcut ("recalled", "pointwise", ...)
_VIEWS = (aten.view.default, aten._unsafe_view.default)
_PRODUCTS = (aten.mm.default, aten.bmm.default, aten.addmm.default)
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout)
_PLAIN += (torch.memory_format,)


class _Unkeyed(Exception):
    """An argument whose effect on the result a layout key cannot capture."""


def _expr(v: Any) -> Any:
    return v.node.expr if isinstance(v, torch.SymInt) else v


def _key(a: Any, offset: bool = True) -> Any:
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
            _expr(a.storage_offset()) if offset else None,
        )
    if isinstance(a, torch.SymInt):
        return (torch.SymInt, a.node.expr)
    if isinstance(a, list | tuple):
        return (type(a), tuple(_key(x) for x in a))
    if isinstance(a, dict):
        return (dict, tuple((k, _key(v)) for k, v in sorted(a.items())))
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
        self._seen: dict[Any, tuple[Any, Any]] = {}

    def result(self, func: Any, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        """(the op's meta result or None when no shortcut applies, the key to `remember`
        a computed result under)."""
        if not ENABLED:
            return None, None
        key = _lookup_key(func, args, kwargs)
        if key is not None and key in self._seen:
            stats["recalled"] += 1
            return _rebuild(func, args, *self._seen[key]), None
        for shortcut in (contiguous_view, same_size_expand, pointwise, matmul, layer_norm):
            out = shortcut(func, args, kwargs)
            if out is not None:
                stats[shortcut.__name__] += 1
                return out, None
        return None, key

    def remember(self, key: Any, args: tuple, out: Any) -> None:
        if key is not None and _tensors(out) is not None:
            self._seen[key] = (args[0].storage_offset() if _relative(key[0]) else 0, out)


def _relative(func: Any) -> bool:
    """A view op whose result's offset is its input's plus a function of the other
    arguments (every view op but as_strided): recalled without the input's offset, so
    the views of q, k and v split from one tensor share an entry."""
    return is_view_op(func) and func is not aten.as_strided.default


def _lookup_key(func: Any, args: tuple, kwargs: dict) -> Any:
    if not _recallable(func):
        return None
    try:
        if _relative(func):
            key = (func, _key(args[0], offset=False), _key(args[1:]), _key(kwargs))
        else:
            key = (func, _key(args), _key(kwargs))
        hash(key)
    except (_Unkeyed, TypeError):
        return None
    return key


def _rebuild(func: Any, args: tuple, src_offset: Any, out: Any) -> Any:
    """A result with the layouts of `out`: views of the op's input for a view op (at the
    same distance from the input's offset as `out` from `src_offset`)."""
    if is_view_op(func):
        src = args[0]
        moved = _relative(func) and _sym(src.storage_offset()) != _sym(src_offset)
        shift = src.storage_offset() - src_offset if moved else 0

        def make(o: torch.Tensor) -> torch.Tensor:
            return src.as_strided(o.shape, o.stride(), o.storage_offset() + shift)
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
    numel = _contiguous_numel(src)
    if numel is None:
        return None
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
    if func is aten.view.default:
        return src.as_strided(size, _contiguous_strides(size), 0)
    return _contiguous(size, src.dtype)


def _contiguous_numel(t: Any) -> sympy.Expr | None:
    """The element count of a tensor that is provably contiguous, else None."""
    if not isinstance(t, torch.Tensor) or _sym(t.storage_offset()) != 0:
        return None
    numel = sympy.Integer(1)
    for s, st in zip(reversed(t.shape), reversed(t.stride())):
        e = _sym(s)
        if e != 1 and _sym(st) != numel:
            return None
        numel = numel * e
    return numel


def _contiguous_strides(size: Sequence[Any]) -> list[Any]:
    strides: list[Any] = []
    acc: Any = 1
    for s in reversed(size):
        strides.append(acc)
        acc = acc * s
    return strides[::-1]


def _contiguous(size: Sequence[Any], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, _contiguous_strides(size), dtype=dtype, device="meta")


def pointwise(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """An elementwise op (torch.Tag.pointwise) on contiguous tensors, one of which has the
    broadcast shape of all: the contiguous layout of that shape (what TensorIterator gives
    such operands), in the dtype the op gives tensors of these dtypes and ranks (from the
    op run on one-element stand-ins). None when any of that does not hold."""
    if torch.Tag.pointwise not in func.tags or len(func._schema.returns) != 1:
        return None
    if kwargs.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        return None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or any(t.dim() == 0 or _contiguous_numel(t) is None for t in tensors):
        return None
    if any(isinstance(a, SYM_TYPES) for a in (*args, *kwargs.values())):
        return None
    shape = max((t.shape for t in tensors), key=len)
    full = [_sym(s) for s in shape]
    for t in tensors:
        for d, s in enumerate(t.shape, start=len(full) - t.dim()):
            e = _sym(s)
            if e != 1 and e != full[d]:
                return None
    probe = func(*[_stand_in(a) for a in args], **kwargs)
    if not isinstance(probe, torch.Tensor) or probe.dim() != len(shape):
        return None
    return _contiguous(shape, probe.dtype)


def matmul(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """mm, bmm and addmm (a 1-d bias, or one of the result's shape, contiguous) of one
    floating dtype whose inner sizes are the same expression: a contiguous result."""
    if func not in _PRODUCTS:
        return None
    bias, (a, b) = (args[0], args[1:3]) if func is aten.addmm.default else (None, args[:2])
    rank = 3 if func is aten.bmm.default else 2
    operands = [t for t in (a, b, bias) if t is not None]
    if not all(isinstance(t, torch.Tensor) for t in operands) or a.dim() != rank:
        return None
    if b.dim() != rank or len({t.dtype for t in operands}) != 1 or not a.dtype.is_floating_point:
        return None
    if _sym(a.shape[-1]) != _sym(b.shape[-2]) or rank == 3 and _sym(a.shape[0]) != _sym(b.shape[0]):
        return None
    size = (*a.shape[:-1], b.shape[-1])
    if bias is not None:
        fits = [_sym(s) for s in bias.shape] in ([_sym(b.shape[1])], [_sym(s) for s in size])
        if not fits or _contiguous_numel(bias) is None:
            return None
    return _contiguous(size, a.dtype)


def same_size_expand(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """expand to the sizes the tensor has (a matmul's batch dims): the tensor's layout."""
    if func is not aten.expand.default or kwargs or len(args) != 2:
        return None
    src, size = args
    if len(size) != src.dim() or any(
        not (type(n) is int and n == -1) and _sym(n) != _sym(s) for n, s in zip(size, src.shape)
    ):
        return None
    return src.as_strided(src.shape, src.stride(), src.storage_offset())


def layer_norm(func: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, ...] | None:
    """native_layer_norm of a contiguous float32/float64 input over trailing sizes that are
    its own (weight and bias of those sizes): the output contiguous in the input's shape,
    mean and rstd contiguous in its leading sizes with ones for the normalized ones."""
    if func is not aten.native_layer_norm.default or kwargs or len(args) != 5:
        return None
    x, normalized, weight, bias, _ = args
    if _contiguous_numel(x) is None or x.dtype not in (torch.float32, torch.float64):
        return None
    k = len(normalized)
    if not 0 < k <= x.dim() or [_sym(s) for s in normalized] != [_sym(s) for s in x.shape[-k:]]:
        return None
    for t in (weight, bias):
        if t is not None and (
            t.dtype != x.dtype
            or _contiguous_numel(t) is None
            or [_sym(s) for s in t.shape] != [_sym(s) for s in normalized]
        ):
            return None
    stats_size = (*x.shape[:-k], *(1,) * k)
    return (
        _contiguous(x.shape, x.dtype),
        _contiguous(stats_size, x.dtype),
        _contiguous(stats_size, x.dtype),
    )


def _stand_in(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return torch.empty((1,) * a.dim(), dtype=a.dtype, device="meta")
    return a
