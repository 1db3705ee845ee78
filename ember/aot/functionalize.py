"""Functionalization at dispatch time: classify aten ops and keep one value per tensor.

The tracer (trace.py) sees every aten op, in-place and `out=` ones included. Backends want a
graph where every node is a pure function of its inputs, so this module:

- classifies an OpOverload from its schema (view, in-place / out= / other mutable, functional),
  and finds the functional overload that computes what a mutating one writes;
- tracks aliasing: every tensor is either a *root* (owns its storage in the traced program) or
  a view of a root through a chain of view ops. A mutation writes a new value for the root
  (scattering through the chain when the mutated tensor is a view) and bumps the root's
  generation; views are regenerated from the root's current value when next read.

It knows nothing about fx: it emits through the small `Emitter` protocol that the tracer
implements, so the same logic serves the inference and the joint traces.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.fx as fx

from ember import torch_compat
from ember.errors import BreakReason, Unsupported

aten = torch.ops.aten
OpOverload = torch_compat.OpOverload


class FunctionalizeError(Unsupported):
    """An aliasing or mutation pattern that ember's functionalization cannot express."""


def _unsupported(msg: str, hint: str = "") -> FunctionalizeError:
    return FunctionalizeError(BreakReason.SIDE_EFFECT, msg, hint=hint)


# ---------------------------------------------------------------------------------------------
# schema classification


def mutated_args(func: OpOverload) -> list[int]:
    """Positions (in the schema) of the arguments this op writes to."""
    return [
        i
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]


def is_view_op(func: OpOverload) -> bool:
    """True when an output aliases an input without writing it (view, split, detach...)."""
    if mutated_args(func):
        return False
    return any(r.alias_info is not None for r in func._schema.returns)


def is_inplace(func: OpOverload) -> bool:
    schema = func._schema
    return (
        schema.name.endswith("_")
        and bool(schema.arguments)
        and schema.arguments[0].alias_info is not None
        and schema.arguments[0].alias_info.is_write
    )


# ops whose functional form is not found by name
_FUNCTIONAL_OVERRIDES: dict[OpOverload, OpOverload] = {
    aten.bernoulli_.float: aten.bernoulli.p,
    aten.bernoulli_.Tensor: aten.bernoulli.Tensor,
    aten.normal_.default: aten.normal_functional.default,
}


def _signature(func: OpOverload, skip: frozenset[int] = frozenset()) -> list[tuple[str, str]]:
    """Names and types of the arguments: names alone confuse overloads such as
    `pow_.Scalar(Tensor self, Scalar exponent)` with `pow.Scalar(Scalar self, Tensor
    exponent)`, whose functional twin is `pow.Tensor_Scalar` (`z **= 2`)."""
    return [(a.name, str(a.type)) for i, a in enumerate(func._schema.arguments) if i not in skip]


def _find_overload(
    packet_name: str, names: list[tuple[str, str]], prefer: str
) -> OpOverload | None:
    packet = getattr(aten, packet_name, None)
    if packet is None:
        return None
    candidates = [prefer] + [o for o in packet.overloads() if o != prefer]
    for overload in candidates:
        op = getattr(packet, overload, None)
        if op is None or mutated_args(op):
            continue
        if _signature(op) == names:
            return op
    return None


def functional_variant(func: OpOverload) -> OpOverload:
    """The out-of-place overload computing what `func` writes (same argument names)."""
    if func in _FUNCTIONAL_OVERRIDES:
        return _FUNCTIONAL_OVERRIDES[func]
    base = func._schema.name.split("::")[-1]
    overload = func._overloadname
    writes = frozenset(mutated_args(func))
    if is_inplace(func):
        names = _signature(func)
        dunder = base.startswith("__i") and base.endswith("__")  # __ilshift__ -> __lshift__
        found = _find_overload(f"__{base[3:]}" if dunder else base[:-1], names, overload)
    else:  # out= style: drop the written kwarg-only args
        names = _signature(func, writes)
        found = _find_overload(base, names, "default")
        if found is None:
            found = _find_overload(base + "_functional", _signature(func), overload)
    if found is None:
        raise _unsupported(
            f"no functional form known for the mutating aten op {func}",
            hint="use the out-of-place version of this operation in the compiled region",
        )
    return found


