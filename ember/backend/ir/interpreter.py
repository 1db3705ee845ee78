"""Reference interpreter of the loop IR: evaluates each node with whole-array torch ops.

It is deliberately unlike the generated C++ (index grids instead of loops, torch's math
instead of ember's approximations), so agreement between the two means something. Tests use
it as the oracle for codegen; it is far too slow for anything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ember.backend import indexing
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import ReductionType as R
from ember.backend.ir.nodes import UnaryOp as U

_UNARY = {
    U.NEG: torch.neg,
    U.ABS: torch.abs,
    U.EXP: torch.exp,
    U.EXP_SHIFTED: torch.exp,
    U.EXP_SHIFTED_SUMMAND: torch.exp,
    U.EXPM1: torch.expm1,
    U.LOG: torch.log,
    U.LOG1P: torch.log1p,
    U.SQRT: torch.sqrt,
    U.RSQRT: torch.rsqrt,
    U.TANH: torch.tanh,
    U.SIGMOID: torch.sigmoid,
    U.ERF: torch.erf,
    U.SIN: torch.sin,
    U.COS: torch.cos,
    U.RECIPROCAL: torch.reciprocal,
    U.RELU: torch.relu,
    U.FLOOR: torch.floor,
    U.CEIL: torch.ceil,
    U.TRUNC: torch.trunc,
    U.ROUND: torch.round,
    U.SIGN: torch.sign,
    U.ISNAN: torch.isnan,
    U.ISINF: torch.isinf,
    U.LOGICAL_NOT: torch.logical_not,
    U.BITWISE_NOT: torch.bitwise_not,
}
_BINARY = {
    B.ADD: torch.add,
    B.SUB: torch.sub,
    B.MUL: torch.mul,
    B.DIV: torch.div,
    B.MAXIMUM: torch.maximum,
    B.MINIMUM: torch.minimum,
    B.POW: torch.pow,
    B.EQ: torch.eq,
    B.NE: torch.ne,
    B.LT: torch.lt,
    B.LE: torch.le,
    B.GT: torch.gt,
    B.GE: torch.ge,
    B.LOGICAL_AND: torch.logical_and,
    B.LOGICAL_OR: torch.logical_or,
    B.LOGICAL_XOR: torch.logical_xor,
    B.BITWISE_AND: torch.bitwise_and,
    B.BITWISE_OR: torch.bitwise_or,
    B.BITWISE_XOR: torch.bitwise_xor,
    B.ATAN2: torch.atan2,
    B.ERFC_GIVEN_EXP: lambda a, b: torch.erfc(a),
}
_REDUCE = {
    R.SUM: lambda t, dims: t.sum(dims) if dims else t,
    R.PROD: lambda t, dims: _prod(t, dims),
    R.MAX: lambda t, dims: t.amax(dims) if dims else t,
    R.MIN: lambda t, dims: t.amin(dims) if dims else t,
}


def _prod(t: torch.Tensor, dims: list[int]) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        t = t.prod(d)
    return t


def _dt(d: Any) -> torch.dtype:
    return d if isinstance(d, torch.dtype) else d.torch


class _Env:
    def __init__(self, storage: dict[str, torch.Tensor], grid: dict[str, torch.Tensor]):
        self.storage = storage
        self.grid = grid

    def eval(self, e: ir.Expr) -> torch.Tensor:
        if isinstance(e, ir.Load):
            index = torch.as_tensor(indexing.evaluate(e.index, self.grid))
            if not e.mask:
                return self.storage[e.buffer][index]
            inside = torch.ones((), dtype=torch.bool)
            for m in e.mask:
                v = torch.as_tensor(indexing.evaluate(m.value, self.grid))
                inside = inside & (m.lo <= v) & (v < m.hi)
            got = self.storage[e.buffer][torch.where(inside, index, 0)]
            return torch.where(inside, got, torch.zeros((), dtype=got.dtype))
        if isinstance(e, ir.Const):
            return torch.tensor(e.value, dtype=e.dtype.torch)
        if isinstance(e, ir.IndexValue):
            return torch.as_tensor(indexing.evaluate(e.index, self.grid)).to(e.dtype.torch)
        if isinstance(e, ir.Cast):
            return self.eval(e.x).to(e.dtype.torch)
        if isinstance(e, ir.Unary):
            return _UNARY[e.op](self.eval(e.x)).to(e.dtype.torch)
        if isinstance(e, ir.Binary):
            return _BINARY[e.op](self.eval(e.a), self.eval(e.b)).to(e.dtype.torch)
        if isinstance(e, ir.Where):
            return torch.where(self.eval(e.cond), self.eval(e.a), self.eval(e.b))
        raise TypeError(f"not an expression: {e!r}")


def _grid(ranges: Sequence[int], prefix: str, ndim: int, start: int) -> dict[str, torch.Tensor]:
    out = {}
    for k, s in enumerate(ranges):
        shape = [1] * ndim
        shape[start + k] = s
        out[f"{prefix}{k}"] = torch.arange(s).reshape(shape)
    return out


def _flat(t: torch.Tensor, n: int) -> torch.Tensor:
    return torch.as_strided(t, (n,), (1,), t.storage_offset())


def _view(storage: dict, a: ir.TensorArg) -> torch.Tensor:
    flat = storage[a.buffer]
    lay = a.layout
    return torch.as_strided(flat, lay.size, lay.stride, flat.storage_offset() + lay.offset)


def _args(storage: dict, a: Any) -> Any:
    if isinstance(a, ir.TensorArg):
        return _view(storage, a)
    if isinstance(a, tuple):
        return [_args(storage, x) for x in a]
    return a


def _pointwise(n: ir.Pointwise, storage: dict) -> None:
    env = _Env(storage, _grid(n.ranges, "x", len(n.ranges), 0))
    size = tuple(n.ranges)
    value = env.eval(n.body).to(n.dtype.torch).expand(size)
    index = torch.as_tensor(indexing.evaluate(n.index, env.grid)).expand(size)
    storage[n.name][index.reshape(-1)] = value.reshape(-1)


def _reduction(n: ir.Reduction, storage: dict) -> None:
    nd = len(n.ranges) + len(n.reduction_ranges)
    grid = _grid(n.ranges, "x", nd, 0)
    grid.update(_grid(n.reduction_ranges, "r", nd, len(n.ranges)))
    env = _Env(storage, grid)
    full = tuple(n.ranges) + tuple(n.reduction_ranges)
    value = env.eval(n.body).expand(full)
    dims = list(range(len(n.ranges), nd))
    result = _REDUCE[n.reduction_type](value, dims).to(n.dtype.torch)
    out_grid = _grid(n.ranges, "x", len(n.ranges), 0)
    index = torch.as_tensor(indexing.evaluate(n.index, out_grid)).expand(tuple(n.ranges))
    storage[n.name][index.reshape(-1)] = result.reshape(-1)


def _extern(n: ir.ExternCall, storage: dict, buffers: dict[str, ir.Buffer]) -> None:
    args = [_args(storage, a) for a in n.args]
    kwargs = {k: _args(storage, v) for k, v in n.kwargs}
    result = n.op(*args, **kwargs)
    for name, path in zip(n.outputs, n.result_path):
        t = result
        for i in path:
            t = t[i]
        lay = buffers[name].layout
        fixed = torch.empty_strided(lay.size, lay.stride, dtype=t.dtype)
        fixed.copy_(t)
        storage[name] = _flat(fixed, lay.storage_numel())


def run(g: ir.LoopGraph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """Evaluate the graph on real inputs; returns the outputs (views as the layouts say)."""
    storage: dict[str, torch.Tensor] = {}
    buffers = g.buffer_map()
    for b, t in zip(g.inputs, inputs):
        storage[b.name] = _flat(t, b.layout.storage_numel())
    for b in g.buffers:
        storage[b.name] = torch.zeros(b.layout.storage_numel(), dtype=_dt(b.dtype))
    for n in g.nodes:
        if isinstance(n, ir.Pointwise):
            _pointwise(n, storage)
        elif isinstance(n, ir.Reduction):
            _reduction(n, storage)
        else:
            _extern(n, storage, buffers)
    return [
        _view(storage, ir.TensorArg(o.buffer, o.layout)) if isinstance(o, ir.Output) else o
        for o in g.outputs
    ]
