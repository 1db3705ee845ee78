"""Triton source for scheduled kernels: the GPU printer of the same kernel plans as cpp.py.

A kernel becomes one `@jit` function over tiles of XBLOCK outer points (program i takes
points [i*XBLOCK, (i+1)*XBLOCK)). Each loop of the plan is a tile of shape [XBLOCK, RBLOCK]
over its inner (reduced) range, or [XBLOCK, 1] when it has none. A loop whose range fits
one tile is "persistent": the whole row is in registers, and consecutive persistent loops
over the same range share loads and subexpressions (softmax reads each row once and
computes each exp once). A longer range is walked in chunks of RBLOCK, accumulating
per-lane and combining at the end. bfloat16 is loaded as float32 and rounded when stored;
max/min propagate NaN as eager does. The launch (grid and block sizes) is a line of the
Python wrapper, so symbolic sizes are evaluated per call.
"""

from __future__ import annotations

import math
import re

import sympy

from ember.backend import sizes
from ember.backend.codegen.plan import (
    INFIX,
    Form,
    KernelPlan,
    acc_type,
    identity,
    plan_kernel,
    prod,
)
from ember.backend.codegen.wrapper import pow2
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, ReductionType
from ember.backend.ir.nodes import UnaryOp as U
from ember.backend.scheduler.fusion import Kernel
from ember.backend.sizes import hint

PERSISTENT_MAX = 4096  # longest inner range held in registers as one tile
CHUNK = 1024  # tile width of a longer range, walked in a loop
POINTWISE_BLOCK = 1024  # outer points per program of a pure pointwise kernel
TILE = 4096  # elements per tile of a reduction kernel (XBLOCK * RBLOCK)
COLUMN_TILE = (64, 64)  # (XBLOCK, RBLOCK) of a reduction read down columns

# `jit` and `libdevice` are bound by the loader (triton_runtime): Triton's compiler and
# libdevice on a GPU, the interpreter and torch functions on the CPU
PRELUDE = """import triton.language as tl


@jit
def _maximum(a, b):  # NaN-propagating, as torch.maximum and eager's max reductions
    return tl.where((a != a) | (a > b), a, b)


@jit
def _minimum(a, b):
    return tl.where((a != a) | (a < b), a, b)


@jit
def _bf16_bits(x):  # float32 -> the nearest bfloat16 (ties to even), as float32 bits
    u = x.to(tl.uint32, bitcast=True)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, u | 0x400000, rounded)  # NaN stays NaN (quieted)


@jit
def _round_bf16(x):
    return _bf16_bits(x).to(tl.float32, bitcast=True)


@jit
def _to_bf16(x):  # by bits: the interpreter's own conversion mishandles subnormals
    return (_bf16_bits(x) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@jit
def _max_rows(v):  # max over axis 1 that propagates NaN (Triton's max reduction does not)
    nan = tl.reduce((v != v).to(tl.int8), 1, tl.standard._elementwise_max)[:, None] > 0
    return tl.where(nan, float("nan"), tl.reduce(v, 1, tl.standard._elementwise_max)[:, None])


@jit
def _min_rows(v):
    nan = tl.reduce((v != v).to(tl.int8), 1, tl.standard._elementwise_max)[:, None] > 0
    return tl.where(nan, float("nan"), tl.reduce(v, 1, tl.standard._elementwise_min)[:, None])


@jit
def _from_bf16(x):  # bfloat16 -> float32 exactly, subnormals too (the interpreter flushes them)
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@jit
def _add(a, b):
    return a + b


@jit
def _mul(a, b):
    return a * b
"""

TL = {
    DType.F32: "tl.float32",
    DType.F64: "tl.float64",
    DType.BF16: "tl.float32",  # computed in float32, rounded at stores and casts
    DType.F16: "tl.float32",
    DType.I64: "tl.int64",
    DType.I32: "tl.int32",
    DType.I8: "tl.int8",
    DType.U8: "tl.uint8",
    DType.BOOL: "tl.int1",
}

