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
from ember.capture.shapes import PythonSize, SymbolicShapes, is_symbolic
from ember.capture.sources import Source
from ember.capture.subgraph import module_with
from ember.capture.values.base import ConstantValue
from ember.capture.values.inference_mode import Block, close_open_blocks
from ember.capture.values.tensor import TensorValue
from ember.meta import to_meta

_RANDOM_FUNCTIONS = frozenset(
    [
        *(
            getattr(torch, name)
            for name in (
                "rand randn randint rand_like randn_like randint_like randperm bernoulli "
                "multinomial normal poisson dropout alpha_dropout feature_dropout "
                "feature_alpha_dropout native_dropout rrelu rrelu_"
            ).split()
            if hasattr(torch, name)
        ),
        *(
            getattr(torch.nn.functional, name)
            for name in (
                "dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout "
                "rrelu rrelu_ gumbel_softmax"
            ).split()
        ),
    ]
)
_RANDOM_METHODS = frozenset(
    "uniform_ normal_ bernoulli bernoulli_ random_ exponential_ geometric_ log_normal_ "
    "cauchy_ multinomial".split()
)


def draws_random(node: torch.fx.Node) -> bool:
    """Whether the node may draw from the global generator (conservatively: a dropout in
    eval mode counts too). The order of draws is program state: work moved ahead of code
    that also draws would change both results."""
    if node.op == "call_method":
        return node.target in _RANDOM_METHODS
    try:
        return node.op == "call_function" and node.target in _RANDOM_FUNCTIONS
    except TypeError:  # an unhashable target
        return False


@dataclasses.dataclass(slots=True)
class GraphInput:
    source: Source
    node: torch.fx.Node
    real: torch.Tensor | int
    """The call's tensor, or the value of a size symbol (an int)."""
    value: TensorValue | None = None


@dataclasses.dataclass(slots=True)
class Harvest:
    gm: torch.fx.GraphModule
    inputs: list[GraphInput]
    output_index: dict[torch.fx.Node, int]
    sizes: dict[Any, PythonSize] = dataclasses.field(default_factory=dict)
    """Symbolic numbers the code after the graph rebuilds, by their expression: computed in
    Python from the symbols, never graph outputs (a counter's `calls + 1` is no graph work)."""

    @property
    def example_inputs(self) -> list[torch.Tensor]:
        return [i.real for i in self.inputs]

    def symbol_reads(self) -> dict[Any, Source]:
        """The symbols the code after the graph computes with, and where it reads them."""
        return {symbol: source for size in self.sizes.values() for symbol, source in size.symbols}

    def is_empty(self) -> bool:
        """No outputs and no work. Grad-mode switches alone are no work: the replacement
        code sets the mode the frame leaves with itself."""
        return not self.output_index and not any(
            (n.op == "call_function" and n.target is not torch_compat.set_grad_enabled)
            or n.op == "call_method"
            for n in self.gm.graph.nodes
        )


