"""C++ source for scheduled kernels: OpenMP over the outer space, SIMD inner loops.

One `extern "C"` function per kernel, taking one pointer per buffer it reads or writes.
Reductions accumulate in 16 lanes (a vector register) per inner loop and combine at the end,
so max/min keep eager's NaN propagation without relying on OpenMP's reduction clauses.
"""

from __future__ import annotations

import math

import sympy

from ember.backend import indexing
from ember.backend.codegen.plan import INFIX, R0, Form, Segment, acc_type, plan_kernel, split_vars
from ember.backend.codegen.plan import prod as _prod
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, ReductionType
from ember.backend.ir.nodes import UnaryOp as U
from ember.backend.scheduler.fusion import Kernel, Loop
from ember.backend.sizes import hint

LANES = 16
PARALLEL_MIN_WORK = 32768  # elements per kernel below which threads cost more than they save

VALUE_T = {
    DType.F32: "float",
    DType.F64: "double",
    DType.BF16: "float",
    DType.F16: "float",
    DType.I64: "int64_t",
    DType.I32: "int32_t",
    DType.I8: "int8_t",
    DType.U8: "uint8_t",
    DType.BOOL: "bool",
}
STORAGE_T = {**VALUE_T, DType.BF16: "ember_bf16", DType.F16: "ember_f16"}

_SUFFIX = {DType.BF16: "bf16", DType.F16: "f16"}  # the prelude's conversion functions

_FLOAT_FN = {  # op -> (float spelling, double spelling)
    U.EXP: ("ember_expf({})", "__builtin_exp({})"),
    U.EXP_SHIFTED: ("ember_expf_shifted({})", "__builtin_exp({})"),
    U.EXP_SHIFTED_SUMMAND: ("ember_expf_flush({})", "__builtin_exp({})"),
    U.LOG: ("ember_logf({})", "__builtin_log({})"),
    U.TANH: ("ember_tanhf({})", "__builtin_tanh({})"),
    U.ERF: ("ember_erff({})", "__builtin_erf({})"),
    U.SIGMOID: ("ember_sigmoidf({})", "(1.0 / (1.0 + __builtin_exp(-{})))"),
    U.SQRT: ("__builtin_sqrtf({})", "__builtin_sqrt({})"),
    U.RSQRT: ("(1.0f / __builtin_sqrtf({}))", "(1.0 / __builtin_sqrt({}))"),
    U.EXPM1: ("__builtin_expm1f({})", "__builtin_expm1({})"),
    U.LOG1P: ("__builtin_log1pf({})", "__builtin_log1p({})"),
    U.SIN: ("__builtin_sinf({})", "__builtin_sin({})"),
    U.COS: ("__builtin_cosf({})", "__builtin_cos({})"),
    U.FLOOR: ("__builtin_floorf({})", "__builtin_floor({})"),
    U.CEIL: ("__builtin_ceilf({})", "__builtin_ceil({})"),
    U.TRUNC: ("__builtin_truncf({})", "__builtin_trunc({})"),
    U.ROUND: ("__builtin_rintf({})", "__builtin_rint({})"),
    U.ABS: ("__builtin_fabsf({})", "__builtin_fabs({})"),
    U.ISINF: ("(__builtin_fabsf({}) == INFINITY)", "(__builtin_fabs({}) == INFINITY)"),
}
_INFIX = {
    **INFIX,
    B.DIV: "/",
    B.LOGICAL_AND: "&&",
    B.LOGICAL_OR: "||",
    B.LOGICAL_XOR: "!=",
}


def const_c(value, dtype: DType) -> str:
    if dtype.is_float:
        t = VALUE_T[dtype]
        v = float(value)
        if math.isnan(v):
            return f"(({t})NAN)"
        if math.isinf(v):
            return f"(({t}){'-' if v < 0 else ''}INFINITY)"
        return f"(({t}){v.hex()})"
    if dtype == DType.BOOL:
        return "true" if value else "false"
    return f"(({VALUE_T[dtype]}){int(value)}LL)"


