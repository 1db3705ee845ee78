"""Extern kernels (matmul/conv through torch's libraries) and fallbacks (any other aten op).

Both become an `ExternCall` whose tensor arguments are buffer views; the wrapper calls the
op and binds its results to buffers. A fallback is how ember stays correct for every op it
does not lower: it is never refused.
"""

from __future__ import annotations

from typing import Any

import torch

from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import DType, ExternKind, Layout
from ember.backend.lowering.registry import LowerCtx, register
from ember.backend.lowering.values import BufferValue, LazyValue
from ember.backend.sizes import exprs_of

aten = torch.ops.aten

LIBRARY_OPS = frozenset(
    {
        aten.mm.default,
        aten.bmm.default,
        aten.addmm.default,
        aten.baddbmm.default,
        aten.convolution.default,
    }
)


def _arg(ctx: LowerCtx, a: Any, source: Any = None) -> Any:
    """An extern call's argument; a lazy value is realized in the strides eager gives the
    fx node it comes from (`source`), so a channels-last operand stays channels-last."""
    if isinstance(a, LazyValue):
        a = ctx.builder.realize(a, _strides_of(source, a))
    if isinstance(a, BufferValue):
        return ir.TensorArg(a.buffer, a.layout)
    if isinstance(a, list | tuple):
        srcs = source if isinstance(source, list | tuple) else [None] * len(a)
        return tuple(_arg(ctx, x, s) for x, s in zip(a, srcs))
    return a


def _strides_of(source: Any, v: LazyValue) -> tuple | None:
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if (
        isinstance(val, torch.Tensor)
        and tuple(val.shape) == tuple(v.size)
        and all(isinstance(st, int) for st in (*val.shape, *val.stride()))
        and _dense(val.shape, val.stride())
    ):
        return tuple(val.stride())
    return None


def _dense(size: Any, stride: Any) -> bool:
    """Whether the strides are a permutation of contiguous ones."""
    acc = 1
    for st, s in sorted((st, s) for s, st in zip(size, stride) if s != 1):
        if st != acc:
            return False
        acc *= s
    return True


def _tensor_leaves(meta: Any, path: tuple[int, ...] = ()):
    if isinstance(meta, torch.Tensor):
        yield path, meta
    elif isinstance(meta, list | tuple):
        for i, m in enumerate(meta):
            yield from _tensor_leaves(m, path + (i,))


def _rebuild(meta: Any, values: dict[tuple[int, ...], BufferValue], path=()) -> Any:
    if isinstance(meta, torch.Tensor):
        return values[path]
    if isinstance(meta, list | tuple):
        return [_rebuild(m, values, path + (i,)) for i, m in enumerate(meta)]
    return meta


def extern(ctx: LowerCtx, op: Any, args: tuple, kwargs: dict, kind: ExternKind) -> Any:
    """Call `op` from the wrapper; returns buffer values shaped like the op's result."""
    sources = list(ctx.node.args) + [None] * len(args)
    cargs = tuple(_arg(ctx, a, s) for a, s in zip(args, sources))
    ckwargs = tuple((k, _arg(ctx, v, ctx.node.kwargs.get(k))) for k, v in kwargs.items())
    leaves = list(_tensor_leaves(ctx.meta))
    names = tuple(ctx.builder.new_name() for _ in leaves)
    layouts, dtypes, values = [], [], {}
    for name, (path, m) in zip(names, leaves):
        size = exprs_of(m.shape)
        layout = Layout(size, exprs_of(m.stride()), 0)
        dtype = DType.of(m.dtype) or m.dtype
        layouts.append(layout)
        dtypes.append(dtype)
        values[path] = BufferValue(size, dtype, name, layout)
    paths = tuple(p for p, _ in leaves)
    call = ir.ExternCall(kind, op, cargs, ckwargs, names, paths)
    ctx.builder.add_extern(call, layouts, dtypes)
    return _rebuild(ctx.meta, values)


def fallback(ctx: LowerCtx, op: Any, args: tuple, kwargs: dict) -> Any:
    kind = ExternKind.LIBRARY if op in LIBRARY_OPS else ExternKind.FALLBACK
    return extern(ctx, op, args, kwargs, kind)


# mm/bmm: gemm.py (through decompositions); convolution: layout.py
@register(*(LIBRARY_OPS - {aten.mm.default, aten.bmm.default, aten.convolution.default}))
def _library(ctx: LowerCtx, *args: Any, **kwargs: Any) -> Any:
    return extern(ctx, ctx.node.target, args, kwargs, ExternKind.LIBRARY)