_COMBINE = {
    ReductionType.SUM: "_add",
    ReductionType.PROD: "_mul",
    ReductionType.MAX: "_maximum",
    ReductionType.MIN: "_minimum",
}

_FLOAT_FN = {
    U.EXP: "tl.exp({})",
    U.EXP_SHIFTED: "tl.exp({})",
    U.EXP_SHIFTED_SUMMAND: "tl.exp({})",
    U.LOG: "tl.log({})",
    U.TANH: "libdevice.tanh({})",
    U.ERF: "libdevice.erf({})",
    U.SIGMOID: "(1.0 / (1.0 + tl.exp(-{})))",
    U.SQRT: "tl.sqrt_rn({})",
    U.RSQRT: "(1.0 / tl.sqrt_rn({}))",
    U.EXPM1: "libdevice.expm1({})",
    U.LOG1P: "libdevice.log1p({})",
    U.SIN: "tl.sin({})",
    U.COS: "tl.cos({})",
    U.FLOOR: "tl.floor({})",
    U.CEIL: "tl.ceil({})",
    U.TRUNC: "libdevice.trunc({})",
    U.ROUND: "libdevice.rint({})",
    U.ABS: "tl.abs({})",
    U.ISINF: "(tl.abs({}) == float('inf'))",
}
_LOGICAL = {B.LOGICAL_AND: "&", B.LOGICAL_OR: "|", B.LOGICAL_XOR: "^"}


def const(value, dtype: DType) -> str:
    """A constant as a [1, 1] tile of its dtype (broadcasts against any tile)."""
    if dtype.is_float:
        v = float(value)
        text = f"float('{v}')" if not math.isfinite(v) else repr(v)
    elif dtype == DType.BOOL:
        text = "1" if value else "0"
    else:
        text = str(int(value))
    return f"tl.full([1, 1], {text}, {TL[dtype]})"


def index(e: sympy.Expr) -> str:
    """Python/Triton source of an index over loop variables and size symbols (indices are
    non-negative, so floor division and modulo are Triton's // and %)."""
    if isinstance(e, sympy.Expr) and e.has(sympy.Max, sympy.Min):
        raise NotImplementedError(f"index expression {e!r}")
    # a size squared, (s0**2), as a product: Triton has no ** on tensors
    return _POWER.sub(lambda m: "(" + "*".join([m[1]] * int(m[2])) + ")", sizes.py(e))


_POWER = re.compile(r"\((\w+)\*\*(\d+)\)")


def _unary(op: U, x: str, d: DType, src: DType) -> str:
    if op in _FLOAT_FN and src.is_float:
        text = _FLOAT_FN[op].format(x)
        # sqrt_rn is float32's correctly rounded root; float64's tl.sqrt already is one
        return text.replace("sqrt_rn", "sqrt") if src == DType.F64 else text
    simple = {
        U.NEG: f"(-{x})",
        U.RECIPROCAL: f"(1.0 / {x})" if d.is_float else f"(1 // {x})",
        U.RELU: f"tl.where({x} < 0, 0, {x})",
        U.ISNAN: f"({x} != {x})",
        U.LOGICAL_NOT: f"({x} == 0)",
        U.BITWISE_NOT: f"({x} == 0)" if d == DType.BOOL else f"(~{x})",
        U.SIGN: f"tl.where({x} != {x}, {x}, ({x} > 0).to({TL[d]}) - ({x} < 0).to({TL[d]}))",
        U.ABS: f"tl.abs({x})",
        U.ISINF: f"({x} != {x})",  # an integer is never infinite (nor NaN)
    }
    if op in simple:
        return simple[op]
    if op in (U.FLOOR, U.CEIL, U.TRUNC, U.ROUND):
        return x  # integers are already integral
    raise NotImplementedError(f"{op} on {src}")


