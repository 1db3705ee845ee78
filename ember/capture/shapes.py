"""Symbolic sizes in capture (issue 13): which input sizes become symbols, the graph inputs
that carry them, and the guards the trace's use of them needs.

A capture that has a dynamic size holds one torch `ShapeEnv`. A tensor input's dynamic dims
get SymInts in its meta example (a size 0 or 1 stays a constant, as Dynamo has it), an int
input becomes a SymInt. Every size the trace then reads (`x.shape`, `x.size(1)`, `numel()`,
arithmetic on them) is a SymInt held in a ConstantValue, and Python's own operators on SymInts
record in the ShapeEnv whatever the trace relied on (`if n > 2` -> the guard `s0 > 2`, a
broadcast of two sizes -> `s0 == s1`); each such guard is labelled with the user's file:line
of the instruction that added it. Where a SymInt reaches the graph (a view's argument),
`SymbolicShapes.graph_arg` writes its expression as fx nodes over the symbols' placeholders,
which are graph inputs (`s0: "Sym(s0)"`) the way Dynamo's are, so any backend gets them.
A symbolic number the code after the graph needs (a size returned, a counter's `calls + 1`
stored back) is not a graph output: `SymbolicShapes.in_python` makes it a Python function of
the symbols' values, which the replacement code reads from their sources at entry.

Which sizes are dynamic is the `DynamicPolicy`: every dim of the user's tensor (and int)
arguments under `dynamic=True`; under automatic dynamic (`dynamic=None`) the ones a failed
guard showed changing (`SizeRecord.changes`); plus the marks of `mark_dynamic` and friends
(torch._dynamo's marks are the same attributes); and, unless `dynamic=False`, an int the
capture itself writes back changed (a counter: `written_back`, the capture runs again with it
a symbol, so it needs no value guard and no second graph).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import sympy
import torch
import torch._guards
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, constrain_range
from torch.utils._sympy.functions import FloorDiv, Max, Min, Mod, PythonMod
from torch.utils._sympy.printers import PythonPrinter

from ember import logs, torch_compat
from ember.capture.sources import GuardScope, ItemSource, LocalSource, SizeSource, Source
from ember.torch_compat import python_dispatcher

PYTHON_TYPES = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}
"""The Python type each symbolic type stands for."""
SYM_TYPES = tuple(PYTHON_TYPES)


def is_symbolic(value: Any) -> bool:
    """A SymInt/SymFloat/SymBool that its ShapeEnv does not know as a constant."""
    return isinstance(value, SYM_TYPES) and not value.node.expr.is_number


def has_symbols(value: Any) -> bool:
    """A symbolic size, or a tuple (`x.shape`) holding one."""
    if type(value) in (tuple, torch.Size):
        return any(map(is_symbolic, value))
    return is_symbolic(value)


def concrete(value: Any) -> Any:
    """`value` as a plain Python number: a SymInt is specialized (its ShapeEnv records the
    guard `s0 == 4`), for places that must bake a number in (a constant in emitted code)."""
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymInt):
        return int(value)
    return value


# -- marks --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class DimRange:
    """A dim marked dynamic with bounds (the attribute shape torch._dynamo's marks use)."""

    dim: int
    min: int | None
    max: int | None


def _marked(t: torch.Tensor, attr: str) -> set[int]:
    return {d % max(t.dim(), 1) for d in getattr(t, attr, ())}


def mark_dynamic(t: torch.Tensor, dim: int, min: int | None = None, max: int | None = None) -> None:
    """Make `t`'s size at `dim` a symbol whenever a compiled function receives `t` (a guard
    checks `min <= size <= max` when bounds are given; a size outside them stays static).
    Same marks as torch._dynamo's. Where the trace specializes the size anyway, ember
    guards on it and logs where (`EMBER_LOGS=dynamic`); torch.compile raises instead."""
    if not hasattr(t, "_dynamo_dynamic_indices"):
        t._dynamo_dynamic_indices = set()
        t._dynamo_dynamic_range = set()
    t._dynamo_dynamic_indices.add(dim)
    t._dynamo_dynamic_range.add(DimRange(dim, min, max))


def maybe_mark_dynamic(t: torch.Tensor, dim: int) -> None:
    """Like `mark_dynamic` without bounds (torch.compile's variant that tolerates a
    specialization; ember never raises on one)."""
    if not hasattr(t, "_dynamo_weak_dynamic_indices"):
        t._dynamo_weak_dynamic_indices = set()
    t._dynamo_weak_dynamic_indices.add(dim)


def mark_static(t: torch.Tensor, dim: int | None = None) -> None:
    """Keep `t`'s size at `dim` (every dim when None) a constant, even under dynamic=True."""
    if not hasattr(t, "_dynamo_static_indices"):
        t._dynamo_static_indices = set()
    t._dynamo_static_indices.update(range(t.dim()) if dim is None else [dim])


# -- policy and automatic dynamic ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DynamicPolicy:
    everything: bool = False
    """dynamic=True: every dim of the user's tensor arguments and every int argument."""
    dims: Mapping[Source, frozenset[int]] = dataclasses.field(default_factory=dict)
    """Automatic dynamic: the dims seen changing (-1 for an int argument)."""
    counters: bool = False
    """An int the capture reads from the arguments and writes back changed (`self.calls +=
    1`) is a symbol at once: its value guard would fail on the very next call (not under
    dynamic=False)."""

    def with_ints(self, sources: list[Source]) -> DynamicPolicy:
        """This policy, with the ints at `sources` symbols too."""
        dims = dict(self.dims)
        for source in sources:
            dims[source] = dims.get(source, frozenset()) | {-1}
        return dataclasses.replace(self, dims=dims)


def user_input(source: Source) -> bool:
    """An argument of the function, or an item of one: what dynamic=True makes symbolic
    (parameters, buffers and globals keep their sizes, as torch.compile has it)."""
    while isinstance(source, ItemSource):
        source = source.base
    return isinstance(source, LocalSource)


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    source: Source
    dim: int
    """-1 for an int argument."""
    old: int
    new: int

    def describe(self) -> str:
        where = self.source.name() if self.dim < 0 else SizeSource(self.source, self.dim).name()
        return f"{where} changed from {self.old} to {self.new}"


class SizeRecord:
    """The sizes of the tensors and the ints a capture read from the user's arguments, and a
    function reading the same sources of a later call (built like the guard function)."""

    def __init__(self, observed: list[tuple[Source, Any]], fn: Any) -> None:
        self.observed = observed
        self._fn = fn
        self._reader: Callable[..., list] | None = None

    def changes(self, args: tuple, kwargs: dict) -> list[Change]:
        from ember.capture.guards import build_reader

        if self._reader is None:
            self._reader = build_reader([source for source, _ in self.observed], self._fn)
        try:
            values = self._reader(*args, **kwargs)
        except Exception:  # an argument of another structure: not a size change
            return []
        found = []
        for (source, old), new in zip(self.observed, values, strict=True):
            if isinstance(old, tuple):
                if isinstance(new, torch.Tensor) and new.dim() == len(old):
                    found += [
                        Change(source, d, o, n)
                        for d, (o, n) in enumerate(zip(old, new.shape))
                        if o != n
                    ]
            elif type(new) is int and new != old:
                found.append(Change(source, -1, old, new))
        return found


# -- the capture's shapes ------------------------------------------------------------------


class _SymbolOrigin(torch._guards.Source):
    """Where a symbol came from, for the ShapeEnv's own records (it reads only the name)."""

    def __init__(self, source: Source) -> None:
        self.ember_source = source

    @property
    def _name_template(self) -> str:
        return self.ember_source.name()

    def __hash__(self) -> int:
        return hash(self.ember_source)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SymbolOrigin) and other.ember_source == self.ember_source


