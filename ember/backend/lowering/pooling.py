"""2-d pooling lowered to lazy per-element expressions over the pooling window.

A pooled element is a fixed, small window of input elements (3x3, 2x2): each window tap is
a load, so max/avg pooling is one expression per output element that fuses with whatever
pointwise op follows it. A padded pooling first writes its input into a buffer padded with
-inf (max) or 0 (avg), with the pointwise ops before it (a batch norm's multiply-add and
ReLU) computed there once per element; except a channels-last max pooling, whose taps read
the input at positions clamped into it (no condition per tap, the pointwise ops before it
computed per tap in the same kernel, as Inductor's kernel does). Global average pooling
(`adaptive_avg_pool2d` to 1x1) is a mean over the spatial dims (a reduction), its backward
a broadcast.

Not lowered: `max_pool2d_with_indices_backward` and `avg_pool2d_backward`. Written as a
gather (each input element sums the output positions whose window holds it, with masked
loads at positions divided by the stride), they measured 19.5 ms and 15.7 ms against
eager's scatter kernels' 4.8 ms and 11.0 ms (8 x 32 x 64 x 64, 3x3 stride 2 padding 1, one
thread): aten runs them, and their results feed the lowered kernels after them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, Expr, ReductionType
from ember.backend.ir.nodes import UnaryOp as U
from ember.backend.lowering import pointwise as pw
from ember.backend.lowering.reductions import reduce, scale
from ember.backend.lowering.registry import LowerCtx, NotLowered, opmath, register
from ember.backend.lowering.values import LazyValue, Value, cast

aten = torch.ops.aten


def _pair(v: Any, default: Sequence[int] | None = None) -> tuple[int, int]:
    if v is None or (isinstance(v, list | tuple) and not v):
        if default is None:
            raise NotLowered("pooling parameter missing")
        return tuple(default)  # type: ignore[return-value]
    if isinstance(v, int):
        return v, v
    if not all(isinstance(e, int) for e in v):
        raise NotLowered("symbolic pooling parameter")
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _check(x: Value) -> DType:
    if not isinstance(x.dtype, DType) or not x.dtype.is_float or len(x.size) not in (3, 4):
        raise NotLowered("pooling of a non-float or of other than 3-d/4-d input")
    return x.dtype


def _index(e: sympy.Expr) -> Expr:
    return ir.IndexValue(e, DType.I64)


def _tap(v: Value, lead: list, pos: Sequence[sympy.Expr], dtype: DType) -> Expr:
    return cast(v.load([*lead, *pos]), dtype)


class _Window:
    """The geometry of a 2-d pooling: kernel, stride, padding, dilation, sizes."""

    def __init__(self, x: Value, out_size, kernel, stride, padding, dilation=1) -> None:
        self.k = _pair(kernel)
        self.s = _pair(stride, self.k)
        self.p = _pair(padding)
        self.d = _pair(dilation)
        self.size = tuple(x.size[-2:])
        self.out = tuple(out_size[-2:])
        if not all(isinstance(v, int) for v in (*self.size, *self.out)):
            raise NotLowered("pooling with symbolic spatial sizes")
        # taps can fall outside the input (padding, or ceil mode's last window)
        self.masked = any(
            self.p[i] > 0
            or (self.out[i] - 1) * self.s[i] + (self.k[i] - 1) * self.d[i] >= self.size[i]
            for i in range(2)
        )

    def start(self, o: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        return [o[i] * self.s[i] - self.p[i] for i in range(2)]

    def clamped(self, pos: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        """A tap's position moved onto the nearest input element where it can fall
        outside; that element is in the same window (padding is at most half the kernel
        and the last window starts inside the input). Max pooling over such taps gets
        eager's maximum and index with no condition per tap: clamping is monotone, so the
        taps still visit the window's elements in row-major order with each element's
        repeats next to it, and the first maximum and the last NaN are eager's."""
        out = []
        for i, p in enumerate(pos):
            first = p.subs({v: 0 for v in p.free_symbols})
            last = p.subs({v: self.out[i] - 1 for v in p.free_symbols})
            if first < 0:
                p = sympy.Max(p, 0)
            if last >= self.size[i]:
                p = sympy.Min(p, self.size[i] - 1)
            out.append(p)
        return out

    def taps(self, o: Sequence[sympy.Expr]):
        """(tap position, tap number) over the window of output position `o`, row-major."""
        h0, w0 = self.start(o)
        for kh, kw in itertools.product(range(self.k[0]), range(self.k[1])):
            yield [h0 + kh * self.d[0], w0 + kw * self.d[1]]