def _binary(op: B, a: str, b: str, src: DType, d: DType) -> str:
    if op in INFIX:
        return f"({a} {INFIX[op]} {b})"
    if op in _LOGICAL:
        return f"(({a} != 0) {_LOGICAL[op]} ({b} != 0))"
    if op == B.DIV:  # integer division truncates, as C's (the IR's) does
        return f"({a} / {b})" if src.is_float else f"({a} // {b})"
    if op == B.MAXIMUM:
        return f"_maximum({a}, {b})"
    if op == B.MINIMUM:
        return f"_minimum({a}, {b})"
    if op == B.POW:
        if src.is_float:
            return f"libdevice.pow({a}, {b})"
        return f"libdevice.pow({a}.to(tl.float32), {b}.to(tl.float32)).to({TL[d]})"
    if op == B.ERFC_GIVEN_EXP:
        return f"libdevice.erfc({a})"
    if op == B.ATAN2:
        return f"libdevice.atan2({a}, {b})"
    raise NotImplementedError(str(op))


def _cast(x: str, src: DType, dst: DType) -> str:
    if dst == DType.BF16:  # rounded by bits: Triton's interpreter truncates
        return f"_round_bf16({x}.to(tl.float32))"
    if dst == DType.F16:  # Triton's own conversion rounds to nearest even, interpreter too
        return f"{x}.to(tl.float32).to(tl.float16).to(tl.float32)"
    if dst == DType.BOOL:
        return f"({x} != 0)"
    return f"{x}.to({TL[dst]})"


class _Body:
    """Prints expressions as assignments, each common subexpression once per scope."""

    def __init__(self, out: _Lines, values: dict[str, str], mask: str) -> None:
        self.out = out
        self.values = values  # buffer -> variable holding its value in this tile
        self.mask = mask  # the tile's mask (where loads may read)
        self.memo: dict[ir.Expr, str] = {}

    def value(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Load) and e.buffer in self.values:
            return self.values[e.buffer]
        if isinstance(e, ir.Const):
            return const(e.value, e.dtype)
        hit = self.memo.get(e)
        if hit is None:
            hit = self.memo[e] = self.out.assign(self._text(e))
        return hit

    def _text(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Load):
            mask = self.mask
            for m in e.mask:
                v = index(m.value)
                mask += f" & ({index(m.lo)} <= {v}) & ({v} < {index(m.hi)})"
            text = f"tl.load({e.buffer} + {self.out.offset(e.index)}, {mask}, other=0)"
            if e.dtype == DType.BF16:
                return f"_from_bf16({text})"
            return f"{text}.to(tl.float32)" if e.dtype == DType.F16 else text
        if isinstance(e, ir.IndexValue):
            return f"{self.out.offset(e.index)}.to({TL[e.dtype]})"
        if isinstance(e, ir.Unary):
            return _unary(e.op, self.value(e.x), e.dtype, e.x.dtype)
        if isinstance(e, ir.Binary):
            return _binary(e.op, self.value(e.a), self.value(e.b), e.a.dtype, e.dtype)
        if isinstance(e, ir.Where):
            return f"tl.where({self.value(e.cond)}, {self.value(e.a)}, {self.value(e.b)})"
        if isinstance(e, ir.Cast):
            return _cast(self.value(e.x), e.x.dtype, e.dtype)
        raise TypeError(f"not an expression: {e!r}")