# ---------------------------------------------------------------------------------------------
# aliasing state


class Emitter(Protocol):
    """What functionalization needs from the tracer: emit an op on value nodes."""

    def emit(self, func: Any, args: tuple, kwargs: dict, val: Any) -> fx.Node: ...

    def fake(self, node: fx.Node) -> torch.Tensor: ...


@dataclass(slots=True)
class ViewStep:
    """One view op in a chain: `func(prev, *args, **kwargs)[index]`."""

    func: OpOverload
    args: tuple
    kwargs: dict
    index: int | None  # for multi-output views (split, unbind)


@dataclass
class AliasInfo:
    """How a tensor relates to its root; `cache` is (generation, node) of its last value."""

    root: int  # id of the root tensor
    chain: list[ViewStep] = field(default_factory=list)
    cache: tuple[int, fx.Node] | None = None


class AliasTracker:
    """Current value of every traced tensor, keyed by id (the tracer keeps tensors alive)."""

    def __init__(self, emitter: Emitter) -> None:
        self.emitter = emitter
        self.info: dict[int, AliasInfo] = {}
        self.root_value: dict[int, fx.Node] = {}
        self.generation: dict[int, int] = {}
        self.tensors: dict[int, torch.Tensor] = {}

    def add_root(self, t: torch.Tensor, node: fx.Node) -> None:
        key = id(t)
        self.tensors[key] = t
        self.info[key] = AliasInfo(root=key)
        self.root_value[key] = node
        self.generation[key] = 0

    def known(self, t: torch.Tensor) -> bool:
        return id(t) in self.info

    def add_view(self, out: torch.Tensor, src: torch.Tensor, step: ViewStep, node: fx.Node) -> None:
        src_info = self.info[id(src)]
        root = src_info.root
        self.tensors[id(out)] = out
        self.info[id(out)] = AliasInfo(
            root=root, chain=[*src_info.chain, step], cache=(self.generation[root], node)
        )

    def root_of(self, t: torch.Tensor) -> int:
        return self.info[id(t)].root

    def view_chain(self, t: torch.Tensor) -> list[ViewStep]:
        return self.info[id(t)].chain

    def mutated_roots(self) -> list[int]:
        return [r for r, g in self.generation.items() if g > 0]

    def read(self, t: torch.Tensor) -> fx.Node:
        """The node holding `t`'s current value, regenerating a stale view from its root."""
        info = self.info[id(t)]
        if not info.chain:
            return self.root_value[info.root]
        gen = self.generation[info.root]
        if info.cache is not None and info.cache[0] == gen:
            return info.cache[1]
        node = self.root_value[info.root]
        for step in info.chain:
            node = self._emit_step(step, node)
        info.cache = (gen, node)
        return node

    def _emit_step(self, step: ViewStep, node: fx.Node) -> fx.Node:
        prev = self.emitter.fake(node)
        val = step.func(prev, *step.args, **step.kwargs)
        out = self.emitter.emit(step.func, (node, *step.args), step.kwargs, val)
        if step.index is not None:
            out = self.emitter.emit(operator.getitem, (out, step.index), {}, val[step.index])
        return out

    def write(self, t: torch.Tensor, value: fx.Node) -> None:
        """Record that `t` now holds `value`: scatter it into the root, invalidate views."""
        info = self.info[id(t)]
        root = info.root
        new_root = value
        # walk the chain backwards, scattering into each intermediate's current value
        prefix_vals: list[fx.Node] = [self.root_value[root]] if info.chain else []
        for step in info.chain[:-1]:
            prefix_vals.append(self._emit_step(step, prefix_vals[-1]))
        for step, prev in zip(reversed(info.chain), reversed(prefix_vals), strict=True):
            new_root = self._scatter(step, prev, new_root)
        new_root = self._match_layout(self.root_value[root], new_root)
        self.root_value[root] = new_root
        self.generation[root] += 1
        if info.chain:
            info.cache = (self.generation[root], value)

    def _match_layout(self, old: fx.Node, new: fx.Node) -> fx.Node:
        """Keep a root's strides: later views are replayed with the strides eager saw."""
        old_val, new_val = self.emitter.fake(old), self.emitter.fake(new)
        if old_val.stride() == new_val.stride() and old_val.dtype == new_val.dtype:
            return new
        val = aten.copy.default(old_val, new_val)
        return self.emitter.emit(aten.copy.default, (old, new), {}, val)

    def _scatter(self, step: ViewStep, prev: fx.Node, value: fx.Node) -> fx.Node:
        """The value of `prev` after writing `value` into `step(prev)`."""
        prev_val = self.emitter.fake(prev)
        rule = _SCATTER.get(step.func)
        if rule is None:
            raise _unsupported(
                f"mutation through the view op {step.func} is not supported",
                hint="mutate the base tensor, or clone the view before mutating it",
            )
        func, args = rule(step, prev, value, prev_val)
        val = func(*[self.emitter.fake(a) if isinstance(a, fx.Node) else a for a in args])
        return self.emitter.emit(func, tuple(args), {}, val)