def _padded(ctx: LowerCtx, x: Value, win: _Window, fill: float, dtype: DType) -> Value:
    """x with `fill` around it, realized: its spatial position (h, w) holds x at (h - pad_h,
    w - pad_w), and it extends to the last tap of the last window. Taps then read it without
    masks: a masked load at a strided position is a masked gather per tap (bench/convnets.py's
    stem max pool: 56 ms with masked taps, 2.2 + 1.6 ms with this buffer), and a pointwise
    producer of x (a batch norm and ReLU) runs once per element here, not once per tap."""
    lead = list(x.size[:-2])
    size = [
        max((win.out[i] - 1) * win.s[i] + (win.k[i] - 1) * win.d[i] + 1, win.size[i] + win.p[i])
        for i in range(2)
    ]

    def load(idx):
        # masks and bounds on the loop variables themselves, so that codegen cuts the
        # innermost loop at the padding and the interior part has neither
        pad = idx[-2:]
        masks = tuple(ir.Mask(v, win.p[i], win.size[i] + win.p[i]) for i, v in enumerate(pad))
        v = cast(x.load([*idx[:-2], pad[0] - win.p[0], pad[1] - win.p[1]]), dtype)
        v = ir.map_loads(v, lambda ld: ir.Load(ld.buffer, ld.index, ld.dtype, (*ld.mask, *masks)))
        inside = None
        for i, p in enumerate(pad):
            below = pw.bin_(B.LT, _index(p), pw.const(win.p[i], DType.I64))
            beyond = pw.bin_(B.LT, _index(p), pw.const(win.size[i] + win.p[i], DType.I64))
            cond = pw.bin_(B.LOGICAL_AND, pw.un(U.LOGICAL_NOT, below), beyond)
            inside = cond if inside is None else pw.bin_(B.LOGICAL_AND, inside, cond)
        return pw.where(inside, v, pw.const(fill, dtype))

    full = (*lead, *size)
    return ctx.builder.realize(LazyValue(full, dtype, load), _strides_like(full, ctx.meta))


def _channels_innermost(meta: Any) -> bool:
    """Whether the (first) result is channels-last: its innermost loop runs over channels,
    so a tap's position is the same for a whole vector of them."""
    out = meta[0] if isinstance(meta, list | tuple) else meta
    return out.dim() == 4 and out.shape[1] > 1 and out.stride()[1] == 1


def _strides_like(size: tuple, meta: Any) -> tuple[int, ...]:
    """Dense strides for `size` in the dim order of the op's (first) output: a channels-last
    pooling reads and writes its padded copy channels-last."""
    out = meta[0] if isinstance(meta, list | tuple) else meta
    order = sorted(range(len(size)), key=lambda d: (-out.stride()[d], d))
    strides, acc = [0] * len(size), 1
    for d in reversed(order):
        strides[d], acc = acc, acc * size[d]
    return tuple(strides)


