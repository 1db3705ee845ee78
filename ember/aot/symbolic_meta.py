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
  `layer_norm` the input's contiguous layout and its statistics'; `like` (_to_copy, the
  *_like factories) the layout of a contiguous input; `same_size_expand` (to the sizes a
  tensor has) and `unsqueeze` follow torch's geometry rules; `full_index` (every dim
  indexed by an integer tensor) a contiguous tensor of the indices' broadcast shape.
- `attention` (called by the capture for `F.scaled_dot_product_attention` itself, which
  is composite: its ops never reach a dispatch mode as one): the math path's result, a
  contiguous tensor of the query's leading sizes and the value's last.

A shortcut's result is a fresh meta tensor of the recalled layout, or for a view op a view
of the op's input, as the meta kernel's would be. tests/aot/test_aot_dynamic.py traces
graphs with the shortcuts and without and requires the same layouts.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ember.aot.functionalize import is_view_op
from ember.aot.symbolic import SYM_TYPES
from ember.meta import META, hollow_tensor

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
        for shortcut in _SHORTCUTS:
            out = shortcut(func, args, kwargs)
            if out is not None:
                stats[shortcut.__name__] += 1
                return out, None
        return None, key

    def remember(self, key: Any, args: tuple, out: Any) -> None:
        """Keep a meta kernel's result for later ops on the same layouts (not one that
        returned an input itself: a rebuilt result could not be that input)."""
        outs = _tensors(out)
        if key is None or outs is None or any(o is a for o in outs for a in args):
            return
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
            return hollow_tensor(o.shape, o.stride(), o.dtype, o.storage_offset())

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


def _monomial(e: sympy.Expr) -> bool:
    """An integer, or an integer times powers of size symbols (no fraction): what a
    quotient of two products of sizes is when it is exact for every value of the symbols."""
    return all(_size_factor(f) for f in sympy.Mul.make_args(e))


def _size_factor(f: sympy.Expr) -> bool:
    if f.is_Integer or f.is_Symbol:
        return True
    return f.is_Pow and f.base.is_Symbol and f.exp.is_Integer and f.exp > 0