@dataclasses.dataclass(frozen=True, slots=True)
class NewSymbol:
    source: Source
    value: torch.SymInt
    hint: int


@dataclasses.dataclass(frozen=True, slots=True)
class PythonSize:
    """A symbolic number computed by the replacement code: `fn` applied to the values of
    `symbols` (read from their sources when the code starts, before any side effect is
    replayed: the symbols stand for the values the guards checked). `fn` is None for a
    symbol as it came in."""

    fn: Callable[..., Any] | None
    symbols: tuple[tuple[sympy.Symbol, Source], ...]


_PRINTER = PythonPrinter()


def _add(*args: Any) -> Any:
    return functools.reduce(operator.add, args)


def _mul(*args: Any) -> Any:
    return functools.reduce(operator.mul, args)


_SYMPY_OPS: dict[type, Callable[..., Any]] = {
    sympy.Add: _add,
    sympy.Mul: _mul,
    FloorDiv: operator.floordiv,
    PythonMod: operator.mod,
    Mod: operator.mod,
    Max: torch.sym_max,
    Min: torch.sym_min,
}


class SymbolicShapes:
    """One capture's symbols: created for dynamic input sizes, written into the graph, and
    guarded at the end. Inactive (no ShapeEnv, no cost) until the first dynamic size."""

    def __init__(self, policy: DynamicPolicy | None) -> None:
        self.policy = policy
        self.env: ShapeEnv | None = None
        self.sources: dict[sympy.Symbol, Source] = {}
        self.hints: dict[sympy.Symbol, int] = {}
        """Each symbol's value in the call being captured."""
        self.placeholders: dict[sympy.Symbol, torch.fx.Node] = {}
        self._nodes: dict[sympy.Expr, torch.fx.Node] = {}
        self.observed: list[tuple[Source, Any]] = []
        """Sizes read from the user's arguments (for automatic dynamic)."""
        self.where: list[str] = []
        """The user's file:line for each guard of the ShapeEnv, in order."""
        self.ints_read: dict[Source, int] = {}
        """Every int the trace read from outside (its value in this call), by source."""
        self.int_symbols: dict[Source, torch.SymInt] = {}
        """The symbols made for int values, by where they were read."""

    # inputs
    def observe(self, source: Source, value: Any) -> None:
        """Remember a size the trace read: a tensor argument's shape, or an int reached from
        the arguments (`n`, `self.calls`), for automatic dynamic."""
        if isinstance(value, torch.Tensor):
            if user_input(source):
                self.observed.append((source, tuple(value.shape)))
        elif source.is_local():
            self.observed.append((source, value))

    def _dynamic_dims(self, source: Source, real: torch.Tensor) -> set[int]:
        dims = _marked(real, "_dynamo_dynamic_indices") | _marked(
            real, "_dynamo_weak_dynamic_indices"
        )
        if self.policy is not None:
            if self.policy.everything and user_input(source):
                dims.update(range(real.dim()))
            dims.update(self.policy.dims.get(source, ()))
        return dims - _marked(real, "_dynamo_static_indices")

    def _symbol(
        self, source: Source, hint: int, bounds: tuple | None = None, size: bool = True
    ) -> Any:
        """A SymInt for `hint`: a size (at least 2: 0 and 1 stay constants) or, with
        `size=False`, any int (a counter may be 0, 1 or negative)."""
        if self.env is None:
            self.env = torch_compat.shape_env(duck_shape=False)
        origin = _SymbolOrigin(source)
        expr = self.env.create_symbol(
            hint,
            origin,
            dynamic_dim=DimDynamic.DYNAMIC,
            positive=True if size else None,
            do_not_specialize_zero_one=not size,
        )
        if expr.is_number:
            logs.log(
                "dynamic", "%s = %s stays a constant (0/1 specialization)", source.name(), hint
            )
            return int(expr)
        value = self.env.create_symintnode(expr, hint=hint, source=origin)
        self.sources[expr] = source
        self.hints[expr] = hint
        if bounds is not None and (bounds[0] is not None or bounds[1] is not None):
            constrain_range(value, min=bounds[0], max=bounds[1])
        logs.log("dynamic", "create symbol %s = %s for %s", expr, hint, source.name())
        return value

    def tensor_example(
        self, source: Source, real: torch.Tensor
    ) -> tuple[torch.Tensor, list[NewSymbol]] | None:
        """A meta example of `real` with symbols at its dynamic dims, and the new symbols;
        None when it has no dynamic dim (or a layout whose strides are not a function of its
        sizes: it then stays static)."""
        dims = self._dynamic_dims(source, real)
        if not dims or real.layout is not torch.strided or real.storage_offset() != 0:
            return None
        order = sorted(range(real.dim()), key=lambda d: (real.stride(d), real.shape[d]))
        expected = 1
        for d in order:
            if real.stride(d) != expected and real.shape[d] > 1:
                logs.log("dynamic", "%s keeps static sizes: not densely strided", source.name())
                return None
            expected *= real.shape[d]
        bounds = {
            r.dim % real.dim(): (r.min, r.max) for r in getattr(real, "_dynamo_dynamic_range", ())
        }
        for d, (low, high) in bounds.items():
            if not (low or 0) <= real.shape[d] <= (high if high is not None else real.shape[d]):
                where = SizeSource(source, d).name()
                logs.log(
                    "dynamic", "%s = %s is outside its mark's bounds: static", where, real.shape[d]
                )
                dims.discard(d)
        sizes: list[Any] = []
        new: list[NewSymbol] = []
        for d, n in enumerate(real.shape):
            if d in dims:
                size = self._symbol(SizeSource(source, d), n, bounds.get(d))
                if isinstance(size, torch.SymInt):
                    new.append(NewSymbol(SizeSource(source, d), size, n))
                sizes.append(size)
            else:
                sizes.append(n)
        if not new:
            return None
        strides: list[Any] = [0] * real.dim()
        running: Any = 1
        for d in order:
            strides[d] = (
                running if real.shape[d] > 1 or real.stride(d) == running else real.stride(d)
            )
            running = running * sizes[d]
        with python_dispatcher():
            meta = torch.empty_strided(sizes, strides, dtype=real.dtype, device="meta")
            if real.requires_grad:
                meta.requires_grad_(True)
                if not real.is_leaf:
                    meta = meta.clone()
        return meta, new

    def int_example(self, source: Source, value: int) -> Any:
        """A SymInt for an int that is dynamic, else the int itself: an int argument under
        dynamic=True, any int seen changing under automatic dynamic (a counter attribute)."""
        policy = self.policy
        self.ints_read[source] = value
        if policy is None:
            return value
        if not (policy.everything and user_input(source) or -1 in policy.dims.get(source, ())):
            return value
        symbol = self._symbol(source, value, size=False)
        self.int_symbols[source] = symbol
        return symbol

    def written_back(self, writes: Iterable[tuple[Source, Any]]) -> list[Source]:
        """The ints this capture read as constants and writes back changed (`writes`: the
        constants the ledger stores, by where): counters, for the policy's `counters` rule."""
        if self.policy is None or not self.policy.counters:
            return []
        read = self.ints_read
        found = []
        for source, new in writes:
            if (
                source in read
                and type(new) is int
                and new != read[source]
                and -1 not in self.policy.dims.get(source, ())
            ):
                logs.log(
                    "dynamic",
                    "%s is written back changed (%s -> %s): an int symbol from this capture on",
                    source.name(),
                    read[source],
                    new,
                )
                found.append(source)
        return found

    # the graph
    def graph_arg(self, value: Any, graph: torch.fx.Graph) -> Any:
        """A SymInt/SymFloat/SymBool as an fx argument: its expression over the symbols'
        placeholders; a constant one (or one ember cannot write) as a guarded number."""
        if not is_symbolic(value):
            return concrete(value)
        try:
            return self._build(value.node.expr, graph)
        except _NotWritable:
            return concrete(value)

    def _build(self, expr: sympy.Expr, graph: torch.fx.Graph) -> Any:
        if expr.is_Integer:
            return int(expr)
        if expr in self.placeholders:
            return self.placeholders[expr]
        node = self._nodes.get(expr)
        if node is not None:
            return node
        op = _SYMPY_OPS.get(type(expr))
        if op is None or isinstance(expr, sympy.Symbol):
            raise _NotWritable
        args = [self._build(a, graph) for a in expr.args]
        if len(args) > 2 and op in (_add, _mul):
            node = functools.reduce(lambda a, b: self._node(op, (a, b), graph), args)
        else:
            node = self._node(op, tuple(args), graph)
        self._nodes[expr] = node
        return node

    def in_python(self, value: Any) -> PythonSize | None:
        """How the code after the graph computes a symbolic number in Python (None when ember
        cannot print its expression: it is then made a number, with a guard). The printed
        function is checked on the symbols' values of this call before it is trusted."""
        expr = value.node.expr
        symbols = sorted(expr.free_symbols, key=str)
        if not all(s in self.sources for s in symbols):
            return None
        sources = tuple((s, self.sources[s]) for s in symbols)
        if isinstance(expr, sympy.Symbol):
            return PythonSize(None, sources)
        try:
            fn = eval(  # noqa: S307  (ember's own printing of a sympy expression)
                f"lambda {', '.join(map(str, symbols))}: {_PRINTER.doprint(expr)}",
                {"math": math, "torch": torch},
            )
            result = fn(*(self.hints[s] for s in symbols))
        except Exception:  # a function the printer does not write as Python
            return None
        expected = value.node.hint
        if type(result) is not PYTHON_TYPES[type(value)] or result != expected:
            return None
        return PythonSize(fn, sources)

    @staticmethod
    def _node(op: Callable[..., Any], args: tuple, graph: torch.fx.Graph) -> torch.fx.Node:
        target = {_add: operator.add, _mul: operator.mul}.get(op, op)
        node = graph.call_function(target, args)
        examples = [a.meta["example_value"] if isinstance(a, torch.fx.Node) else a for a in args]
        node.meta["example_value"] = target(*examples)
        return node

    # guards
    def label_guards(self, tx: Any) -> None:
        """Guards the ShapeEnv gained since the last call came from the instruction the
        translator `tx` just ran: labelled with its file:line."""
        count = len(self.env.guards)
        if len(self.where) == count:
            return
        where = tx.location()[0]
        while len(self.where) < count:
            index = len(self.where)
            self.where.append(where)
            if logs.enabled("dynamic"):
                logs.log("dynamic", "guard %s added at %s", self.env.guards[index].expr, where)

    def relations(self) -> list[Relation]:
        """The guards of this capture: each symbol's range, then what the trace relied on."""
        if self.env is None:
            return []
        found: list[Relation] = []
        for symbol, source in self.sources.items():
            # the range the trace assumed (a size >= 2, marked bounds) and refined
            assumed = self.env.var_to_range[symbol]
            why = f"the range of {source.name()}"
            if isinstance(assumed.lower, sympy.Integer):
                found.append(Relation(sympy.Ge(symbol, assumed.lower), self._names(), why))
            if isinstance(assumed.upper, sympy.Integer):
                found.append(Relation(sympy.Le(symbol, assumed.upper), self._names(), why))
        places = self.where + ["the replacement code"] * len(self.env.guards)
        for guard, where in zip(self.env.guards, places):
            found.append(Relation(guard.expr, self._names(), where))
        return found

    def _names(self) -> tuple[tuple[sympy.Symbol, Source], ...]:
        return tuple(self.sources.items())


