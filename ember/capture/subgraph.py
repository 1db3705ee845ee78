"""A function's body traced into a graph of its own, for higher-order ops (Dynamo's
speculate_subgraph): torch.utils.checkpoint, torch.cond, torch.func.vmap and grad.

While a body is traced, a `SubgraphOutput` stands in for the capture's OutputGraph: nodes go
to the body's own graph, and a tensor from outside it (an argument, a parameter, a closed-over
tensor) becomes a placeholder of the body the first time an op reads it ("lifted"); its
outer value is then an operand of the higher-order node. The body must not change anything
that lives outside it (the ledger's fence, and the tensors it lifted), must leave the grad
mode as it found it, and must return tensors (or tuples and lists of tensors and constants):
otherwise the op is refused with the reason, and the capture breaks at its call.

`trace_body` returns a `Body`; `emit_higher_order` puts the node into the enclosing graph and
rebuilds the body's result from the node's outputs.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from ember import torch_compat
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.containers import ListValue, TupleValue
from ember.capture.values.exceptions import TracedRaise
from ember.capture.values.tensor import TensorValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.output_graph import OutputGraph
    from ember.capture.sources import Source
    from ember.capture.translator import Translator


def add_submodule(out: Any, prefix: str, gm: fx.GraphModule) -> fx.Node:
    """Keep `gm` as a submodule of the graph `out` builds; returns its get_attr node."""
    index = sum(name.startswith(f"{prefix}_") for name in out.submodules)
    name = f"{prefix}_{index}"
    out.submodules[name] = gm
    return out.create_node("get_attr", name, (), {})


def module_with(submodules: dict[str, fx.GraphModule]) -> torch.nn.Module:
    """The root a GraphModule is built on: it holds the graph's bodies."""
    root = torch.nn.Module()
    for name, gm in submodules.items():
        root.add_module(name, gm)
    return root


class SubgraphOutput:
    """The graph of one body, in place of the OutputGraph while the body is traced."""

    def __init__(self, parent: OutputGraph | SubgraphOutput) -> None:
        self.parent = parent
        self.guards = parent.guards
        self.graph = fx.Graph()
        self.submodules: dict[str, fx.GraphModule] = {}
        self.arguments: list[fx.Node] = []
        """Outer nodes of the placeholders made by `argument`, in order (they come first)."""
        self.lifted: dict[fx.Node, fx.Node] = {}
        """Outer node -> the body's placeholder for it."""
        self._versions: dict[fx.Node, int] = {}
        self._last_placeholder: fx.Node | None = None

    @property
    def inference_blocks(self) -> list:
        """The capture's open inference-mode blocks: a body traced inside one runs in it."""
        return self.parent.inference_blocks

    def graph_input(self, source: Source, real: torch.Tensor) -> TensorValue:
        return self.parent.graph_input(source, real)  # an input of the whole capture

    def size_arg(self, value: Any) -> Any:
        """A symbolic size: computed outside, lifted into the body like a tensor."""
        return self.parent.size_arg(value)

    def _placeholder(self, name: str, example: torch.Tensor) -> fx.Node:
        taken = {n.target for n in self.graph.find_nodes(op="placeholder")}
        base, suffix = name, 1
        while name in taken:  # one outer tensor may be an argument and lifted too
            name, suffix = f"{base}_{suffix}", suffix + 1
        if self._last_placeholder is None:
            first = next(iter(self.graph.nodes), None)
            where = self.graph.inserting_before(first)
        else:
            where = self.graph.inserting_after(self._last_placeholder)
        with where:
            node = self.graph.placeholder(name)
        node.meta["example_value"] = example
        self._last_placeholder = node
        return node

    def argument(self, outer: TensorValue, example: torch.Tensor) -> TensorValue:
        """A placeholder for an argument the op passes by position (vmap and grad count
        their arguments), seen in the body with `example` (vmap: one sample of it)."""
        node = self._placeholder(outer.node.name, example)
        self.arguments.append(outer.node)
        self._versions[outer.node] = outer.example._version
        return TensorValue(node, example, outer.device)

    def lift(self, node: fx.Node) -> fx.Node:
        """The body's node for `node`: itself, or the placeholder of a node from outside."""
        if node.graph is self.graph:
            return node
        inner = self.lifted.get(node)
        if inner is None:
            example = node.meta.get("example_value")
            inner = self.lifted[node] = self._placeholder(node.name, example)
            if isinstance(example, torch.Tensor):
                self._versions[node] = example._version
        return inner

    def create_node(self, kind: str, target: Any, args: tuple, kwargs: dict) -> fx.Node:
        args = fx.node.map_arg(args, self.lift)
        kwargs = fx.node.map_arg(kwargs, self.lift)
        return self.graph.create_node(kind, target, args, kwargs)

    def erase_node(self, node: fx.Node) -> None:
        if not node.users:
            self.graph.erase_node(node)

    def check_writes(self, written: list[TensorValue]) -> None:
        """An op wrote these tensors in place: refused for a tensor from outside."""
        for value in written:
            if value.node.graph is not self.graph or value.node.op == "placeholder":
                raise _writes_outside(value.describe())

    def operands(self) -> list[fx.Node]:
        """The outer nodes the body's placeholders stand for, in placeholder order."""
        return [*self.arguments, *self.lifted]

    def check_no_outer_writes(self) -> None:
        """Writes through views (or before the op read the tensor) show in the version
        counters of the tensors lifted from outside."""
        for node, version in self._versions.items():
            example = node.meta.get("example_value")
            if isinstance(example, torch.Tensor) and example._version != version:
                raise _writes_outside(f"tensor {node.name}")


