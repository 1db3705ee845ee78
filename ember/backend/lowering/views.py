"""View lowerings as index arithmetic: no data moves for transpose/permute/slice/expand/reshape.

On a buffer, a view is a new strided layout over the same storage, computed by applying the
real view op to a meta tensor with that layout (so stride rules are torch's own). On a lazy
value, a view rewrites the indices its consumers pass in. A reshape that no strides can
express reads through div/mod index arithmetic instead of copying.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from ember.backend import indexing
from ember.backend.ir.nodes import Layout, Size
from ember.backend.lowering.registry import LowerCtx, NotLowered, register
from ember.backend.lowering.values import BufferValue, LazyValue, Value
from ember.backend.sizes import expr_of, exprs_of, same

aten = torch.ops.aten


def _torch_dtype(d: Any) -> torch.dtype:
    return d if isinstance(d, torch.dtype) else d.torch


def meta_view(v: BufferValue, fn: Callable[[torch.Tensor], torch.Tensor]) -> BufferValue:
    """Apply a view op to a meta tensor with `v`'s layout and keep the resulting layout."""
    lay = v.layout
    base = torch.empty(max(lay.storage_numel(), 1), dtype=_torch_dtype(v.dtype), device="meta")
    r = fn(base.as_strided(lay.size, lay.stride, lay.offset))
    size = tuple(int(s) for s in r.shape)
    new = Layout(size, tuple(int(s) for s in r.stride()), int(r.storage_offset()))
    return BufferValue(size, v.dtype, v.buffer, new)


def remap(v: Value, size: Sequence[int], fn: Callable[[list], list]) -> LazyValue:
    """A lazy view: element `idx` of the result is element `fn(idx)` of `v`."""
    return LazyValue(tuple(size), v.dtype, lambda idx: v.load(fn(list(idx))))


def _static(x: BufferValue, out: Sequence[Any]) -> bool:
    lay = x.layout
    return all(isinstance(v, int) for v in (*lay.size, *lay.stride, lay.offset, *out))


def traced_view(ctx: LowerCtx, x: BufferValue) -> BufferValue | None:
    """A view of a buffer with symbolic sizes: the layout the trace recorded for the view's
    result, when the buffer holds the view's input in the layout the trace recorded for it
    (torch's own stride rules, already applied symbolically); else None."""
    src = ctx.node.args[0].meta.get("val") if ctx.node.args else None
    out = ctx.meta
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    lay = x.layout
    size, stride = exprs_of(src.shape), exprs_of(src.stride())
    if len(size) != len(lay.size) or not all(
        same(a, b) for a, b in zip((*size, *stride), (*lay.size, *lay.stride))
    ):
        return None
    shift = expr_of(out.storage_offset()) - expr_of(src.storage_offset())
    new = Layout(exprs_of(out.shape), exprs_of(out.stride()), lay.offset + shift)
    return BufferValue(new.size, x.dtype, x.buffer, new)


def _view(ctx: LowerCtx, x: Value, fn: Callable[[torch.Tensor], torch.Tensor], lazy):
    if isinstance(x, BufferValue):
        if _static(x, ctx.out_size):
            return meta_view(x, fn)
        traced = traced_view(ctx, x)
        if traced is not None:
            return traced
    return remap(x, ctx.out_size, lazy)


@register(aten.permute.default)
def _permute(ctx: LowerCtx, x: Value, dims) -> Value:
    n = len(x.size)
    dims = [d % n for d in dims]

    def lazy(idx):
        old = [sympy.Integer(0)] * n
        for k, d in enumerate(dims):
            old[d] = idx[k]
        return old

    return _view(ctx, x, lambda t: t.permute(dims), lazy)


@register(aten.transpose.int)
def _transpose(ctx: LowerCtx, x: Value, a: int, b: int) -> Value:
    n = len(x.size)
    if n < 2:
        return x
    dims = list(range(n))
    dims[a % n], dims[b % n] = dims[b % n], dims[a % n]
    return _permute(ctx, x, dims)


@register(aten.t.default)
def _t(ctx: LowerCtx, x: Value) -> Value:
    return _transpose(ctx, x, 0, 1) if len(x.size) == 2 else x


@register(aten.expand.default)
def _expand(ctx: LowerCtx, x: Value, size, implicit=False) -> Value:
    out = ctx.out_size
    lead = len(out) - len(x.size)

    def lazy(idx):
        return [
            sympy.Integer(0) if s == 1 and out[lead + k] != 1 else idx[lead + k]
            for k, s in enumerate(x.size)
        ]

    return _view(ctx, x, lambda t: t.expand(out), lazy)


