"""The graph being built for one capture (seed 000's OutputGraph).

Inputs are registered on first use, named from their source and deduplicated by source (and
by tensor identity, with a guard that the two sources stay the same object). At harvest the
live values become the output tuple, unused inputs are dropped together with their guards,
and a `torch.fx.GraphModule` comes out with its example inputs and input sources.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ember import torch_compat
from ember.capture.guards import GuardKind, GuardSet
from ember.capture.sources import Source
from ember.capture.subgraph import module_with
from ember.capture.values.tensor import TensorValue
from ember.meta import to_meta


@dataclasses.dataclass(slots=True)
class GraphInput:
    source: Source
    value: TensorValue
    real: torch.Tensor


@dataclasses.dataclass(slots=True)
class Harvest:
    gm: torch.fx.GraphModule
    inputs: list[GraphInput]
    output_index: dict[torch.fx.Node, int]

    @property
    def example_inputs(self) -> list[torch.Tensor]:
        return [i.real for i in self.inputs]

    def is_empty(self) -> bool:
        """No outputs and no work. Grad-mode switches alone are no work: the replacement
        code sets the mode the frame leaves with itself."""
        return not self.output_index and not any(
            (n.op == "call_function" and n.target is not torch_compat.set_grad_enabled)
            or n.op == "call_method"
            for n in self.gm.graph.nodes
        )


class OutputGraph:
    def __init__(self, guards: GuardSet) -> None:
        self.graph = torch.fx.Graph()
        self.guards = guards
        self._inputs: dict[Source, GraphInput] = {}
        self._by_tensor: dict[int, GraphInput] = {}
        self._last_placeholder: torch.fx.Node | None = None
        self.submodules: dict[str, torch.fx.GraphModule] = {}
        """The bodies of higher-order ops (capture/subgraph.py), by attribute name."""

    def graph_input(self, source: Source, real: torch.Tensor) -> TensorValue:
        """The symbolic tensor for a tensor reached through `source` (a placeholder)."""
        if source in self._inputs:
            return self._inputs[source].value
        same = self._by_tensor.get(id(real))
        if same is not None:
            self.guards.add(GuardKind.SAME_OBJECT, source, same.source)
            return same.value
        if self._last_placeholder is None:
            first = next(iter(self.graph.nodes), None)
            ctx = self.graph.inserting_before(first)
        else:
            ctx = self.graph.inserting_after(self._last_placeholder)
        name = source.graph_name()
        taken = {n.target for n in self.graph.nodes if n.op == "placeholder"}
        suffix = 1
        while name in taken:  # two sources may print alike (same-named closures)
            name, suffix = f"{source.graph_name()}{suffix}_", suffix + 1
        with ctx:
            node = self.graph.placeholder(name)
        self._last_placeholder = node
        fake = to_meta(real)
        node.meta["example_value"] = fake
        node.meta["source"] = source.name()
        value = TensorValue(node, fake, real.device, source)
        value.python_cls = type(real)
        entry = GraphInput(source, value, real)
        self._inputs[source] = entry
        self._by_tensor[id(real)] = entry
        return value

    def create_node(self, kind: str, target: Any, args: tuple, kwargs: dict) -> torch.fx.Node:
        return self.graph.create_node(kind, target, args, kwargs)

    def erase_node(self, node: torch.fx.Node) -> None:
        if not node.users:
            self.graph.erase_node(node)

    def check_writes(self, written: list[TensorValue]) -> None:
        """An op wrote these tensors in place: always allowed here (a body refuses it for
        tensors from outside it, capture/subgraph.py)."""

    def harvest(self, outputs: list[TensorValue]) -> Harvest:
        """Finish the graph: outputs as a tuple, unused inputs dropped."""
        output_index: dict[torch.fx.Node, int] = {}
        for value in outputs:
            if value.node.op != "placeholder" and value.node not in output_index:
                output_index[value.node] = len(output_index)
        self.graph.output(tuple(output_index))
        inputs = []
        for entry in self._inputs.values():
            # The guard stays even for an unused input: the trace may have read its shape.
            self.guards.add(GuardKind.TENSOR_MATCH, entry.source, entry.real)
            if entry.value.node.users:
                inputs.append(entry)
            else:
                self.graph.erase_node(entry.value.node)
        gm = torch.fx.GraphModule(module_with(self.submodules), self.graph)
        return Harvest(gm, inputs, output_index)