def _unary(op: U, x: str, d: DType, src: DType) -> str:
    if op in _FLOAT_FN and src.is_float:
        return _FLOAT_FN[op][1 if src == DType.F64 else 0].format(x)
    t = VALUE_T[d]
    simple = {
        U.NEG: f"(-{x})",
        U.RECIPROCAL: f"(({t})1 / {x})",
        U.RELU: f"({x} < 0 ? ({t})0 : {x})",
        U.ISNAN: f"({x} != {x})",
        U.LOGICAL_NOT: f"(!{x})",
        U.BITWISE_NOT: f"(!{x})" if d == DType.BOOL else f"(~{x})",
        U.SIGN: f"({x} != {x} ? {x} : ({t})(({x} > 0) - ({x} < 0)))",
        U.ABS: f"({x} < 0 ? -{x} : {x})",
        U.ISINF: "false",
    }
    if op in simple:
        return simple[op]
    if op in (U.FLOOR, U.CEIL, U.TRUNC, U.ROUND):
        return x  # integers are already integral
    raise NotImplementedError(f"{op} on {src}")


def _binary(op: B, a: str, b: str, src: DType) -> str:
    if op in _INFIX:
        return f"({a} {_INFIX[op]} {b})"
    if op == B.MAXIMUM:
        return f"ember_max({a}, {b})"
    if op == B.MINIMUM:
        return f"ember_min({a}, {b})"
    if op == B.POW:
        return f"__builtin_powf({a}, {b})" if src != DType.F64 else f"__builtin_pow({a}, {b})"
    if op == B.ERFC_GIVEN_EXP:
        return f"ember_erfcf_given_exp({a}, {b})" if src != DType.F64 else f"__builtin_erfc({a})"
    if op == B.ATAN2:
        return f"__builtin_atan2f({a}, {b})" if src != DType.F64 else f"__builtin_atan2({a}, {b})"
    raise NotImplementedError(str(op))


def _cast(x: str, src: DType, dst: DType) -> str:
    if dst.is_half:
        return f"ember_round_{_SUFFIX[dst]}((float)({x}))"
    if dst == DType.BOOL:
        return f"({x} != 0)"
    return f"(({VALUE_T[dst]})({x}))"


class BodyPrinter:
    """Prints expressions as C statements with common subexpressions computed once."""

    def __init__(self, lines: list[str], indent: str, scalars: dict[str, str]) -> None:
        self.lines = lines
        self.indent = indent
        self.scalars = scalars  # buffer -> C variable holding its value at this point
        self.memo: dict[ir.Expr, str] = {}
        self.count = 0

    def value(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Const):
            return const_c(e.value, e.dtype)
        if isinstance(e, ir.Load) and e.buffer in self.scalars:
            return self.scalars[e.buffer]
        hit = self.memo.get(e)
        if hit is not None:
            return hit
        text = self._text(e)
        name = f"t{self.count}"
        self.count += 1
        self.lines.append(f"{self.indent}const {VALUE_T[e.dtype]} {name} = {text};")
        self.memo[e] = name
        return name

    def _text(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Load):
            ref = f"{e.buffer}[{indexing.to_c(e.index)}]"
            ref = f"ember_{_SUFFIX[e.dtype]}_to_f32({ref})" if e.dtype.is_half else ref
            if not e.mask:
                return ref
            inside = " && ".join(
                f"{c_size(m.lo)} <= {v} && {v} < {c_size(m.hi)}"
                for m in e.mask
                for v in [indexing.to_c(m.value)]
            )
            return f"(({inside}) ? {ref} : {const_c(0, e.dtype)})"
        if isinstance(e, ir.IndexValue):
            return f"(({VALUE_T[e.dtype]}){indexing.to_c(e.index)})"
        if isinstance(e, ir.Unary):
            return _unary(e.op, self.value(e.x), e.dtype, e.x.dtype)
        if isinstance(e, ir.Binary):
            return _binary(e.op, self.value(e.a), self.value(e.b), e.a.dtype)
        if isinstance(e, ir.Where):
            return f"({self.value(e.cond)} ? {self.value(e.a)} : {self.value(e.b)})"
        if isinstance(e, ir.Cast):
            return _cast(self.value(e.x), e.x.dtype, e.dtype)
        raise TypeError(f"not an expression: {e!r}")


def store_c(buf: str, index, value: str, dtype: DType) -> str:
    v = f"ember_f32_to_{_SUFFIX[dtype]}({value})" if dtype.is_half else value
    return f"{buf}[{indexing.to_c(index)}] = {v};"


