"""The loop-level IR: buffers, value expressions, and the nodes that compute buffers.

Lowering produces a `LoopGraph`; the scheduler groups its nodes into kernels and codegen prints
them. Everything here is immutable data: a value is an expression tree (`Expr`) evaluated at
one point of a node's iteration space, and indices are sympy expressions over the loop
variables `x0, x1, ...` (the node's ranges) and `r0, r1, ...` (its reduction ranges).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import sympy
import torch


class DType(enum.Enum):
    """Element types that kernels handle natively; other dtypes go to fallback kernels."""

    F32 = "float32"
    F64 = "float64"
    BF16 = "bfloat16"
    F16 = "float16"
    I64 = "int64"
    I32 = "int32"
    I8 = "int8"
    U8 = "uint8"
    BOOL = "bool"

    @property
    def torch(self) -> torch.dtype:
        return getattr(torch, self.value)

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F64, DType.BF16, DType.F16)

    @property
    def is_half(self) -> bool:
        """A 16-bit float: stored in 16 bits, computed in float32 (as eager's kernels do),
        rounded wherever eager would store it."""
        return self in (DType.BF16, DType.F16)

    @property
    def computed_as(self) -> DType:
        """The type arithmetic on this type happens in (float32 for the 16-bit floats)."""
        return DType.F32 if self.is_half else self

    @property
    def itemsize(self) -> int:
        return self.torch.itemsize

    @staticmethod
    def of(dtype: torch.dtype) -> DType | None:
        """The IR dtype of a torch dtype, or None when kernels cannot hold it."""
        return _FROM_TORCH.get(dtype)


_FROM_TORCH = {d.torch: d for d in DType}


class UnaryOp(enum.Enum):
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXP_SHIFTED = "exp_shifted"
    """exp of a value that is <= 0 or NaN (softmax's x - rowmax): no overflow path."""
    EXP_SHIFTED_SUMMAND = "exp_shifted_summand"
    """EXP_SHIFTED whose results only enter a sum that is >= 1 (log-softmax's denominator
    holds exp(0) = 1): a result under float's normal range cannot change that sum, so it
    may be 0 (one multiply fewer than keeping it subnormal)."""
    EXPM1 = "expm1"
    LOG = "log"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    RECIPROCAL = "reciprocal"
    RELU = "relu"
    FLOOR = "floor"
    CEIL = "ceil"
    TRUNC = "trunc"
    ROUND = "round"
    SIGN = "sign"
    ISNAN = "isnan"
    ISINF = "isinf"
    LOGICAL_NOT = "logical_not"
    BITWISE_NOT = "bitwise_not"


class BinaryOp(enum.Enum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    POW = "pow"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_XOR = "logical_xor"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    ATAN2 = "atan2"
    ERFC_GIVEN_EXP = "erfc_given_exp"
    """erfc(a) where b is exp(-a*a) (GELU's 1 + erf(x / sqrt 2) is erfc(-x / sqrt 2),
    without the cancellation near -1): float32 erfc evaluates that exp anyway, and GELU's
    derivative needs the same value (its density), so the two share one exp."""


TRANSCENDENTAL = frozenset(
    {
        UnaryOp.EXP,
        UnaryOp.EXP_SHIFTED,
        UnaryOp.EXP_SHIFTED_SUMMAND,
        UnaryOp.LOG,
        UnaryOp.TANH,
        UnaryOp.ERF,
        UnaryOp.SIGMOID,
        UnaryOp.EXPM1,
        UnaryOp.LOG1P,
        UnaryOp.SIN,
        UnaryOp.COS,
    }
)
"""Unary ops costing tens of instructions per element: worth storing rather than recomputing."""


def any_transcendental(exprs) -> bool:
    """Whether any of `exprs` (e.g. `walk(e)`) is a TRANSCENDENTAL unary op."""
    return any(isinstance(e, Unary) and e.op in TRANSCENDENTAL for e in exprs)


COMPARISONS = frozenset(
    {BinaryOp.EQ, BinaryOp.NE, BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE}
)
LOGICAL = frozenset({BinaryOp.LOGICAL_AND, BinaryOp.LOGICAL_OR, BinaryOp.LOGICAL_XOR})


class ReductionType(enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"


class ExternKind(enum.Enum):
    """Why a node calls torch instead of generated code."""

    LIBRARY = "library"  # matmul/conv: a tuned library beats generated loops
    FALLBACK = "fallback"  # no lowering (yet): correct via the aten op itself


# ---------------------------------------------------------------- value expressions


Size = int | sympy.Expr
"""A size, stride or offset: an int, or an expression of the graph's size symbols."""


@dataclasses.dataclass(frozen=True, slots=True)
class Mask:
    """lo <= value < hi, for an index expression `value`: where a masked load reads."""

    value: sympy.Expr
    lo: Size
    hi: Size


@dataclasses.dataclass(frozen=True, slots=True)
class Load:
    """The element of `buffer` at flat element offset `index` (a sympy expression). With a
    `mask`, memory is read only where it holds and the load is 0 elsewhere, so `index` may
    point outside the buffer there (a piece of a concatenation, read for the whole output
    and selected by a `Where` on the same condition)."""

    buffer: str
    index: sympy.Expr
    dtype: DType
    mask: tuple[Mask, ...] = ()  # all must hold


def reindex(ld: Load, fix) -> Load:
    """`ld` with `fix` applied to its index and its masks' indices."""
    mask = tuple(Mask(fix(m.value), m.lo, m.hi) for m in ld.mask)
    return Load(ld.buffer, fix(ld.index), ld.dtype, mask)


@dataclasses.dataclass(frozen=True, slots=True)
class Const:
    value: Any
    dtype: DType


@dataclasses.dataclass(frozen=True, slots=True)
class IndexValue:
    """An index expression used as a value (iota, masks built from positions)."""

    index: sympy.Expr
    dtype: DType


@dataclasses.dataclass(frozen=True, slots=True)
class Unary:
    op: UnaryOp
    x: Expr
    dtype: DType


@dataclasses.dataclass(frozen=True, slots=True)
class Binary:
    """Operands share one compute dtype; comparisons produce BOOL."""

    op: BinaryOp
    a: Expr
    b: Expr
    dtype: DType


@dataclasses.dataclass(frozen=True, slots=True)
class Where:
    cond: Expr
    a: Expr
    b: Expr
    dtype: DType


@dataclasses.dataclass(frozen=True, slots=True)
class Cast:
    """Convert to `dtype` (a cast to a 16-bit float rounds, as storing it would)."""

    x: Expr
    dtype: DType


Expr = Load | Const | IndexValue | Unary | Binary | Where | Cast


def walk(expr: Expr):
    """All sub-expressions, parents before children."""
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        if isinstance(e, Unary | Cast):
            stack.append(e.x)
        elif isinstance(e, Binary):
            stack.extend((e.b, e.a))
        elif isinstance(e, Where):
            stack.extend((e.b, e.a, e.cond))


def loads(expr: Expr) -> list[Load]:
    return [e for e in walk(expr) if isinstance(e, Load)]


# ---------------------------------------------------------------- buffers and nodes


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """A strided view of a buffer's storage, in elements."""

    size: tuple[Size, ...]
    stride: tuple[Size, ...]
    offset: Size = 0

    @staticmethod
    def contiguous(size: tuple[Size, ...]) -> Layout:
        return Layout(tuple(size), contiguous_strides(size), 0)

    def numel(self) -> Size:
        n = 1
        for s in self.size:
            n *= s
        return n

    def storage_numel(self) -> Size:
        """Elements the storage needs so that every element of the view is in bounds."""
        if any(s == 0 for s in self.size):
            return 0
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride))


def contiguous_strides(size: tuple[Size, ...]) -> tuple[Size, ...]:
    strides: list[Size] = []
    acc: Size = 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1) if isinstance(s, int) else s  # a size symbol is positive
    return tuple(reversed(strides))


@dataclasses.dataclass(frozen=True, slots=True)
class Buffer:
    """Storage the wrapper allocates (or receives, for inputs): a layout and a dtype."""

    name: str
    layout: Layout
    dtype: DType


@dataclasses.dataclass(frozen=True, slots=True)
class Pointwise:
    """For every point of `ranges` (vars x0..), store `body` at `index` of buffer `name`."""

    name: str
    ranges: tuple[Size, ...]
    body: Expr
    index: sympy.Expr
    dtype: DType


@dataclasses.dataclass(frozen=True, slots=True)
class Reduction:
    """For every point of `ranges`, reduce `body` over `reduction_ranges` (vars r0..)."""

    name: str
    ranges: tuple[Size, ...]
    reduction_ranges: tuple[Size, ...]
    reduction_type: ReductionType
    body: Expr
    index: sympy.Expr
    dtype: DType


@dataclasses.dataclass(frozen=True, slots=True)
class TensorArg:
    """A tensor argument of an extern call: a view of a buffer."""

    buffer: str
    layout: Layout


@dataclasses.dataclass(frozen=True, slots=True)
class ExternCall:
    """Call a torch op; its tensor results become `outputs` (torch allocates them)."""

    kind: ExternKind
    op: Any  # torch_compat.OpOverload
    args: tuple[Any, ...]  # TensorArg | constants | nested tuples
    kwargs: tuple[tuple[str, Any], ...]
    outputs: tuple[str, ...]
    result_path: tuple[tuple[int, ...], ...]  # where each output sits in the op's result


Node = Pointwise | Reduction | ExternCall


@dataclasses.dataclass(frozen=True, slots=True)
class Output:
    """A graph output: a view of a buffer (an input buffer only where eager aliases)."""

    buffer: str
    layout: Layout


@dataclasses.dataclass(frozen=True, slots=True)
class LoopGraph:
    """`inputs` are the graph's tensor arguments, then its tensor constants; `constants` maps
    the latter's buffer names to the fx attribute holding them (bound when the wrapper
    loads). With symbolic sizes, `params` lists the wrapper's parameters in the graph's
    order (tensor inputs and int inputs; empty: the tensor inputs), `symbols` where the
    wrapper reads each size symbol, and an output may be a size (a forward graph hands its
    backward the sizes it needs)."""

    inputs: tuple[Buffer, ...]
    buffers: tuple[Buffer, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Output | Size | None, ...]
    constants: tuple[tuple[str, str], ...] = ()
    params: tuple[str, ...] = ()
    symbols: tuple[tuple[sympy.Symbol, str], ...] = ()

    def buffer_outputs(self) -> list[Output]:
        return [o for o in self.outputs if isinstance(o, Output)]

    def buffer_map(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.inputs + self.buffers}


def node_outputs(node: Node) -> tuple[str, ...]:
    return node.outputs if isinstance(node, ExternCall) else (node.name,)


def node_reads(node: Node) -> set[str]:
    if isinstance(node, ExternCall):
        return set(_tensor_args(node.args) + _tensor_args(tuple(v for _, v in node.kwargs)))
    return {ld.buffer for ld in loads(node.body)}


def _tensor_args(args: tuple[Any, ...]) -> list[str]:
    out = []
    for a in args:
        if isinstance(a, TensorArg):
            out.append(a.buffer)
        elif isinstance(a, tuple | list):
            out.extend(_tensor_args(tuple(a)))
    return out


def loop_vars(n: int, prefix: str = "x") -> list[sympy.Symbol]:
    return [sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True) for i in range(n)]


def map_loads(expr: Expr, fn, index_fn=None) -> Expr:
    """Rebuild `expr` with every Load replaced by `fn(load)` (and IndexValue indices mapped
    by `index_fn`, when given)."""
    memo: dict[int, Expr] = {}

    def go(e: Expr) -> Expr:
        key = id(e)
        if key in memo:
            return memo[key]
        if isinstance(e, Load):
            r = fn(e)
        elif isinstance(e, Unary):
            r = Unary(e.op, go(e.x), e.dtype)
        elif isinstance(e, Cast):
            r = Cast(go(e.x), e.dtype)
        elif isinstance(e, Binary):
            r = Binary(e.op, go(e.a), go(e.b), e.dtype)
        elif isinstance(e, Where):
            r = Where(go(e.cond), go(e.a), go(e.b), e.dtype)
        elif isinstance(e, IndexValue) and index_fn is not None:
            r = IndexValue(index_fn(e.index), e.dtype)
        else:
            r = e
        memo[key] = r
        return r

    return go(expr)