def contiguous_view(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """`view(x, size)` (or `_unsafe_view`) of a contiguous `x` with symbolic sizes: the
    contiguous layout of `size`; None when `x` is not provably contiguous or the element
    counts are not the same product (a -1 an exact quotient)."""
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
    operands = (*src.shape, *src.stride(), *given)
    if len(free) > 1:
        return None
    if free:
        quotient = numel / known
        if quotient.is_Integer and quotient < 0 or not _monomial(quotient):
            return None
        inferred = _size_of(quotient, operands)
        if inferred is None:
            inferred = _product(src.shape) // _product(given)
        size[free[0]] = inferred
    elif numel != known:
        return None
    if func is aten.view.default:
        return src.as_strided(size, _contiguous_strides(size, operands), 0)
    return hollow_tensor(size, _contiguous_strides(size, operands), src.dtype)


def _size_of(e: sympy.Expr, operands: Sequence[Any]) -> Any:
    """`e` as an int, or as one of the operands' SymInts with that expression (no SymInt
    arithmetic: in a Dynamo ShapeEnv each operation costs ~0.1-0.3 ms); else None."""
    if e.is_Integer:
        return int(e)
    return next((v for v in operands if isinstance(v, torch.SymInt) and v.node.expr == e), None)


def _contiguous_numel(t: Any) -> sympy.Expr | None:
    """The element count of a tensor that is provably contiguous, else None."""
    if not isinstance(t, torch.Tensor) or _sym(t.storage_offset()) != 0:
        return None
    return _contiguity(*_layout(t))[0]


def _canonical(t: torch.Tensor) -> bool:
    """Contiguous with the strides torch gives a new contiguous tensor (size-1 dims too)."""
    return _contiguity(*_layout(t))[1]


def _layout(t: torch.Tensor) -> tuple[tuple[sympy.Expr, ...], tuple[sympy.Expr, ...]]:
    return tuple(_sym(s) for s in t.shape), tuple(_sym(s) for s in t.stride())


@functools.lru_cache(maxsize=4096)
def _contiguity(shape: tuple, stride: tuple) -> tuple[sympy.Expr | None, bool]:
    """(the element count when the layout is contiguous, else None; whether its strides are
    the ones torch gives a new contiguous tensor, size-1 dims' too). Remembered: sympy's
    products cost tens of microseconds each, and the same layouts recur op after op."""
    numel, canonical = sympy.Integer(1), True
    for e, st in zip(reversed(shape), reversed(stride)):
        canonical = canonical and st == numel
        if e != 1 and st != numel:
            return None, False
        numel = numel * e
    return numel, canonical


def _contiguous_strides(size: Sequence[Any], operands: Sequence[Any] = ()) -> list[Any]:
    """Contiguous strides of `size` (as torch gives a new tensor): ints, SymInts of the
    operands with the stride's expression, else SymInt products."""
    strides: list[Any] = []
    acc: Any = 1
    expr = sympy.Integer(1)
    for s in reversed(size):
        strides.append(acc)
        expr = expr * _sym(s)
        found = _size_of(expr, (*operands, *size))
        acc = found if found is not None else acc * s
    return strides[::-1]


def _contiguous(size: Sequence[Any], dtype: torch.dtype, operands: Sequence[Any] = ()):
    return hollow_tensor(size, _contiguous_strides(size, operands), dtype)


def pointwise(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """An elementwise op (torch.Tag.pointwise) on contiguous tensors, one of which has the
    broadcast shape of all: that tensor's layout (what TensorIterator gives such operands),
    in the dtype the op gives tensors of these dtypes and ranks (from the op run on
    one-element stand-ins). None when any of that does not hold."""
    if torch.Tag.pointwise not in func.tags and func not in _WHERE_SCALARS:
        return None
    if len(func._schema.returns) != 1:
        return None
    if kwargs.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        return None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or any(_contiguous_numel(t) is None for t in tensors):
        return None
    if any(isinstance(a, SYM_TYPES) for a in (*args, *kwargs.values())):
        return None
    widest = max(tensors, key=lambda t: t.dim())
    size = list(widest.shape)
    for t in tensors:
        for d, s in enumerate(t.shape, start=len(size) - t.dim()):
            e, have = _sym(s), _sym(size[d])
            if e == 1 or e == have:
                continue
            if have != 1:
                return None
            size[d] = s
    if [_sym(s) for s in size] == [_sym(s) for s in widest.shape]:
        return _shaped_like(widest, func, args, kwargs) if _canonical(widest) else None
    return _mutually_broadcast(size, tensors, func, args, kwargs)


def _mutually_broadcast(
    size: list[Any], tensors: list[torch.Tensor], func: Any, args: tuple, kwargs: dict
) -> torch.Tensor | None:
    """An elementwise op on tensors with torch's contiguous strides none of which has the
    broadcast shape (GPT-2's masks: `kv_idx <= q_idx` of (1, 1, 1, S) and (1, 1, L, 1)):
    every operand is expanded (stride 0 where it broadcasts) and the output's dims keep
    their order, so the result has the contiguous strides of the broadcast shape."""
    if not all(_canonical(t) for t in tensors):
        return None
    dtype = _dtype_of(func, args, kwargs)
    if dtype is None:
        return None
    operands = [v for t in tensors for v in (*t.shape, *t.stride())]
    stats["mutually_broadcast"] += 1
    return _contiguous(size, dtype, operands)


_WHERE_SCALARS = (aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
"""`where` with a Python number for a branch: not tagged pointwise, but `where.self` on that
number as a 0-d tensor (their composite implementation), whose tag it is."""

_ALONG_A_DIM = (
    aten._softmax.default,
    aten._log_softmax.default,
    aten._safe_softmax.default,
    aten.cumsum.default,
)


def along_a_dim(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """Softmax, log-softmax (`_safe_softmax` too: attention's) and cumsum along one dim of a
    tensor with torch's contiguous strides: a new tensor of that layout (their meta kernels
    give a contiguous result of the input's shape: elementwise steps over it, or for cumsum
    a sum over a broadcast mask), in the dtype the op gives (from the op on one-element
    stand-ins of the same rank, which also rejects a dim out of range). GPT-2's attention
    mask takes a cumsum, its attention a `_safe_softmax`: 30-40 ms each through torch's
    symbolic arithmetic."""
    if func not in _ALONG_A_DIM or not args or not isinstance(args[0], torch.Tensor):
        return None
    x, rest = args[0], (*args[1:], *kwargs.values())
    if x.dim() == 0 or _contiguous_numel(x) is None or not _canonical(x):
        return None
    if any(isinstance(a, (torch.Tensor, *SYM_TYPES)) for a in rest):
        return None
    return _shaped_like(x, func, args, kwargs)


def _shaped_like(t: torch.Tensor, func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A tensor of `t`'s layout in the dtype `func` gives for these arguments, or None where
    that dtype cannot be told (see `_dtype_of`)."""
    dtype = _dtype_of(func, args, kwargs)
    return None if dtype is None else hollow_tensor(t.shape, t.stride(), dtype)


def _dtype_of(func: Any, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The dtype `func` gives for these arguments, or None where that cannot be told (an
    unhashable argument, an op that rejects them)."""
    try:
        return _result_dtype(func, _describe(args), _describe(kwargs))
    except TypeError:  # an unhashable argument
        return None


def _describe(tree: Any) -> Any:
    """What an elementwise op's result dtype depends on: tensors' dtypes and ranks (a 0-d
    tensor promotes like a scalar), scalars' types and values."""
    if isinstance(tree, torch.Tensor):
        return (torch.Tensor, tree.dtype, tree.dim())
    if isinstance(tree, list | tuple):
        return (type(tree), tuple(_describe(a) for a in tree))
    if isinstance(tree, dict):
        return (dict, tuple((k, _describe(v)) for k, v in sorted(tree.items())))
    return (type(tree), tree)


@functools.lru_cache(maxsize=1024)
def _result_dtype(func: Any, args: Any, kwargs: Any) -> torch.dtype | None:
    """The dtype of `func` on one-element meta stand-ins of the described arguments (None
    when it is not one tensor of the operands' broadcast rank)."""
    try:
        probe = func(*_stand_in(args), **_stand_in(kwargs))
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return None  # the op itself says what is wrong
    rank = max((a[2] for a in args[1] if a[0] is torch.Tensor), default=-1)
    if not isinstance(probe, torch.Tensor) or probe.dim() != rank:
        return None
    return probe.dtype


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
    return _contiguous(size, a.dtype, (*a.shape, *a.stride(), *b.shape, *b.stride()))


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
    if not _canonical(x) or x.dtype not in (torch.float32, torch.float64):
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
    stats = _contiguous((*x.shape[:-k], *(1,) * k), x.dtype, (*x.shape, *x.stride()))
    out = hollow_tensor(x.shape, x.stride(), x.dtype)
    return out, stats, hollow_tensor(stats.shape, stats.stride(), x.dtype)


def unsqueeze(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """unsqueeze: a size-1 dim whose stride is the next dim's extent (1 at the end), as
    torch's geometry rule gives it."""
    if func is not aten.unsqueeze.default or kwargs or len(args) != 2:
        return None
    src, dim = args
    n = src.dim()
    if type(dim) is not int or not -n - 1 <= dim <= n:
        return None
    dim %= n + 1
    size, stride = list(src.shape), list(src.stride())
    if dim < n:
        extent = _size_of(_sym(size[dim]) * _sym(stride[dim]), (*size, *stride))
        new = extent if extent is not None else size[dim] * stride[dim]
    else:
        new = 1
    size.insert(dim, 1)
    stride.insert(dim, new)
    return src.as_strided(size, stride, src.storage_offset())


def full_index(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """aten.index.Tensor with an integer index tensor for every dim of the input (GPT-2's
    attention mask: `mask[batch[:, None, None, None], kv[None, None, None, :]]`, 10-15 ms
    each through torch's symbolic arithmetic): a new contiguous tensor of the indices'
    broadcast shape in the input's dtype. The meta kernel orders the result's dims by the
    input's strides with the indexed dims' set to 0; with every dim indexed that order is
    the identity. Broadcasting is taken only where it needs no guard: per dim, a literal 1
    or one expression."""
    if func is not aten.index.Tensor or kwargs or len(args) != 2:
        return None
    src, indices = args
    if not isinstance(src, torch.Tensor) or src.dim() == 0 or len(indices) != src.dim():
        return None
    if not all(isinstance(i, torch.Tensor) and i.dtype in _INDEX_DTYPES for i in indices):
        return None
    rank = max(i.dim() for i in indices)
    shape: list[Any] = [1] * rank
    for i in indices:
        for d, size in enumerate(i.shape, start=rank - i.dim()):
            e, have = _sym(size), _sym(shape[d])
            if e == 1 or e == have:
                continue
            if have != 1:
                return None
            shape[d] = size
    operands = [v for i in indices for v in (*i.shape, *i.stride())]
    return _contiguous(shape, src.dtype, operands)


_INDEX_DTYPES = (torch.int64, torch.int32)  # bool and uint8 masks go through nonzero


def attention(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """`F.scaled_dot_product_attention` on symbolic layouts as torch's meta kernel gives it
    (the math path, `softmax(q @ k^T * scale + mask) @ v`, whose last product is a bmm
    viewed back: torch's contiguous strides): a new tensor of the query's leading sizes
    and the value's last, in their dtype. GPT-2's attention took 60-120 ms through torch's
    checks and the math path's decompositions on SymInts. Taken only where that needs no
    guard and torch accepts the arguments: q, k, v of one floating dtype and one rank >= 3,
    their batch sizes the same expressions, q's and k's last sizes and k's and v's
    sequence sizes the same; a mask of bool or that dtype, of no higher rank, broadcasting
    to (batch, L, S) with a literal 1 or the same expression per dim (a mask can widen the
    result: left to the meta kernel); no dropout, no grouped heads, no mask with
    `is_causal`. None otherwise."""
    if not ENABLED:
        return None
    try:
        q, k, v, mask, dropout_p, is_causal, scale, gqa = _attention_args(*args, **kwargs)
    except TypeError:
        return None
    if not all(isinstance(t, torch.Tensor) and t.layout is torch.strided for t in (q, k, v)):
        return None
    rank, dtype = q.dim(), q.dtype
    if rank < 3 or k.dim() != rank or v.dim() != rank or not dtype.is_floating_point:
        return None
    if k.dtype != dtype or v.dtype != dtype or dropout_p != 0.0 or gqa is not False:
        return None
    if not (scale is None or type(scale) in (int, float)) or type(is_causal) is not bool:
        return None
    qs, ks, vs = ([_sym(n) for n in t.shape] for t in (q, k, v))
    if not qs[:-2] == ks[:-2] == vs[:-2] or qs[-1] != ks[-1] or ks[-2] != vs[-2]:
        return None
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or is_causal or mask.dim() > rank:
            return None
        if mask.dtype not in (torch.bool, dtype) or mask.layout is not torch.strided:
            return None
        scores = [*qs[:-1], ks[-2]]
        if any(
            e != 1 and e != scores[d]
            for d, e in enumerate(map(_sym, mask.shape), start=rank - mask.dim())
        ):
            return None
    size = (*q.shape[:-1], v.shape[-1])
    stats["attention"] += 1
    return _contiguous(size, dtype, (*q.shape, *v.shape, *v.stride()))


def _attention_args(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: Any = 0.0,
    is_causal: Any = False,
    scale: Any = None,
    *,
    enable_gqa: Any = False,
) -> tuple:
    """SDPA's arguments by its signature (a TypeError where they do not fit it)."""
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


_LIKE = (
    aten._to_copy.default,
    aten.empty_like.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.full_like.default,
)


def like(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """_to_copy and the *_like factories of a tensor with torch's contiguous strides, in
    the same (preserved) format: a new tensor of its layout, in the dtype asked for."""
    if func not in _LIKE or not args or not isinstance(args[0], torch.Tensor):
        return None
    src = args[0]
    plain = kwargs.get("layout") in (None, torch.strided) and kwargs.get("device") in (None, META)
    formats = (None, torch.preserve_format, torch.contiguous_format)
    if not plain or kwargs.get("memory_format") not in formats or not _canonical(src):
        return None
    return hollow_tensor(src.shape, src.stride(), kwargs.get("dtype") or src.dtype)


def _stand_in(described: Any) -> Any:
    kind, *rest = described
    if kind is torch.Tensor:
        dtype, rank = rest
        return torch.empty((1,) * rank, dtype=dtype, device="meta")
    if kind is dict:
        return {k: _stand_in(v) for k, v in rest[0]}
    if kind in (list, tuple):
        return kind(_stand_in(a) for a in rest[0])
    return rest[0]


_SHORTCUTS = (
    contiguous_view,
    same_size_expand,
    unsqueeze,
    like,
    pointwise,
    along_a_dim,
    matmul,
    layer_norm,
    full_index,
)