def _writes_outside(what: str) -> Unsupported:
    return Unsupported(
        BreakReason.SIDE_EFFECT,
        f"the body writes in place to {what}, which comes from outside it",
        hint="clone the tensor inside the function before changing it",
    )


@dataclass(frozen=True)
class Argument:
    """An argument the op passes to its function by position (vmap and grad count them):
    the body gets a placeholder for it, seen with `example` (vmap: one sample of the
    outer tensor), ahead of the placeholders of lifted tensors."""

    outer: TensorValue
    example: torch.Tensor


@dataclass
class Body:
    """A traced body: its graph, the outer nodes it takes, what it returned."""

    gm: fx.GraphModule
    operands: list[fx.Node]
    result: Value
    outputs: list[TensorValue]
    """The tensors of `result` that the body computes, each once, in output order."""


def _is_plain_sequence(value: Value) -> bool:
    if type(value) is TupleValue:
        return value.struct_type is None
    return type(value) is ListValue and value.list_type is list


def leaves_of(value: Value, what: str) -> list[Value]:
    if isinstance(value, TensorValue | ConstantValue):
        return [value]
    if _is_plain_sequence(value):
        return [leaf for item in value.items for leaf in leaves_of(item, what)]
    raise Unsupported(
        BreakReason.HIGHER_ORDER_OP,
        f"the function of {what} returns {value.describe()}; only tensors, constants and "
        "tuples or lists of them can come out of one graph node",
    )


def trace_body(
    tx: Translator,
    fn: Value,
    args: list[Value],
    kwargs: dict[str, Value],
    what: str,
) -> Body:
    """Trace `fn(*args, **kwargs)` into a graph of its own; `Argument`s among the args
    become the body's first placeholders, in order. The outputs are the tensors the body
    computes, each once (a tensor from outside that it returns is returned as it is)."""
    ctx = tx.ctx
    out = SubgraphOutput(ctx.out)
    args = [out.argument(a.outer, a.example) if isinstance(a, Argument) else a for a in args]
    grad_mode = torch.is_grad_enabled()
    ctx.out = out
    try:
        with ctx.effects.fence(what):
            result = fn.call(tx, args, kwargs)
        out.check_no_outer_writes()
        if torch.is_grad_enabled() != grad_mode:
            raise Unsupported(
                BreakReason.SIDE_EFFECT, f"the function of {what} changes the grad mode"
            )
        leaves = leaves_of(result, what)
    except Unsupported as exc:
        raise _refused(what, exc) from exc
    except TracedRaise as exc:  # as under Dynamo: CPython raises it, at a break before
        raised = Unsupported(BreakReason.EXCEPTION_RAISED, f"{exc.value.describe()} raised")
        raise _refused(what, raised) from exc
    finally:
        ctx.out = out.parent
        torch_compat.set_grad_enabled(grad_mode)
    outputs: list[TensorValue] = []
    for leaf in leaves:
        if isinstance(leaf, TensorValue) and leaf.node.graph is out.graph:
            if all(leaf is not o for o in outputs):
                outputs.append(leaf)
    node = out.graph.output(tuple(o.node for o in outputs))
    node.meta["example_value"] = tuple(o.example for o in outputs)
    gm = fx.GraphModule(module_with(out.submodules), out.graph)
    return Body(gm, out.operands(), result, outputs)


def _refused(what: str, exc: Unsupported) -> Unsupported:
    """The body's own reason, as the reason the higher-order op cannot be one node."""
    where = f" (at {exc.location})" if exc.location else ""
    refused = Unsupported(
        BreakReason.HIGHER_ORDER_OP,
        f"{what} cannot be captured as one graph node: {exc.reason.value}: {exc.detail}{where}",
        hint=exc.hint or "the call runs in Python instead, at a graph break",
    )
    refused.user_stack = list(exc.user_stack)
    return refused


def align_operands(bodies: list[Body]) -> list[fx.Node]:
    """One operand list for bodies that the op calls alike (cond's branches): every body
    gets a placeholder for each operand, in the same order."""
    operands: list[fx.Node] = []
    for body in bodies:
        operands += [o for o in body.operands if o not in operands]
    for body in bodies:
        graph = body.gm.graph
        placeholders = dict(zip(body.operands, graph.find_nodes(op="placeholder")))
        first = next(iter(graph.nodes))
        for outer in operands:
            if outer not in placeholders:
                with graph.inserting_before(first):
                    placeholders[outer] = graph.placeholder(outer.name)
                placeholders[outer].meta["example_value"] = outer.meta.get("example_value")
        previous = None
        for outer in operands:
            node = placeholders[outer]
            if previous is None:
                first = next(iter(graph.nodes))
                if node is not first:
                    first.prepend(node)
            else:
                previous.append(node)
            previous = node
        body.operands = list(operands)
        body.gm.recompile()
    return operands


def emit_higher_order(
    tx: Translator,
    target: Any,
    args: tuple,
    kwargs: dict,
    examples: list[torch.Tensor],
    devices: list[torch.device],
) -> list[TensorValue]:
    """The op's node in the enclosing graph and one value per output (getitem nodes)."""
    out = tx.ctx.out
    node = out.create_node("call_function", target, args, kwargs)
    node.meta["example_value"] = tuple(examples)
    results = []
    for i, (example, device) in enumerate(zip(examples, devices, strict=True)):
        item = out.create_node("call_function", operator.getitem, (node, i), {})
        item.meta["example_value"] = example
        results.append(TensorValue(item, example, device))
    return results


def rebuild_result(value: Value, replace: dict[int, Value]) -> Value:
    """The body's result with each of its computed tensors replaced (by id)."""
    if _is_plain_sequence(value):
        items = [rebuild_result(v, replace) for v in value.items]
        return TupleValue(items) if type(value) is TupleValue else ListValue(items)
    return replace.get(id(value), value)