def _max_pool(ctx: LowerCtx, x: Value, win: _Window, size: tuple) -> tuple[LazyValue, LazyValue]:
    """(max, argmax as h * W + w) per window, as eager computes them: the first maximum,
    NaN propagating (a later NaN replaces an earlier one), padding never chosen."""
    dtype = _check(x)
    if win.masked and win.d != (1, 1):
        raise NotLowered("padded max pooling with dilation")
    comp = opmath(dtype)
    width = win.size[1]
    src, shift = x, (0, 0)
    # channels-last: taps outside the input read the nearest element instead (see
    # _Window.clamped); NCHW: a copy padded with -inf, which a strict > never picks
    clamped = win.masked and _channels_innermost(ctx.meta)
    padded = win.masked and not clamped
    if padded:
        src, shift = _padded(ctx, x, win, float("-inf"), comp), win.p

    def scan(idx) -> tuple[Expr, Expr]:
        lead, o = list(idx[:-2]), idx[-2:]
        best: Expr | None = None
        arg: Expr | None = None
        if padded:  # start from -inf at the window's first in-bounds position
            best = pw.const(float("-inf"), comp)
            h0, w0 = (sympy.Max(v, 0) for v in win.start(o))
            arg = _index(h0 * width + w0)
        for pos in win.taps(o):
            pos = win.clamped(pos) if clamped else pos
            v = _tap(src, lead, [pos[0] + shift[0], pos[1] + shift[1]], comp)
            flat = _index(pos[0] * width + pos[1])
            if best is None:
                best, arg = v, flat
                continue
            take = pw.bin_(B.LOGICAL_OR, pw.bin_(B.GT, v, best), pw.un(U.ISNAN, v))
            # the running maximum as NaN-propagating maximum(): the same value as taking v,
            # and each step reads the previous once (where(take, v, best) reads it twice,
            # and the expression tree doubled with each tap: 24 s to lower a 4x4 window)
            best, arg = pw.bin_(B.MAXIMUM, best, v), pw.where(take, flat, arg)
        assert best is not None and arg is not None
        return best, arg

    values = LazyValue(size, dtype, lambda idx: cast(scan(idx)[0], dtype))
    indices = LazyValue(size, DType.I64, lambda idx: scan(idx)[1])
    return values, indices


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(
    ctx: LowerCtx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False
) -> list[Value]:
    size = tuple(ctx.meta[0].shape)
    return list(_max_pool(ctx, x, _Window(x, size, kernel_size, stride, padding, dilation), size))


def _avg_divisor(win: _Window, o, count_include_pad: bool, divisor_override) -> Expr:
    """Eager's divisor for the window at output position `o` (an int64 expression)."""
    if divisor_override:
        return pw.const(divisor_override, DType.I64)
    n: sympy.Expr = sympy.Integer(1)
    for i, st in enumerate(win.start(o)):
        end = sympy.Min(st + win.k[i], win.size[i] + win.p[i])
        if not count_include_pad:
            st, end = sympy.Max(st, 0), sympy.Min(end, win.size[i])
        n = n * (end - st)
    return _index(n)


@register(aten.avg_pool2d.default)
def _avg_pool2d(
    ctx: LowerCtx,
    x,
    kernel_size,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
) -> Value:
    dtype = _check(x)
    comp = opmath(dtype)
    win = _Window(x, ctx.meta.shape, kernel_size, stride, padding)
    src, shift = x, (0, 0)
    if win.masked:  # a copy padded with zeros
        src, shift = _padded(ctx, x, win, 0.0, comp), win.p

    def load(idx):
        lead, o = list(idx[:-2]), idx[-2:]
        total: Expr | None = None
        for pos in win.taps(o):
            v = _tap(src, lead, [pos[0] + shift[0], pos[1] + shift[1]], comp)
            total = v if total is None else pw.bin_(B.ADD, total, v)
        div = cast(_avg_divisor(win, o, count_include_pad, divisor_override), comp)
        return cast(pw.bin_(B.DIV, total, div), dtype)

    return LazyValue(tuple(ctx.meta.shape), dtype, load)


@register(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx: LowerCtx, x, output_size) -> Value:
    """Global average pooling (output 1x1): the mean over the spatial dims."""
    dtype = _check(x)
    if tuple(ctx.meta.shape[-2:]) != (1, 1):
        raise NotLowered("adaptive average pooling to other than 1x1")
    n = len(x.size)
    total = reduce(ctx, x, [n - 2, n - 1], ReductionType.SUM, True, ctx.out_size, opmath(dtype))
    return scale(total, x.size[-2] * x.size[-1], dtype)


@register(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(ctx: LowerCtx, grad, x) -> Value:
    dtype = _check(x)
    if tuple(grad.size[-2:]) != (1, 1):
        raise NotLowered("adaptive average pooling to other than 1x1")
    comp = opmath(dtype)
    n = pw.const(x.size[-2] * x.size[-1], comp)

    def load(idx):
        g = cast(grad.load([*idx[:-2], sympy.Integer(0), sympy.Integer(0)]), comp)
        return cast(pw.bin_(B.DIV, g, n), dtype)

    return LazyValue(tuple(x.size), dtype, load)
