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


def _arg(ctx: LowerCtx, a: Any) -> Any:
    if isinstance(a, LazyValue):
        a = ctx.builder.realize(a)
    if isinstance(a, BufferValue):
        return ir.TensorArg(a.buffer, a.layout)
    if isinstance(a, list | tuple):
        return tuple(_arg(ctx, x) for x in a)
    return a


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
    cargs = tuple(_arg(ctx, a) for a in args)
    ckwargs = tuple((k, _arg(ctx, v)) for k, v in kwargs.items())
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


@register(*(LIBRARY_OPS - {aten.mm.default, aten.bmm.default}))
def _library(ctx: LowerCtx, *args: Any, **kwargs: Any) -> Any:
    return extern(ctx, ctx.node.target, args, kwargs, ExternKind.LIBRARY)
