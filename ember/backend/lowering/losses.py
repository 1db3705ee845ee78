"""nll_loss (cross entropy's second half) lowered, forward and backward.

Classification models end their training step in `log_softmax` + `nll_loss_forward` and
start the backward in `nll_loss_backward` + `_log_softmax_backward_data`. As aten
fallbacks the two nll calls cost 30-45 us each per step on the sweep's conv nets (more than
the few hundred elements they touch), and they cut the loss's kernels apart: the backward's
one-hot gradient is a pointwise value that the log-softmax backward and the classifier's
bias gradient read.

Neither needs a gather: an element (n, c) is picked where its class index c equals the
target t[n] (and t[n] is not ignore_index), so the forward is a masked sum over the input
and the backward a pointwise select. The forward reads all N*C elements where eager reads
N, so it is lowered only up to `FORWARD_LIMIT` elements (a language model's vocabulary
keeps the fallback); the backward writes all N*C elements in eager too.

A target outside [0, C) that is not ignore_index raises eager's IndexError: the lowering
counts such targets in a reduction over the N targets (fused with the kernels that read them)
and the wrapper calls `raise_out_of_bounds` on the count, which costs one `.item()` when all
are in range (an aten check of the targets would cost more than the fallback saves). Class
weights keep the fallback.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, ExternKind, ReductionType
from ember.backend.ir.nodes import UnaryOp as U
from ember.backend.lowering import pointwise as pw
from ember.backend.lowering.fallback import extern
from ember.backend.lowering.reductions import numel, reduce
from ember.backend.lowering.registry import LowerCtx, NotLowered, opmath, register
from ember.backend.lowering.values import LazyValue, Value, cast

aten = torch.ops.aten

FORWARD_LIMIT = 1 << 16
"""Most input elements for which the forward is lowered (a masked sum over all of them)."""

_NONE, _MEAN, _SUM = 0, 1, 2


def _check(x: Value, target: Value, weight: Any, reduction: int) -> None:
    if weight is not None:
        raise NotLowered("nll_loss with class weights")
    if len(x.size) not in (1, 2) or not isinstance(x.dtype, DType) or not x.dtype.is_float:
        raise NotLowered("nll_loss of other than a 1-d or 2-d float input")
    if target.dtype != DType.I64 or not all(isinstance(s, int) for s in x.size):
        raise NotLowered("nll_loss with a non-int64 target or a symbolic size")
    if reduction not in (_NONE, _MEAN, _SUM):
        raise NotLowered(f"nll_loss reduction {reduction}")


def _counted(t: ir.Expr, ignore_index: int) -> ir.Expr:
    return pw.bin_(B.NE, t, pw.const(ignore_index, DType.I64))


def _check_bounds(ctx: LowerCtx, target: Value, classes: int, ignore_index: int) -> None:
    """Count the targets eager's kernel rejects; the wrapper raises its error on a count.
    CPU only: on a GPU reading the count would wait for the device at every call."""
    if ctx.builder.device.type != "cpu":
        raise NotLowered(f"nll_loss on {ctx.builder.device}: its target check would wait for it")
    i64 = DType.I64

    def bad(idx):
        t = target.load(idx)
        outside = pw.bin_(
            B.LOGICAL_OR,
            pw.bin_(B.LT, t, pw.const(0, i64)),
            pw.bin_(B.GE, t, pw.const(classes, i64)),
        )
        return cast(pw.bin_(B.LOGICAL_AND, outside, _counted(t, ignore_index)), i64)

    count: Value = LazyValue(target.size, i64, bad)
    if target.size:
        count = reduce(ctx, count, [0], ReductionType.SUM, False, (), i64)
    no_result = dataclasses.replace(ctx, meta=None)
    extern(no_result, raise_out_of_bounds, (count, target, classes, ignore_index), {}, _KIND)


_KIND = ExternKind.LIBRARY
"""The check is ember's own runtime code, not an aten op left unlowered."""


def raise_out_of_bounds(count: torch.Tensor, target: torch.Tensor, classes: int, ignore: int):
    """Raise eager's IndexError, naming the first rejected target, if `count` is not 0."""
    if count.item():
        flat = target.reshape(-1)
        rejected = flat[((flat < 0) | (flat >= classes)) & (flat != ignore)]
        raise IndexError(f"Target {int(rejected[0])} is out of bounds.")


def _picked(target: Value, idx: list[sympy.Expr], ignore_index: int) -> ir.Expr:
    """Whether element idx (..., class) is its row's target class (and counted)."""
    t = target.load(idx[:-1])
    hit = pw.bin_(B.EQ, ir.IndexValue(idx[-1], DType.I64), t)
    return pw.bin_(B.LOGICAL_AND, hit, _counted(t, ignore_index))


@register(aten.nll_loss_forward.default)
def _nll_loss_forward(
    ctx: LowerCtx, x: Value, target: Value, weight: Any, reduction: int, ignore_index: int
) -> list[Value]:
    """(loss, total weight): -sum of the picked elements (over the classes for 'none'),
    divided by the count of counted targets for 'mean', as eager's kernel divides."""
    _check(x, target, weight, reduction)
    if numel(x.size, range(len(x.size))) > FORWARD_LIMIT:
        raise NotLowered(f"nll_loss_forward over more than {FORWARD_LIMIT} elements")
    _check_bounds(ctx, target, int(x.size[-1]), ignore_index)
    out = x.dtype  # the loss's and the total weight's
    comp = opmath(out)
    zero = pw.const(0.0, comp)

    def term(idx):
        v = pw.un(U.NEG, cast(x.load(idx), comp))
        return pw.where(_picked(target, idx, ignore_index), v, zero)

    terms = LazyValue(x.size, comp, term)
    if reduction == _NONE:
        loss = reduce(ctx, terms, [len(x.size) - 1], ReductionType.SUM, False, x.size[:-1], out)
        return [loss, LazyValue((), out, lambda idx: pw.const(0.0, out))]
    dims = list(range(len(x.size)))
    total = reduce(ctx, terms, dims, ReductionType.SUM, False, (), comp)
    counted = LazyValue(
        target.size, comp, lambda idx: cast(_counted(target.load(idx), ignore_index), comp)
    )
    if target.size:
        counted = reduce(ctx, counted, [0], ReductionType.SUM, False, (), comp)
    weight_total = LazyValue((), out, lambda idx: cast(counted.load([]), out))
    if reduction == _SUM:
        return [LazyValue((), out, lambda idx: cast(total.load([]), out)), weight_total]

    def mean(idx):
        return cast(pw.bin_(B.DIV, total.load([]), counted.load([])), out)

    return [LazyValue((), out, mean), weight_total]


@register(aten.nll_loss_backward.default)
def _nll_loss_backward(
    ctx: LowerCtx,
    grad: Value,
    x: Value,
    target: Value,
    weight: Any,
    reduction: int,
    ignore_index: int,
    total_weight: Value,
) -> Value:
    """-grad (divided by the total weight for 'mean') at each picked element, 0 elsewhere:
    eager's `-(grad / total_weight)`, written over the whole input."""
    _check(x, target, weight, reduction)
    _check_bounds(ctx, target, int(x.size[-1]), ignore_index)
    out = ctx.out_dtype
    comp = opmath(out)

    def load(idx):
        g = cast(grad.load(idx[:-1] if reduction == _NONE else []), comp)
        if reduction == _MEAN:
            g = pw.bin_(B.DIV, g, cast(total_weight.load([]), comp))
        v = pw.where(_picked(target, idx, ignore_index), pw.un(U.NEG, g), pw.const(0.0, comp))
        return cast(v, out)

    return LazyValue(x.size, out, load)