class _NotWritable(Exception):
    """A size expression with a function ember does not write as fx nodes."""


@dataclasses.dataclass(frozen=True, slots=True)
class Relation:
    """A guard on the symbols: `expr` must hold for the symbols read from their sources."""

    expr: Any
    symbols: tuple[tuple[sympy.Symbol, Source], ...]
    where: str

    def condition(self, scope: GuardScope) -> str:
        used = self.expr.free_symbols
        names = {s: sympy.Symbol(src.expr(scope)) for s, src in self.symbols if s in used}
        return _PRINTER.doprint(self.expr.xreplace(names))


def symbolic_tensor_conditions(
    expr: str,
    example: torch.Tensor,
    real: torch.Tensor,
    scope: GuardScope,
    symbols: Mapping[sympy.Symbol, Source],
) -> list[str]:
    """The checks of a tensor input whose example has symbolic sizes: its static sizes and
    its strides as expressions of the symbols (the symbols themselves are bound by the
    relations' conditions)."""
    conditions = [f"{expr}.dim() == {real.dim()}"]
    for d, size in enumerate(example.shape):
        if not is_symbolic(size):
            conditions.append(f"{expr}.shape[{d}] == {int(size)}")
    strides = []
    for stride in example.stride():
        if is_symbolic(stride):
            e = stride.node._expr
            names = {s: sympy.Symbol(symbols[s].expr(scope)) for s in e.free_symbols}
            strides.append(_PRINTER.doprint(e.xreplace(names)))
        else:
            strides.append(str(int(stride)))
    conditions.append(f"{expr}.stride() == ({', '.join(strides)},)")
    return conditions
