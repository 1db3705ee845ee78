"""Replacement bytecode (seed 000's last step, Dynamo's PyCodegen).

The generated code object has the user function's signature and closure layout. It loads
`__compiled_fn_N` from the function's globals, stages the graph inputs by reloading their
sources, calls it, keeps the output tuple in a local, replays the side-effect ledger, rebuilds
the return value from graph outputs, constants, sources and fresh containers, and returns.
"""

from __future__ import annotations

import types

import torch

from ember.bytecode import CodeBuilder
from ember.capture.output_graph import Harvest
from ember.capture.side_effects import SideEffects
from ember.capture.values.base import Value
from ember.capture.values.containers import DictValue, ListValue, SequenceValue
from ember.capture.values.objects import UserObjectValue
from ember.capture.values.tensor import TensorValue
from ember.errors import BreakReason, Unsupported

GRAPH_OUT = "___graph_out"


class Emitter:
    """Pushes values at run time; fresh mutable objects are built once and reused."""

    def __init__(self, cg: CodeBuilder, output_index: dict[torch.fx.Node, int]) -> None:
        self.cg = cg
        self.output_index = output_index
        self._built: dict[int, str] = {}

    def load_tensor(self, value: TensorValue) -> None:
        if value.node in self.output_index:
            self.cg.load_fast(GRAPH_OUT)
            self.cg.load_const(self.output_index[value.node])
            self.cg.subscr()
        elif value.source is not None:
            value.source.emit(self.cg)
        else:
            raise Unsupported(
                BreakReason.UNSUPPORTED_OBJECT, f"{value.describe()} is not a graph output"
            )

    def reconstruct(self, value: Value) -> None:
        key = id(value)
        if key in self._built:
            self.cg.load_fast(self._built[key])
            return
        value.reconstruct(self)
        if _is_fresh_mutable(value):
            name = f"___tmp{len(self._built)}"
            self._built[key] = name
            self.cg.copy(1)
            self.cg.store_fast(name)

    def rebuild_fresh(self, container: Value) -> None:
        """Build a container's current contents as a new object (for replaying into it)."""
        saved = container.source
        container.source = None
        try:
            container.reconstruct(self)
        finally:
            container.source = saved


def _is_fresh_mutable(value: Value) -> bool:
    if value.source is not None:
        return False
    return isinstance(value, (ListValue, DictValue)) or (
        isinstance(value, UserObjectValue) and value.is_new
    )


def live_tensors(values: list[Value]) -> list[TensorValue]:
    """Tensors reachable from values that will be rebuilt after the graph."""
    found: list[TensorValue] = []
    seen: set[int] = set()

    def visit(v: Value) -> None:
        if id(v) in seen:
            return
        seen.add(id(v))
        if isinstance(v, TensorValue):
            found.append(v)
        elif isinstance(v, SequenceValue):
            for item in v.items:
                visit(item)
        elif isinstance(v, DictValue):
            for item in v.items.values():
                visit(item)
        elif isinstance(v, UserObjectValue) and v.is_new:
            for item in v.attrs.values():
                visit(item)

    for value in values:
        visit(value)
    return found


def build_replacement(
    template: types.CodeType,
    compiled_name: str | None,
    harvest: Harvest,
    effects: SideEffects,
    result: Value,
) -> types.CodeType:
    """The code object that replaces the user's function body for one cache entry."""
    cg = CodeBuilder(template, name_suffix="")
    em = Emitter(cg, harvest.output_index)
    if compiled_name is not None:
        cg.push_null()
        cg.load_global(compiled_name)
        for graph_input in harvest.inputs:
            graph_input.source.emit(cg)
        cg.call(len(harvest.inputs))
        cg.store_fast(GRAPH_OUT)
    effects.replay(em)
    em.reconstruct(result)
    cg.return_value()
    return cg.to_code()