def _squeezed_positions(size: Sequence[int]) -> list[int]:
    return [k for k, s in enumerate(size) if s != 1]


def _unit_reshape(x: Value, out: tuple[int, ...]) -> Callable[[list], list] | None:
    """Index map for a reshape that only adds or drops size-1 dimensions, else None."""
    src, dst = _squeezed_positions(x.size), _squeezed_positions(out)
    if [x.size[k] for k in src] != [out[k] for k in dst]:
        return None

    def lazy(idx):
        old = [sympy.Integer(0)] * len(x.size)
        for s, d in zip(src, dst):
            old[s] = idx[d]
        return old

    return lazy


def reshape(ctx: LowerCtx, x: Value, out: tuple[Size, ...]) -> Value:
    if isinstance(x, BufferValue) and _static(x, out):
        try:
            return meta_view(x, lambda t: t.view(out))
        except RuntimeError:
            pass
    elif isinstance(x, BufferValue):
        traced = traced_view(ctx, x)
        if traced is not None:
            return traced
    unit = _unit_reshape(x, out)
    if unit is not None:
        return remap(x, out, unit)

    def lazy(idx):
        flat = indexing.strided(idx, Layout.contiguous(out).stride)
        return indexing.unflatten(flat, x.size)

    return remap(x, out, lazy)


@register(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.unsqueeze.default,
)
def _reshape(ctx: LowerCtx, x: Value, *args: Any) -> Value:
    return reshape(ctx, x, ctx.out_size)


@register(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def _alias(ctx: LowerCtx, x: Value) -> Value:
    return x


@register(aten.as_strided.default)
def _as_strided(ctx: LowerCtx, x: Value, size, stride, offset=None) -> Value:
    """An as_strided that gives its input's elements new strides only along size-1 dims
    (the trace of a global pooling that restrides its (N, C, 1, 1) result channels-last):
    the same elements, whatever storage ember holds them in. Any other as_strided reads
    eager's storage layout, which ember's buffers need not share: aten runs it."""
    src = ctx.node.args[0].meta.get("val") if ctx.node.args else None
    if not isinstance(src, torch.Tensor) or tuple(size) != tuple(src.shape):
        raise NotLowered("as_strided to other sizes")
    if offset not in (None, src.storage_offset()):
        raise NotLowered("as_strided with another storage offset")
    if not all(s == 1 or same(a, b) for s, a, b in zip(src.shape, stride, src.stride())):
        raise NotLowered("as_strided that moves elements")
    return x


@register(aten.slice.Tensor)
def _slice(ctx: LowerCtx, x: Value, dim=0, start=None, end=None, step=1) -> Value:
    n = len(x.size)
    dim %= n
    size = x.size[dim]
    start = 0 if start is None else start
    if isinstance(start, int) and isinstance(size, int):
        if start < 0:
            start += size
        start = min(max(start, 0), size)
    elif isinstance(start, int) and start < 0:
        start += size  # the trace guarded |start| <= size (eager's clamp did not apply)
    elif not (isinstance(start, int) or start.is_nonnegative):
        raise NotLowered(f"slice start {start}")

    def lazy(idx):
        old = list(idx)
        old[dim] = start + step * idx[dim]
        return old

    return _view(ctx, x, lambda t: t[(slice(None),) * dim + (slice(start, end, step),)], lazy)


@register(aten.select.int)
def _select(ctx: LowerCtx, x: Value, dim: int, index: int) -> Value:
    dim %= len(x.size)
    if isinstance(index, int) and index < 0:
        index += x.size[dim]

    def lazy(idx):
        return list(idx[:dim]) + [sympy.sympify(index)] + list(idx[dim:])

    return _view(ctx, x, lambda t: t.select(dim, index), lazy)


@register(aten.split.Tensor, aten.split_with_sizes.default)
def _split(ctx: LowerCtx, x: Value, sizes, dim=0) -> list[Value]:
    dim %= len(x.size)
    out, start = [], 0
    for m in ctx.meta:
        part = expr_of(m.shape[dim])
        sub = LowerCtx(ctx.builder, m, ctx.node)
        out.append(_slice(sub, x, dim, start, start + part, 1))
        start += part
    return out


@register(aten.unbind.int)
def _unbind(ctx: LowerCtx, x: Value, dim=0) -> list[Value]:
    return [_select(LowerCtx(ctx.builder, m, ctx.node), x, dim, i) for i, m in enumerate(ctx.meta)]