ScatterRule = Callable[[ViewStep, fx.Node, fx.Node, torch.Tensor], tuple[OpOverload, list]]
_SCATTER: dict[OpOverload, ScatterRule] = {}


def _scatter_rule(*funcs: OpOverload) -> Callable[[ScatterRule], ScatterRule]:
    def register(fn: ScatterRule) -> ScatterRule:
        for f in funcs:
            _SCATTER[f] = fn
        return fn

    return register


@_scatter_rule(
    aten.view.default,
    aten._unsafe_view.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten._reshape_alias.default,
)
def _scatter_reshape(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    return aten.view.default, [value, list(prev_val.shape)]


@_scatter_rule(aten.alias.default, aten.detach.default)
def _scatter_alias(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    return aten.alias.default, [value]


@_scatter_rule(aten.t.default, aten.transpose.int)
def _scatter_transpose(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    return step.func, [value, *step.args]


@_scatter_rule(aten.permute.default)
def _scatter_permute(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    dims = [d % prev_val.dim() for d in step.args[0]]
    inverse = [dims.index(i) for i in range(len(dims))]
    return aten.permute.default, [value, inverse]


@_scatter_rule(aten.slice.Tensor)
def _scatter_slice(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    return aten.slice_scatter.default, [prev, value, *step.args]


@_scatter_rule(aten.select.int)
def _scatter_select(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    return aten.select_scatter.default, [prev, value, *step.args]


@_scatter_rule(aten.diagonal.default)
def _scatter_diagonal(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    return aten.diagonal_scatter.default, [prev, value, *step.args]


@_scatter_rule(aten.as_strided.default)
def _scatter_as_strided(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    return aten.as_strided_scatter.default, [prev, value, *step.args]


@_scatter_rule(aten.unbind.int)
def _scatter_unbind(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    dim = step.args[0] if step.args else step.kwargs.get("dim", 0)
    return aten.select_scatter.default, [prev, value, dim, step.index]


@_scatter_rule(aten.split.Tensor, aten.split_with_sizes.default)
def _scatter_split(step, prev, value, prev_val):  # type: ignore[no-untyped-def]
    dim = step.args[1] if len(step.args) > 1 else step.kwargs.get("dim", 0)
    dim %= prev_val.dim()
    length = prev_val.shape[dim]
    if step.func is aten.split.Tensor:
        size = step.args[0]
        start = step.index * size
        end = min(start + size, length)
    else:
        sizes = list(step.args[0])
        start = sum(sizes[: step.index])
        end = start + sizes[step.index]
    return aten.slice_scatter.default, [prev, value, dim, start, end, 1]