class _Lines:
    """The kernel's lines, with an indentation level and fresh temporaries."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1
        self.count = 0

    def add(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def assign(self, text: str) -> str:
        name = f"t{self.count}"
        self.count += 1
        self.add(f"{name} = {text}")
        return name

    def offset(self, e: sympy.Expr) -> str:
        """An index as a tile: one without loop variables is broadcast over the outer tile
        (a load or store of a single element still takes the tile's mask)."""
        text = index(e)
        if not any(s.name[0] in "xr" for s in e.free_symbols):
            return f"(xzero + {text})"
        return text


class KernelWriter:
    """Prints one kernel plan as a Triton function and the wrapper's launch of it."""

    def __init__(self, plan: KernelPlan, buffers: dict[str, ir.Buffer]) -> None:
        self.plan = plan
        self.k: Kernel = plan.kernel
        self.buffers = buffers
        self.out = _Lines()
        self.blocks: dict[str, str] = {}  # constexpr block parameter -> wrapper expression

    def source(self) -> str:
        k = self.k
        params = [*self.plan.params]
        self._blocks()
        sig = ", ".join(params + [f"{b}: tl.constexpr" for b in self.blocks])
        out = self.out
        xnumel = prod(k.outer)
        out.add(f"xnumel = {index(xnumel)}")
        # int32 index math unless an index may reach 2^31 (or sizes are only known at run time)
        touched = self.plan.reads + self.plan.writes
        storage = [self.buffers[b].layout.storage_numel() for b in touched]
        wide = not isinstance(xnumel, int) or any(
            not isinstance(n, int) or n >= 2**31 for n in storage
        )
        start = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
        out.add(f"xindex = {start} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        out.add("xmask = xindex < xnumel")
        out.add("xzero = xindex * 0")
        for var, text in _unflatten("xindex", ir.loop_vars(len(k.outer)), k.outer):
            out.add(f"{var} = {text}")
        values: dict[str, str] = {}
        shared: _Body | None = None  # the scope of consecutive persistent loops
        shared_inner: tuple | None = None
        for j, lp in enumerate(k.loops):
            if not lp.inner:
                shared, shared_inner = None, None
                self._statements(lp.nodes, _Body(out, values, "xmask"), values)
                continue
            block = self._block(lp.inner)
            if self._persistent(lp.inner):
                if shared is None or shared_inner != lp.inner:
                    shared = _Body(out, values, f"rmask{j}")
                    shared_inner = lp.inner
                    self._inner_index(j, lp.inner, f"tl.arange(0, {block})[None, :]")
                self._statements(lp.nodes, shared, values)
            else:
                shared, shared_inner = None, None
                self._looped(j, lp, block, values)
        head = f"@jit\ndef {k.name}({sig}):"
        tune = f"TUNE_{k.name} = {self.tune_space()!r}"
        return "\n".join([head, *out.lines, "", "", tune])

    def launch(self) -> str:
        """The wrapper's launch of this kernel: `[grid](...args, blocks)`, with `{args}` to
        be filled in with the tensors and sizes in parameter order. The grid is a function of
        the block sizes (`_grid(xnumel)`, Triton calls it with them), so that an autotuner
        can launch the same line with other blocks."""
        xnumel = sizes.py(prod(self.k.outer))
        blocks = "".join(f", {b}={v}" for b, v in self.blocks.items())
        return f"[_grid({xnumel})]({{args}}{blocks})"

    def tune_space(self) -> list[dict[str, int]]:
        """The launch configurations `mode="max-autotune"` times for this kernel (the
        default first): block sizes the plan allows (a persistent row's width is fixed: it
        must cover the row; looped rows and columns may take other chunk widths; the outer
        block may grow or shrink) with num_warps, and num_stages for looped kernels. Every
        one computes the same values (reductions may sum in another order)."""
        default = {b: int(v) for b, v in self.blocks.items()}
        outer = pow2(max(1, hint(prod(self.k.outer))))
        looped = [b for b in default if b != "XBLOCK" and not self._fixed(b)]
        fixed = {b: v for b, v in default.items() if b != "XBLOCK" and self._fixed(b)}
        blocks = [default]
        if self.plan.form == Form.POINTWISE:
            x0 = default["XBLOCK"]
            blocks += [{"XBLOCK": x} for x in (x0 // 4, x0 // 2, x0 * 2) if 64 <= x <= outer]
        elif self.plan.form == Form.COLUMNS:
            for x, r in ((32, 128), (128, 32), (32, 64)):
                blocks.append({"XBLOCK": min(x, outer), **{b: r for b in looped}})
        else:
            widest = max(fixed.values(), default=1)
            for chunk in (512, 2048) if looped else ():
                x = max(1, min(TILE // max(widest, chunk), outer))
                blocks.append({"XBLOCK": x, **fixed, **{b: chunk for b in looped}})
            x0 = default["XBLOCK"]
            blocks += [{**default, "XBLOCK": x} for x in (x0 // 2, x0 * 2) if 1 <= x <= outer]
        out: list[dict[str, int]] = []
        for b in blocks:
            tile = b["XBLOCK"] * max([v for k, v in b.items() if k != "XBLOCK"], default=1)
            if tile > 16384:
                continue
            warps = min(8, max(1, pow2(tile // 512)))
            stages = 2 if looped else 1
            for w in dict.fromkeys((warps, min(16, warps * 2))):
                cfg = {**b, "num_warps": w, "num_stages": stages}
                if cfg not in out:
                    out.append(cfg)
        return out

    def _fixed(self, block: str) -> bool:
        """Whether a tile-width parameter covers whole rows (persistent): not tunable."""
        inner = list(dict.fromkeys(lp.inner for lp in self.k.loops if lp.inner))
        return self._persistent(inner[int(block[1:-5])])

    # ---------------------------------------------------------------- tiles

    def _persistent(self, inner: tuple) -> bool:
        """Whether loops over `inner` hold the row in one tile: not for a symbolic length
        (its runtime value may be any size)."""
        r = prod(inner)
        return self.plan.form != Form.COLUMNS and isinstance(r, int) and r <= PERSISTENT_MAX

    def _blocks(self) -> None:
        """Block sizes: constants where sizes are static, else expressions the wrapper
        evaluates per call (a persistent tile must cover the row at its runtime length)."""
        k = self.k
        if self.plan.form == Form.POINTWISE:
            self.blocks["XBLOCK"] = str(min(POINTWISE_BLOCK, pow2(max(1, hint(prod(k.outer))))))
            return
        widths = []
        for lp in k.loops:
            if not lp.inner:
                continue
            r = prod(lp.inner)
            if self.plan.form == Form.COLUMNS:
                width = str(min(COLUMN_TILE[1], pow2(max(1, hint(r)))))
            elif not self._persistent(lp.inner):
                width = str(CHUNK)
            else:
                width = str(pow2(max(1, r)))
            self.blocks[self._block(lp.inner)] = width
            widths.append(int(width))
        if self.plan.form == Form.COLUMNS:
            x = COLUMN_TILE[0]
        else:
            x = max(1, TILE // max(widths, default=1))
        x = min(x, pow2(max(1, hint(prod(k.outer)))))
        self.blocks = {"XBLOCK": str(x), **self.blocks}

    def _block(self, inner: tuple) -> str:
        """The tile-width parameter of loops over `inner` (one per distinct inner range)."""
        ranges = list(dict.fromkeys(lp.inner for lp in self.k.loops if lp.inner))
        return f"R{ranges.index(inner)}BLOCK"

    def _inner_index(self, j: int, inner: tuple, rindex: str) -> None:
        out = self.out
        out.add(f"rindex{j} = {rindex}")
        out.add(f"rmask{j} = xmask & (rindex{j} < {index(prod(inner))})")
        for var, text in _unflatten(f"rindex{j}", ir.loop_vars(len(inner), "r"), inner):
            out.add(f"{var} = {text}")

    def _looped(self, j: int, lp, block: str, values: dict[str, str]) -> None:
        out = self.out
        reds = [n for n in lp.nodes if isinstance(n, ir.Reduction)]
        for r in reds:
            t = acc_type(r)
            init = const(identity(r.reduction_type, t), t)
            out.add(f"acc_{r.name} = tl.full([XBLOCK, {block}], 0, {TL[t]}) + {init}")
        if any(self._stored_earlier(ld.buffer, j) for n in lp.nodes for ld in ir.loads(n.body)):
            out.add("tl.debug_barrier()")  # another thread may have stored that row
        out.add(f"for roffset{j} in range(0, {index(prod(lp.inner))}, {block}):")
        out.depth += 1
        self._inner_index(j, lp.inner, f"roffset{j} + tl.arange(0, {block})[None, :]")
        inside = dict(values)
        body = _Body(out, inside, f"rmask{j}")
        for node in lp.nodes:
            v = body.value(node.body)
            if isinstance(node, ir.Pointwise):
                self._store(node, v, f"rmask{j}")
                inside[node.name] = v
            else:
                t = acc_type(node)
                init = const(identity(node.reduction_type, t), t)
                step = f"tl.where(rmask{j}, {_as(v, node.body.dtype, t)}, {init})"
                combine = _COMBINE[node.reduction_type]
                out.add(f"acc_{node.name} = {combine}(acc_{node.name}, {step})")
        out.depth -= 1
        for r in reds:
            values[r.name] = out.assign(
                _reduce_rows(f"acc_{r.name}", r.reduction_type, acc_type(r))
            )
            self._store_reduction(r, values[r.name])

    def _stored_earlier(self, buf: str, j: int) -> bool:
        return any(n.name == buf for lp in self.k.loops[:j] for n in lp.nodes)

    def _statements(self, nodes, body: _Body, values: dict[str, str]) -> None:
        for node in nodes:
            v = body.value(node.body)
            if isinstance(node, ir.Pointwise):
                self._store(node, v, body.mask)
                values[node.name] = v
                continue
            t = acc_type(node)
            init = const(identity(node.reduction_type, t), t)
            tile = f"tl.where({body.mask}, {_as(v, node.body.dtype, t)}, {init})"
            values[node.name] = self.out.assign(_reduce_rows(tile, node.reduction_type, t))
            self._store_reduction(node, values[node.name])

    def _store(self, node: ir.Pointwise, v: str, mask: str) -> None:
        if node.name not in self.k.local:
            where = f"{node.name} + {self.out.offset(node.index)}"
            self.out.add(f"tl.store({where}, {_stored(v, node.dtype)}, {mask})")

    def _store_reduction(self, r: ir.Reduction, v: str) -> None:
        if r.name not in self.k.local:
            where = f"{r.name} + {self.out.offset(r.index)}"
            self.out.add(f"tl.store({where}, {_stored(v, r.dtype)}, xmask)")


def _reduce_rows(tile: str, kind: ReductionType, dtype: DType) -> str:
    """A [XBLOCK, RBLOCK] tile reduced over its rows to a [XBLOCK, 1] column, with the
    combine functions of Triton's own sum/max/min (which its interpreter runs on whole
    arrays; any other combine function it calls once per element). Triton's standard
    library (tl.sum, tl.max) is not called: under the interpreter it is compiled code."""
    if kind == ReductionType.SUM:
        return f"tl.reduce({tile}, 1, tl.standard._sum_combine)[:, None]"
    if kind == ReductionType.PROD:
        return f"tl.reduce({tile}, 1, _mul)[:, None]"
    op = "max" if kind == ReductionType.MAX else "min"
    if dtype.is_float:
        return f"_{op}_rows({tile})"
    combine = f"tl.standard._elementwise_{op}"
    if dtype == DType.BOOL:
        return f"tl.reduce({tile}.to(tl.int8), 1, {combine})[:, None].to(tl.int1)"
    return f"tl.reduce({tile}, 1, {combine})[:, None]"


def _as(v: str, src: DType, dst: DType) -> str:
    return v if src == dst or (src.is_half and dst == DType.F32) else f"{v}.to({TL[dst]})"


def _stored(v: str, d: DType) -> str:
    if d == DType.BF16:
        return f"_to_bf16({v})"
    return f"{v}.to(tl.float16)" if d == DType.F16 else f"{v}.to({TL[d]})"


def _unflatten(flat: str, names, ranges) -> list[tuple[str, str]]:
    """Per-variable indices of a row-major flat index over `ranges`."""
    out = []
    n = len(ranges)
    for i, var in enumerate(names):
        inner = prod(ranges[i + 1 :])
        text = flat if i == n - 1 else f"({flat} // {index(inner)})"
        if i > 0:
            text = f"({text} % {index(ranges[i])})"
        out.append((var.name, text))
    return out


def kernel_source(k: Kernel, buffers: dict[str, ir.Buffer]) -> tuple[str, list[str], str]:
    """(Triton text of the kernel, its parameters in order, the wrapper's launch suffix)."""
    w = KernelWriter(plan_kernel(k, buffers), buffers)
    return w.source(), w.plan.params, w.launch()