_INIT = {
    ReductionType.SUM: lambda d: const_c(0, d),
    ReductionType.PROD: lambda d: const_c(1, d),
    ReductionType.MAX: lambda d: const_c(-math.inf, d) if d.is_float else _limit(d, "min"),
    ReductionType.MIN: lambda d: const_c(math.inf, d) if d.is_float else _limit(d, "max"),
}
_COMBINE = {
    ReductionType.SUM: "({a} + {b})",
    ReductionType.PROD: "({a} * {b})",
    ReductionType.MAX: "ember_max({a}, {b})",
    ReductionType.MIN: "ember_min({a}, {b})",
}
# inner-loop steps of float max/min: a plain compare (one vmaxps); NaN is tracked apart
_FAST_STEP = {
    ReductionType.MAX: "({b} > {a} ? {b} : {a})",
    ReductionType.MIN: "({b} < {a} ? {b} : {a})",
}


def _nan_tracked(r: ir.Reduction) -> bool:
    return r.reduction_type in _FAST_STEP and acc_type(r).is_float


_INT_LIMITS = {
    DType.I64: ("INT64_MIN", "INT64_MAX"),
    DType.I32: ("INT32_MIN", "INT32_MAX"),
    DType.I8: ("INT8_MIN", "INT8_MAX"),
    DType.U8: ("0", "UINT8_MAX"),
    DType.BOOL: ("false", "true"),
}


def _limit(d: DType, which: str) -> str:
    return _INT_LIMITS[d][0 if which == "min" else 1]


