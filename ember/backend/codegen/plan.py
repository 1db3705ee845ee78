"""Kernel plans: what both printers (C++ and Triton) read about a scheduled kernel.

The scheduler decides which nodes share a kernel and in which loops; a plan adds what every
code generator needs to know before printing a line: the kernel's form (pure pointwise,
per-row loops, or reductions down columns), its parameters in signature order (buffers read,
buffers written, size symbols), and the accumulator dtype and identity of each reduction.
The printers then differ only in how they spell loops and expressions. `plan_str` shows the
plans on the "schedule" log channel.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import torch

from ember.backend import sizes
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import DType, ReductionType
from ember.backend.scheduler.fusion import Kernel, column_access


class Form(enum.Enum):
    """How a kernel walks memory."""

    POINTWISE = "pointwise"  # every loop covers the outer space alone
    ROWS = "rows"  # per outer point, loops over inner (reduced) ranges
    COLUMNS = "columns"  # one loop of reductions reading down columns of a row-major buffer


@dataclasses.dataclass(frozen=True, slots=True)
class KernelPlan:
    kernel: Kernel
    form: Form
    reads: tuple[str, ...]  # buffers read and not produced by the kernel, sorted
    writes: tuple[str, ...]  # buffers the kernel stores, sorted
    sizes: tuple[str, ...]  # size symbols its bounds and indices use, sorted

    @property
    def params(self) -> list[str]:
        """Signature order: buffers read, buffers written, then size symbols."""
        return [*self.reads, *self.writes, *self.sizes]


def plan_kernel(k: Kernel) -> KernelPlan:
    written = sorted(n.name for n in k.nodes() if n.name not in k.local)
    read: set[str] = set()
    for n in k.nodes():
        read |= ir.node_reads(n)
    produced = {n.name for n in k.nodes()}
    if column_reduction(k):
        form = Form.COLUMNS
    elif all(not lp.inner for lp in k.loops):
        form = Form.POINTWISE
    else:
        form = Form.ROWS
    return KernelPlan(k, form, tuple(sorted(read - produced)), tuple(written), kernel_sizes(k))


def plan_str(plan: KernelPlan) -> str:
    """One line per plan, for the schedule log."""
    return f"{plan.kernel.name}: {plan.form.value}({', '.join(plan.params)})"


def acc_type(n: ir.Reduction) -> DType:
    """The dtype a reduction accumulates in (bfloat16 sums in float, as eager does)."""
    return DType.F32 if n.dtype == DType.BF16 else n.dtype


def identity(kind: ReductionType, dtype: DType) -> float | int | bool:
    """The reduction's starting value (an empty reduction's result)."""
    if kind in (ReductionType.SUM, ReductionType.PROD):
        one = kind == ReductionType.PROD
        return one if dtype == DType.BOOL else int(one)
    low = kind == ReductionType.MAX  # max starts at the lowest value
    if dtype.is_float:
        return -math.inf if low else math.inf
    if dtype == DType.BOOL:
        return not low
    limits = torch.iinfo(dtype.torch)
    return limits.min if low else limits.max


def column_reduction(k: Kernel) -> bool:
    """One loop of reductions over one dim whose loads are contiguous in the output index
    and strided in the reduced one (x.sum(0) of a row-major matrix), or depend on only one
    of the two."""
    if len(k.outer) != 1 or len(k.loops[0].inner) != 1:
        return False
    if not all(isinstance(n, ir.Reduction) for n in k.loops[0].nodes):
        return False
    epilogue = [n for lp in k.loops[1:] for n in lp.nodes]
    if any(lp.inner for lp in k.loops[1:]) or any(isinstance(n, ir.Reduction) for n in epilogue):
        return False
    x0, r0 = ir.loop_vars(1)[0], ir.loop_vars(1, "r")[0]
    loads = [ld.index for n in k.loops[0].nodes for ld in ir.loads(n.body)]
    # besides the column reads: per-row values (a layer norm's mean and rstd) and per-column
    # ones read the same in either order
    return any(column_access(i, x0, r0) for i in loads) and all(
        column_access(i, x0, r0) or not (i.has(x0) and i.has(r0)) for i in loads
    )


def kernel_sizes(k: Kernel) -> tuple[str, ...]:
    """Names of the size symbols a kernel needs, sorted (they follow its pointers)."""
    found = sizes.symbols(k.outer, *(lp.inner for lp in k.loops))
    for n in k.nodes():
        found |= sizes.symbols(n.index)
        for e in ir.walk(n.body):
            if isinstance(e, ir.Load):
                found |= sizes.symbols(e.index, *((m.value, m.lo, m.hi) for m in e.mask))
            elif isinstance(e, ir.IndexValue):
                found |= sizes.symbols(e.index)
    return tuple(sorted(s.name for s in found))


def prod(xs) -> ir.Size:
    out = 1
    for x in xs:
        out *= x
    return out