class OutputGraph:
    def __init__(self, guards: GuardSet, shapes: SymbolicShapes) -> None:
        self.graph = torch.fx.Graph()
        self.guards = guards
        self.shapes = shapes
        self._symbolic: dict[Source, torch.Tensor] = {}
        """The symbolic meta examples of tensor inputs with dynamic sizes."""
        self._inputs: dict[Source, GraphInput] = {}
        self._by_tensor: dict[int, GraphInput] = {}
        self._last_placeholder: torch.fx.Node | None = None
        self.submodules: dict[str, torch.fx.GraphModule] = {}
        """The bodies of higher-order ops (capture/subgraph.py), by attribute name."""
        self.inference_blocks: list[Block] = []
        """The `torch.inference_mode()` blocks open in the trace, outermost first."""

    def graph_input(self, source: Source, real: torch.Tensor) -> TensorValue:
        """The symbolic tensor for a tensor reached through `source` (a placeholder)."""
        if source in self._inputs:
            return self._inputs[source].value
        same = self._by_tensor.get(id(real))
        if same is not None:
            self.guards.add(GuardKind.SAME_OBJECT, source, same.source)
            return same.value
        self.shapes.observe(source, real)
        symbolic = self.shapes.tensor_example(source, real)
        if symbolic is None:
            fake = to_meta(real)
        else:
            fake, symbols = symbolic
            self._symbolic[source] = fake
            for new in symbols:
                self.symbol_input(new.source, new.value, new.hint)
        node = self._placeholder(source, fake)
        value = TensorValue(node, fake, real.device, source)
        value.python_cls = type(real)
        entry = GraphInput(source, node, real, value)
        self._inputs[source] = entry
        self._by_tensor[id(real)] = entry
        return value

    def symbol_input(self, source: Source, value: torch.SymInt, hint: int) -> None:
        """A size symbol as a graph input (`s0: "Sym(s0)"`), read from `source`."""
        node = self._placeholder(source, value, str(value.node.expr))
        self.shapes.placeholders[value.node.expr] = node
        self._inputs[source] = GraphInput(source, node, hint)

    def _placeholder(self, source: Source, example: Any, name: str | None = None) -> torch.fx.Node:
        if self._last_placeholder is None:
            first = next(iter(self.graph.nodes), None)
            ctx = self.graph.inserting_before(first)
        else:
            ctx = self.graph.inserting_after(self._last_placeholder)
        base = name or source.graph_name()
        name = base
        taken = {n.target for n in self.graph.nodes if n.op == "placeholder"}
        suffix = 1
        while name in taken:  # two sources may print alike (same-named closures)
            name, suffix = f"{base}{suffix}_", suffix + 1
        with ctx:
            node = self.graph.placeholder(name)
        self._last_placeholder = node
        node.meta["example_value"] = example
        node.meta["source"] = source.name()
        return node

    def guard_sizes(self) -> None:
        """Add the guards on size symbols: last, once the replacement code too has made
        what it needed a number (a size it could not output)."""
        for relation in self.shapes.relations():
            self.guards.add(GuardKind.SIZE_RELATION, None, relation)

    def size_arg(self, value: Any) -> Any:
        """A SymInt (or SymFloat/SymBool) as a node argument (see shapes.graph_arg)."""
        return self.shapes.graph_arg(value, self.graph)

    def create_node(self, kind: str, target: Any, args: tuple, kwargs: dict) -> torch.fx.Node:
        return self.graph.create_node(kind, target, args, kwargs)

    def erase_node(self, node: torch.fx.Node) -> None:
        if not node.users:
            self.graph.erase_node(node)

    def check_writes(self, written: list[TensorValue]) -> None:
        """An op wrote these tensors in place: always allowed here (a body refuses it for
        tensors from outside it, capture/subgraph.py)."""

    def harvest(self, outputs: list[TensorValue | ConstantValue]) -> Harvest:
        """Finish the graph: the tensors as a tuple of outputs, unused inputs dropped;
        symbolic numbers among the outputs are left to the code after the graph."""
        output_index: dict[torch.fx.Node, int] = {}
        sizes: dict[Any, PythonSize] = {}
        for value in outputs:
            if isinstance(value, ConstantValue):
                for number in _numbers(value.value):
                    size = self.shapes.in_python(number) if is_symbolic(number) else None
                    if size is not None:
                        sizes[number.node.expr] = size
                continue
            if value.node.op != "placeholder" and value.node not in output_index:
                output_index[value.node] = len(output_index)
        close_open_blocks(self)
        self.graph.output(tuple(output_index))
        inputs = []
        symbols = tuple(self.shapes.sources.items())
        for entry in self._inputs.values():
            # The guard stays even for an unused input: the trace may have read its shape.
            if entry.source in self._symbolic:
                example = self._symbolic[entry.source]
                expected = (entry.real, example, symbols)
                self.guards.add(GuardKind.SYMBOLIC_TENSOR, entry.source, expected)
            elif entry.value is not None:
                self.guards.add(GuardKind.TENSOR_MATCH, entry.source, entry.real)
            if entry.node.users:
                inputs.append(entry)
            else:
                self.graph.erase_node(entry.node)
        gm = torch.fx.GraphModule(module_with(self.submodules), self.graph)
        return Harvest(gm, inputs, output_index, sizes)


def _numbers(value: Any) -> tuple:
    return tuple(value) if type(value) in (tuple, torch.Size) else (value,)
