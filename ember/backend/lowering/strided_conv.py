"""1x1 convolutions with a stride (ResNet's and RegNet's downsampling shortcuts) run as the
stride-1 convolution of the subsampled input, forward and backward.

A 1x1 convolution of stride s and no padding reads only the input pixels at multiples of s,
so it equals the same convolution with stride 1 over `x[..., ::s, ::s]`; its input
gradient is that convolution's input gradient placed at those pixels, zero elsewhere, and
its weight and bias gradients are the stride-1 ones. PyTorch's CPU kernels take a slow
path for the strided form (one thread, float32, measured in one process; `bench/
kernel_times.py --model regnet` shows these calls first):

| input, weight | forward strided / subsampled | backward strided / subsampled |
|---|---|---|
| (2,16,16,16), (16,16,1,1) | 87 / 30 us | 307 / 67 us |
| (2,16,8,8), (32,16,1,1) | 102 / 10 us | 225 / 102 us |
| (8,64,56,56), (128,64,1,1) | 3.0 / 2.2 ms | 28.4 / 5.3 ms |

The values are the same products summed in the same order for the forward and the input
gradient (bit-identical in those cases); the weight gradient's sums may be ordered
differently by the library (within rounding). The subsampled input is one pointwise
kernel (it fuses with whatever else reads the input), the placed gradient a lazy value
its readers inline.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from ember.backend.indexing import FloorDiv, ModIdx
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, ExternKind, contiguous_strides
from ember.backend.lowering import pointwise as pw
from ember.backend.lowering.fallback import extern
from ember.backend.lowering.layout import channels_last_strides, same_strides
from ember.backend.lowering.registry import LowerCtx, register
from ember.backend.lowering.values import BufferValue, LazyValue, Value

aten = torch.ops.aten


def applies(x: Value, weight: Value, stride: Any, padding: Any, transposed: bool) -> bool:
    """A 2-d 1x1 convolution with a stride above 1, no padding, static sizes."""
    sizes = (*x.size, *weight.size)
    return (
        len(x.size) == 4
        and not transposed
        and all(isinstance(s, int) for s in (*sizes, *stride, *padding))
        and tuple(weight.size[2:]) == (1, 1)
        and any(s > 1 for s in stride)
        and all(p == 0 for p in padding)
        and all(s > 0 for s in x.size)
    )


def channels_last(size: tuple[int, ...], stride: Any) -> bool:
    """Whether `stride` lays out `size` channels-last and not also NCHW (one channel)."""
    cl = same_strides(size, stride, channels_last_strides(size))
    return cl and not same_strides(size, stride, contiguous_strides(size))


def subsampled(ctx: LowerCtx, x: Value, stride: Any, cl: bool) -> BufferValue:
    """x[..., ::s0, ::s1], written dense (channels-last or NCHW)."""
    n, c, h, w = x.size
    s0, s1 = stride
    size = (n, c, -(-h // s0), -(-w // s1))

    def load(idx):
        return x.load([idx[0], idx[1], idx[2] * s0, idx[3] * s1])

    strides = channels_last_strides(size) if cl else contiguous_strides(size)
    return ctx.builder.realize(LazyValue(size, x.dtype, load), strides)


def _placed(gi: Value, size: tuple[int, ...], stride: Any) -> LazyValue:
    """The stride-1 input gradient `gi` at the pixels (h, w) that are multiples of the
    stride, 0 at the others."""
    s0, s1 = stride

    def on_grid(i: sympy.Expr, s: int) -> ir.Expr:
        return pw.bin_(B.EQ, ir.IndexValue(ModIdx(i, s), DType.I64), pw.const(0, DType.I64))

    def load(idx):
        v = gi.load([idx[0], idx[1], FloorDiv(idx[2], s0), FloorDiv(idx[3], s1)])
        hit = pw.bin_(B.LOGICAL_AND, on_grid(idx[2], s0), on_grid(idx[3], s1))
        return pw.where(hit, v, pw.const(0.0, v.dtype))

    return LazyValue(size, gi.dtype, load)


@register(aten.convolution_backward.default)
def _convolution_backward(
    ctx: LowerCtx,
    grad: Value,
    x: Value,
    weight: Value,
    bias_sizes: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    mask: Any,
) -> Any:
    op = aten.convolution_backward.default
    args = (grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding)
    args += (groups, mask)
    if not applies(x, weight, stride, padding, transposed):
        return extern(ctx, op, args, {}, ExternKind.FALLBACK)
    gi_meta = ctx.meta[0]
    if gi_meta is not None:
        cl = channels_last(tuple(gi_meta.shape), gi_meta.stride())
    else:
        cl = isinstance(x, BufferValue) and channels_last(x.size, x.layout.stride)
    sub = subsampled(ctx, x, stride, cl)
    one = [1] * len(stride)
    zero = [0] * len(stride)
    meta = list(ctx.meta)
    if gi_meta is not None:
        meta[0] = torch.empty_strided(
            sub.size, sub.layout.stride, dtype=gi_meta.dtype, device="meta"
        )
    sub_ctx = dataclasses.replace(ctx, meta=tuple(meta))
    args = (grad, sub, weight, bias_sizes, one, zero, one, False, zero, groups, mask)
    result = extern(sub_ctx, op, args, {}, ExternKind.FALLBACK)
    if gi_meta is not None:
        result[0] = _placed(result[0], tuple(x.size), stride)
    return result