class KernelWriter:
    """Writes one kernel function; `scalars` maps buffers to in-register values in scope."""

    def __init__(
        self, k: Kernel, buffers: dict[str, ir.Buffer], in_place: frozenset[str] = frozenset()
    ) -> None:
        self.k = k
        self.plan = plan_kernel(k, buffers)
        self.buffers = buffers
        self.in_place = in_place
        self.lines: list[str] = []
        self.prefetch: list[tuple[str, sympy.Expr]] = []  # see plan.next_rows

    def params(self) -> list[str]:
        """Buffers passed as pointers, in signature order (reads, then writes), then the
        size symbols the kernel's bounds and indices use (int64_t)."""
        return self.plan.params

    def source(self) -> str:
        k = self.k
        params = self.params()
        written = {n.name for n in k.nodes()}
        sig = []
        for b in params:
            if b not in self.buffers:
                sig.append(f"const int64_t {b}")  # a size symbol
                continue
            t = STORAGE_T[self.buffers[b].dtype]
            restrict = "" if b in self.in_place else " __restrict__"
            sig.append(f"{'' if b in written else 'const '}{t}*{restrict} {b}")
        self.lines.append(f'extern "C" void {k.name}({", ".join(sig)}) {{')
        inner = max([_prod(lp.inner) for lp in k.loops] + [1], key=hint)
        self.work = sympy.sympify(_prod(k.outer) * inner)
        if self.plan.form == Form.COLUMNS:
            self._columns()
            return "\n".join(self.lines)
        n = len(k.outer)
        pure = self.plan.form == Form.POINTWISE
        ind = "  "
        plan = self.plan.segments
        if plan:
            self._segmented(plan)
            return "\n".join(self.lines)
        if pure and n >= 1:
            if n == 1:
                self._parallel_for(ind, "schedule(static)", simd=True)
            else:
                self._parallel_for(ind, f"collapse({n - 1})")
            for i, s in enumerate(k.outer):
                if i == n - 1 and n > 1:
                    self.lines.append(f"{ind}#pragma omp simd")
                self.lines.append(f"{ind}for (int64_t x{i} = 0; x{i} < {c_size(s)}; ++x{i}) {{")
                ind += "  "
        else:
            if n:
                self._parallel_for(ind, f"collapse({n})")
            for i, s in enumerate(k.outer):
                self.lines.append(f"{ind}for (int64_t x{i} = 0; x{i} < {c_size(s)}; ++x{i}) {{")
                ind += "  "
        scalars: dict[str, str] = {}
        self.stash, self.preset, arrays = _shared_across_loops(k)
        self.prefetch = list(self.plan.prefetch)
        for dtype, name, size in arrays:
            self.lines.append(f"{ind}{VALUE_T[dtype]} {name}[{size}];")
        for j, lp in enumerate(k.loops):
            self.loop_index = j
            self._loop(lp, ind, scalars)
        for _ in range(n + 1):
            ind = ind[:-2]
            self.lines.append(f"{ind}}}")
        return "\n".join(self.lines)

    def _parallel_for(self, ind: str, clauses: str = "", simd: bool = False) -> None:
        """Open an OpenMP parallel loop that runs threaded only when the kernel's work
        reaches PARALLEL_MIN_WORK elements. Work known at compile time to be smaller gets a
        plain (simd) loop instead: a parallel region under a false `if` still runs as gcc's
        outlined function, which vectorizes worse (resnet's 3x3 max pool with indices on
        2x16x16x16: 24 us with the region, 16 us without)."""
        work = self.work
        if work.is_Integer and int(work) < PARALLEL_MIN_WORK:
            if simd:
                self.lines.append(f"{ind}#pragma omp simd")
            return
        cond = "" if work.is_Integer else f"if({c_size(work)} >= {PARALLEL_MIN_WORK})"
        words = ["parallel for", "simd" if simd else "", clauses, cond]
        self.lines.append(f"{ind}#pragma omp {' '.join(w for w in words if w)}")

    def _segmented(self, plan: tuple[Segment, ...]) -> None:
        """A pure pointwise kernel whose innermost loop is cut into parts (see plan.segments):
        each part reads only the pieces its range covers, without masks, and a part whose
        loads divide the innermost variable by `d` runs as an outer loop over blocks of `d`
        around an inner loop that the loads walk contiguously; so every part vectorizes."""
        k, n = self.k, len(self.k.outer)
        ind = "  "
        if n > 1:
            self._parallel_for(ind, f"collapse({n - 1})")
        for i, s in enumerate(k.outer[:-1]):
            self.lines.append(f"{ind}for (int64_t x{i} = 0; x{i} < {c_size(s)}; ++x{i}) {{")
            ind += "  "
        self.stash, self.preset = {}, {}
        var = ir.loop_vars(n)[-1]
        alone = n == 1  # no outer loop: the parts themselves run in parallel
        for part in plan:
            inner = ind
            if part.block > 1:
                block, lane = split_vars(var)
                if alone:
                    self._parallel_for(ind)
                n_blocks = (part.hi - part.lo) // part.block
                self.lines.append(
                    f"{ind}for (int64_t {block} = 0; {block} < {n_blocks}; ++{block}) {{"
                )
                self.lines.append(f"{ind}  #pragma omp simd")
                self.lines.append(
                    f"{ind}  for (int64_t {lane} = 0; {lane} < {part.block}; ++{lane}) {{"
                )
                inner = ind + "  "
            else:
                if alone:
                    self._parallel_for(ind, simd=True)
                else:
                    self.lines.append(f"{ind}#pragma omp simd")
                self.lines.append(
                    f"{ind}for (int64_t {var} = {part.lo}; {var} < {part.hi}; ++{var}) {{"
                )
            for j, lp in enumerate(k.loops):
                self.loop_index = j
                names = {m.name for m in lp.nodes}
                nodes = tuple(nd for nd in part.nodes if nd.name in names)
                self._loop(Loop(lp.inner, nodes), inner + "  ", {})
            if part.block > 1:
                self.lines.append(f"{inner}}}")
            self.lines.append(f"{ind}}}")
        for _ in range(n - 1):
            ind = ind[:-2]
            self.lines.append(f"{ind}}}")
        self.lines.append("}")

    def _columns(self) -> None:
        """Reductions down columns: rows outer, a block of COLUMNS adjacent outputs inner, so
        memory is read in row order instead of one strided column at a time. Blocks of
        COLUMNS rows are reduced first and then combined (a two-level cascade, for accuracy)."""
        (size,), lp = self.k.outer, self.k.loops[0]
        self.stash, self.preset, self.loop_index = {}, {}, 0
        w, rows, size = COLUMNS, c_size(lp.inner[0]), c_size(size)
        self._parallel_for("  ")
        out: list[str] = []
        out.append(f"  for (int64_t xb = 0; xb < {size}; xb += {w}) {{")
        out.append(f"    const int64_t xn = {size} - xb < {w} ? {size} - xb : {w};")
        for r in lp.nodes:
            t, init = VALUE_T[acc_type(r)], _INIT[r.reduction_type](acc_type(r))
            out.append(f"    {t} tot_{r.name}[{w}], acc_{r.name}[{w}];")
            out.append(f"    for (int64_t l = 0; l < {w}; ++l) tot_{r.name}[l] = {init};")
        out.append(f"    for (int64_t rb = 0; rb < {rows}; rb += {w}) {{")
        out.append(f"      const int64_t re = {rows} - rb < {w} ? {rows} : rb + {w};")
        for r in lp.nodes:
            init = _INIT[r.reduction_type](acc_type(r))
            out.append(f"      for (int64_t l = 0; l < {w}; ++l) acc_{r.name}[l] = {init};")
        out.append("      for (int64_t r0 = rb; r0 < re; ++r0) {")
        out.append("        #pragma omp simd")
        out.append("        for (int64_t l = 0; l < xn; ++l) {")
        out.append("          const int64_t x0 = xb + l;")
        self.lines += out
        self._statements(lp.nodes, "          ", {}, "l")
        self.lines += ["        }", "      }"]
        for r in lp.nodes:
            comb = _COMBINE[r.reduction_type].format(a=f"tot_{r.name}[l]", b=f"acc_{r.name}[l]")
            self.lines.append(f"      for (int64_t l = 0; l < xn; ++l) tot_{r.name}[l] = {comb};")
        self.lines += ["    }", "    for (int64_t l = 0; l < xn; ++l) {"]
        self.lines.append("      const int64_t x0 = xb + l;")
        for r in lp.nodes:
            if r.name in self.k.local:
                continue
            v = f"tot_{r.name}[l]"
            if r.dtype != acc_type(r):
                v = _cast(v, acc_type(r), r.dtype)
            self.lines.append("      " + store_c(r.name, r.index, v, r.dtype))
        scalars = {r.name: f"tot_{r.name}[l]" for r in lp.nodes}
        for j, later in enumerate(self.k.loops[1:], start=1):
            self.loop_index = j
            self._statements(later.nodes, "      ", scalars, None)
        self.lines += ["    }", "  }", "}"]

    def _statements(
        self,
        nodes,
        ind: str,
        scalars: dict[str, str],
        lane: str | None,
        fast: bool = False,
        kept: frozenset[str] = frozenset(),
    ) -> None:
        """Pointwise stores and reduction accumulations of one element (`fast`: float max/min
        step with a plain compare, NaN recorded in the lane's nan_ flag; `kept`: pointwise
        values later loops read, assigned to their pw_ variables)."""
        pr = BodyPrinter(self.lines, ind, dict(scalars))
        j = self.loop_index
        pr.memo.update(self.preset.get(j, {}))
        for node in nodes:
            v = pr.value(node.body)
            if isinstance(node, ir.Pointwise):
                if node.name not in self.k.local:
                    self.lines.append(ind + store_c(node.name, node.index, v, node.dtype))
                if node.name in kept:
                    self.lines.append(f"{ind}pw_{node.name} = {v};")
                pr.scalars[node.name] = v
            else:
                acc = f"acc_{node.name}[{lane}]" if lane else f"red_{node.name}"
                if fast and _nan_tracked(node):
                    step = _FAST_STEP[node.reduction_type].format(a=acc, b=v)
                    self.lines.append(f"{ind}{acc} = {step};")
                    self.lines.append(f"{ind}nan_{node.name}[l] |= ({v} != {v});")
                    continue
                comb = _COMBINE[node.reduction_type].format(a=acc, b=v)
                self.lines.append(f"{ind}{acc} = {comb};")
        for e, ref in self.stash.get(j, []):
            # usually computed above already (memoized); else e.g. hidden behind a value this
            # loop took from a scalar, and computed here
            self.lines.append(f"{ind}{ref} = {pr.value(e)};")

    def _loop(self, lp: Loop, ind: str, scalars: dict[str, str]) -> None:
        reds = [n for n in lp.nodes if isinstance(n, ir.Reduction)]
        if not lp.inner:
            for r in reds:
                t = VALUE_T[acc_type(r)]
                self.lines.append(
                    f"{ind}{t} red_{r.name} = {_INIT[r.reduction_type](acc_type(r))};"
                )
            kept = self._kept_for_later_loops(lp)
            for n in lp.nodes:
                if n.name in kept:
                    self.lines.append(f"{ind}{VALUE_T[n.dtype]} pw_{n.name};")
            self.lines.append(f"{ind}{{")
            self._statements(lp.nodes, ind + "  ", scalars, None, kept=kept)
            self.lines.append(f"{ind}}}")
            scalars.update((name, f"pw_{name}") for name in kept)
        else:
            for r in reds:
                t, init = VALUE_T[acc_type(r)], _INIT[r.reduction_type](acc_type(r))
                self.lines.append(f"{ind}{t} acc_{r.name}[{LANES}];")
                self.lines.append(
                    f"{ind}for (int l = 0; l < {LANES}; ++l) acc_{r.name}[l] = {init};"
                )
                if _nan_tracked(r):
                    self.lines.append(f"{ind}int32_t nan_{r.name}[{LANES}] = {{0}};")
            prefetch = self.prefetch if self.loop_index == 1 else []
            self._inner(lp, ind, scalars, bool(reds), prefetch)
            for r in reds:
                t = VALUE_T[acc_type(r)]
                self.lines.append(f"{ind}{t} red_{r.name} = acc_{r.name}[0];")
                comb = _COMBINE[r.reduction_type].format(a=f"red_{r.name}", b=f"acc_{r.name}[l]")
                self.lines.append(f"{ind}for (int l = 1; l < {LANES}; ++l) red_{r.name} = {comb};")
                if _nan_tracked(r):
                    nan = const_c(math.nan, acc_type(r))
                    self.lines.append(
                        f"{ind}for (int l = 0; l < {LANES}; ++l) "
                        f"red_{r.name} = nan_{r.name}[l] ? {nan} : red_{r.name};"
                    )
        for r in reds:
            scalars[r.name] = f"red_{r.name}"
            if r.name not in self.k.local:
                v = (
                    _cast(f"red_{r.name}", acc_type(r), r.dtype)
                    if r.dtype != acc_type(r)
                    else (f"red_{r.name}")
                )
                self.lines.append(ind + store_c(r.name, r.index, v, r.dtype))

    def _kept_for_later_loops(self, lp: Loop) -> frozenset[str]:
        """Pointwise values of a loop without inner ranges that stay in registers and that a
        later loop of the kernel reads (the scheduler made them local: fusion.build)."""
        later = set()
        for other in self.k.loops[self.loop_index + 1 :]:
            for n in other.nodes:
                later |= ir.node_reads(n)
        return frozenset(
            n.name
            for n in lp.nodes
            if isinstance(n, ir.Pointwise) and n.name in self.k.local and n.name in later
        )

    def _inner(
        self,
        lp: Loop,
        ind: str,
        scalars: dict[str, str],
        lanes: bool,
        prefetch: list[tuple[str, sympy.Expr]],
    ) -> None:
        """The loops over `lp.inner`: the innermost one in blocks of LANES when reductions
        accumulate per lane or when each block prefetches a cache line of the next rows."""
        m = len(lp.inner)
        close = 0
        for i, s in enumerate(lp.inner[:-1]):
            self.lines.append(f"{ind}for (int64_t r{i} = 0; r{i} < {c_size(s)}; ++r{i}) {{")
            ind += "  "
            close += 1
        last, size = f"r{m - 1}", c_size(lp.inner[-1])
        if not lanes and not prefetch:
            self.lines.append(f"{ind}#pragma omp simd")
            self.lines.append(f"{ind}for (int64_t {last} = 0; {last} < {size}; ++{last}) {{")
            self._statements(lp.nodes, ind + "  ", scalars, None)
            self.lines.append(f"{ind}}}")
        else:
            self.lines.append(f"{ind}{{")
            self.lines.append(f"{ind}int64_t rb = 0;")
            self.lines.append(f"{ind}for (; rb + {LANES} <= {size}; rb += {LANES}) {{")
            for buf, index in prefetch:
                per_line = max(1, 64 // self.buffers[buf].dtype.itemsize)
                for at in range(0, LANES, per_line):
                    where = indexing.to_c(index.subs(R0, _RB + at))
                    self.lines.append(f"{ind}  __builtin_prefetch(&{buf}[{where}], 0, 3);")
            self.lines.append(f"{ind}  #pragma omp simd")
            self.lines.append(f"{ind}  for (int l = 0; l < {LANES}; ++l) {{")
            self.lines.append(f"{ind}    const int64_t {last} = rb + l;")
            self._statements(lp.nodes, ind + "    ", scalars, "l", fast=True)
            self.lines.append(f"{ind}  }}")
            self.lines.append(f"{ind}}}")
            self.lines.append(f"{ind}for (; rb < {size}; ++rb) {{")
            # The scalar tail stays scalar: g++ 12.2 at -O3 vectorizes a float64 sum into
            # acc[0] over short rows wrongly (notes/backend.md, "g++ 12 and scalar tails");
            # an asm that may change `rb` keeps the vectorizer off this loop and its outer ones.
            # Element r goes to lane r % LANES, as in the blocks: rows shorter than a block
            # still sum in several partial sums, not in one long chain.
            self.lines.append(f'{ind}  __asm__("" : "+r"(rb));')
            self.lines.append(f"{ind}  const int64_t {last} = rb;")
            self._statements(lp.nodes, ind + "  ", scalars, f"rb % {LANES}")
            self.lines.append(f"{ind}}}")
            self.lines.append(f"{ind}}}")
        for _ in range(close):
            ind = ind[:-2]
            self.lines.append(f"{ind}}}")


COLUMNS = 64  # adjacent outputs a column reduction accumulates at once


MAX_SCRATCH = 16384  # elements of a per-row scratch array (on the thread's stack)


def _subexprs(lp: Loop) -> set[ir.Expr]:
    out: set[ir.Expr] = set()
    for n in lp.nodes:
        out.update(ir.walk(n.body))
    return out


def _shared_across_loops(k: Kernel):
    """Transcendental subexpressions an earlier loop over the same row computes and a later
    loop needs again (softmax's exp is computed once, not twice). The earlier loop keeps them
    where the later one reads them: in the later loop's own output element when that loop
    only writes that output, in the same dtype (the later loop reads each element before it
    overwrites it; nothing else in the kernel reads that output, and the memory plan never
    gives a kernel's output the storage of something the kernel reads), else in a per-row
    scratch array on the stack. Returns ({loop: [(expr, ref)]}, {loop: {expr: ref}},
    [(dtype, array, size)] to declare)."""
    loops = k.loops
    stash: dict[int, list] = {}
    preset: dict[int, dict] = {}
    arrays: list[tuple[DType, str, int]] = []
    subs = [_subexprs(lp) for lp in loops]
    for j, lp in enumerate(loops):
        if len(lp.inner) != 1:
            continue
        # a row of symbolic length is kept only in the output row, never on the stack
        scratch = isinstance(lp.inner[0], int) and lp.inner[0] <= MAX_SCRATCH
        own = lp.nodes[0] if len(lp.nodes) == 1 else None
        in_output = isinstance(own, ir.Pointwise) and own.name not in k.local
        if not (scratch or in_output):
            continue
        for i in range(j):
            if loops[i].inner != lp.inner:
                continue
            shared = {e for e in subs[i] & subs[j] if ir.any_transcendental(ir.walk(e))}
            shared -= {e for e in shared if e in preset.get(j, {})}
            top = [
                e for e in shared if not any(e is not f and e in set(ir.walk(f)) for f in shared)
            ]
            for e in top:
                if in_output and own.dtype == e.dtype:
                    ref = f"{own.name}[{indexing.to_c(own.index)}]"
                    in_output = False
                elif not scratch:
                    continue
                else:
                    name = f"scratch{len(arrays)}"
                    arrays.append((e.dtype, name, lp.inner[0]))
                    ref = f"{name}[r0]"
                stash.setdefault(i, []).append((e, ref))
                preset.setdefault(j, {})[e] = ref
    return stash, preset, arrays


_RB = sympy.Symbol("rb", integer=True, nonnegative=True)  # a block's first r0


def c_size(v: ir.Size) -> str:
    """C source of a size (a size symbol is an argument of the kernel)."""
    return str(v) if isinstance(v, int) else indexing.to_c(v)


def kernel_source(
    k: Kernel, buffers: dict[str, ir.Buffer], in_place: frozenset[str] = frozenset()
) -> tuple[str, list[str]]:
    """(C++ text of the kernel function, its parameters in order: pointers, then sizes).
    `in_place`: buffers the wrapper passes with one storage (memory.in_place_buffers)."""
    w = KernelWriter(k, buffers, in_place)
    return w.source(), w.params()
