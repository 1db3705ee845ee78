"""From a torch-level GraphModule to a traced program: flat tensor inputs, outputs, mutations.

A backend receives `gm(*example_inputs)`. Parameters and buffers that the gm reads through
attributes (fx.symbolic_trace keeps them there; Dynamo usually passes them as inputs) are
*lifted*: they become trailing graph inputs, fetched from the module on every call so that an
optimizer step or a buffer update is seen. Ints among the inputs are specialized constants.

`Program` records how the traced aten graph's outputs map back to what the gm returns:
an output is a graph value, a view of an input regenerated at run time (so it aliases the
caller's tensor as in eager), or a Python constant; mutated inputs' final values are extra
trailing graph outputs that the runtime copies back.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from ember import torch_compat
from ember.aot.functionalize import ViewStep
from ember.aot.higher_order import run_graph
from ember.aot.symbolic import SizeBinder, is_symbolic, meta_like, symbolic_tensor
from ember.aot.trace import TraceError, Tracer, check_functional
from ember.errors import BreakReason
from ember.torch_compat import without_dynamo


@dataclass(frozen=True, slots=True)
class StateRef:
    """A parameter or buffer of the gm (or a submodule), lifted to a graph input."""

    module: torch.nn.Module
    name: str
    is_param: bool

    def get(self) -> torch.Tensor:
        table = self.module._parameters if self.is_param else self.module._buffers
        return table[self.name]

    def set(self, value: torch.Tensor) -> None:
        table = self.module._parameters if self.is_param else self.module._buffers
        table[self.name] = value  # bypasses nn.Module's type checks on purpose


def lift_state(gm: torch.nn.Module) -> list[StateRef]:
    """Every parameter and buffer reachable from `gm`, each once (shared ones deduplicated)."""
    refs: list[StateRef] = []
    seen: set[int] = set()
    for mod in gm.modules():
        for is_param, table in ((True, mod._parameters), (False, mod._buffers)):
            for name, t in table.items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                refs.append(StateRef(mod, name, is_param))
    return refs


@contextlib.contextmanager
def swapped_state(refs: Sequence[StateRef], values: Sequence[torch.Tensor]) -> Iterator[None]:
    """Temporarily make the module hold `values` (fakes) instead of its real tensors."""
    saved = [r.get() for r in refs]
    # shared tensors appear once in refs but may sit in several modules: swap by identity
    by_id = {id(s): v for s, v in zip(saved, values, strict=True)}
    touched: list[tuple[dict, str, torch.Tensor]] = []
    roots = {id(r.module): r.module for r in refs}
    try:
        for mod in roots.values():
            for sub in mod.modules():
                for table in (sub._parameters, sub._buffers):
                    for name, t in list(table.items()):
                        if t is not None and id(t) in by_id:
                            touched.append((table, name, t))
                            table[name] = by_id[id(t)]
        yield
    finally:
        for table, name, t in touched:
            table[name] = t


class OutKind(enum.Enum):
    GRAPH = "graph"  # the index-th graph output
    GRAPH_VIEW = "graph_view"  # a view of the index-th graph output, replayed at run time
    INPUT_VIEW = "input_view"  # a view of flat input `index`, replayed at run time
    CONSTANT = "constant"  # a Python value


@dataclass(frozen=True, slots=True)
class OutputSpec:
    kind: OutKind
    index: int = 0
    chain: tuple[ViewStep, ...] = ()
    value: Any = None


@dataclass
class Program:
    """A traced functional aten graph plus the bookkeeping to call it like the gm."""

    gm: fx.GraphModule
    arg_kinds: list[str]  # per gm input: "tensor" or "int"
    int_values: tuple[Any, ...]  # specialized non-tensor inputs
    state: list[StateRef]
    specs: list[OutputSpec]
    out_tree: TreeSpec
    mutated: list[int]  # flat input indices whose final value trails the graph outputs
    num_graph_outputs: int  # user-visible graph outputs (before mutations)
    extra: dict[str, Any] = field(default_factory=dict)
    uneven_bumps: list[tuple[int, int]] = field(default_factory=list)
    """(flat input index, how far eager's in-place ops move its version counter) for the
    mutated inputs whose counter does not move by exactly the copy-back's one (several
    in-place ops; none through `.data`, whose counter is its own)."""

    @property
    def device(self) -> torch.device:
        return self.extra.get("device", torch.device("cpu"))

    def flat_inputs(self, args: Sequence[Any]) -> list[Any]:
        """The compiled graph's inputs: tensors and symbolic sizes in order, then state."""
        flat = [a for a, k in zip(args, self.arg_kinds, strict=True) if k != "int"]
        return flat + [r.get() for r in self.state]


def split_args(args: Sequence[Any]) -> tuple[list[str], tuple[Any, ...]]:
    """Which gm inputs are tensors, symbolic ints (a size the graph takes as an input, passed
    on to the compiled graph) or other values (specialized: part of the cache key)."""
    kinds: list[str] = []
    ints: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            kinds.append("tensor")
        elif isinstance(a, torch.SymInt):
            kinds.append("sym")
        elif isinstance(a, torch.SymFloat | torch.SymBool):
            raise TraceError(
                BreakReason.UNSUPPORTED_OBJECT,
                "a symbolic float or bool reached ember's aot tracer",
                hint="compile with dynamic=False, or keep float inputs constant",
            )
        else:
            kinds.append("int")
            ints.append(a)
    return kinds, tuple(ints)


def backend_examples(gm: fx.GraphModule, flat: list[Any]) -> list[Any]:
    """What a backend gets as example inputs for a traced graph of the flat inputs: the real
    inputs, symbolic sizes as their SymInts (the placeholders hold the symbolic layouts)."""
    vals = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    return [v if isinstance(v, torch.SymInt) else f for v, f in zip(vals, flat, strict=True)]


def check_input_aliasing(flat: Sequence[torch.Tensor], mutated: Sequence[int]) -> None:
    """A mutated input sharing memory with another input would need the two functionalized
    together; refuse that clearly (aliasing among inputs that are only read is harmless).
    Runs on every call, so it is one pass over the inputs (a conv net's training graph has
    ~150 mutated running statistics among ~300 inputs: comparing pairs cost 5 ms a call)."""
    if not mutated:
        return
    if _distinct_storages(flat, mutated):
        return
    ptrs = [
        t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) and t.numel() else -1 - i
        for i, t in enumerate(flat)
    ]
    writer: dict[int, int] = {}
    for i in mutated:
        other = writer.setdefault(ptrs[i], i)
        if other != i:
            _refuse_alias(i, other)
    for j, p in enumerate(ptrs):
        i = writer.get(p, j)
        if i != j:
            _refuse_alias(i, j)


def _distinct_storages(flat: Sequence[Any], mutated: Sequence[int]) -> bool:
    """The common case of `check_input_aliasing`, in C-level passes: every mutated input
    has a storage (StorageImpl) that no other input has. False where that is not so, or
    where an input is not a tensor: the exact check then decides (it also lets an empty
    tensor share a storage). Half the exact check's time for MobileNetV2's 316 inputs,
    156 of them mutated (150 -> 80 us a step)."""
    try:
        where = list(map(torch_compat.storage_address, flat))
    except TypeError:  # a symbolic size among the inputs
        return False
    written = {where[i] for i in mutated}
    return len(written) == len(mutated) and sum(map(written.__contains__, where)) == len(mutated)


def _refuse_alias(i: int, j: int) -> None:
    raise TraceError(
        BreakReason.SIDE_EFFECT,
        f"input {i} of the compiled graph is mutated and shares memory with input {j}",
        hint="pass tensors that do not alias each other (clone one of them)",
    )


def devices_of(args: Sequence[Any], state: Sequence[Any]) -> set[torch.device]:
    """Where a graph's tensor inputs and lifted state live. 0-dim CPU tensors do not count:
    eager lets such scalars take part in ops on any device (x_cuda * torch.tensor(2.0))."""
    real = [a for a in args if isinstance(a, torch.Tensor)] + [r.get() for r in state]
    return {t.device for t in real if t.device.type != "cpu" or t.dim() > 0}


def begin(
    gm: torch.nn.Module, args: Sequence[Any], symbolic: Sequence[Any] | None = None
) -> tuple[Tracer, Program, list, list]:
    """Set up a tracer with one placeholder per flat input; returns fakes for gm's args.
    `symbolic` (per arg, see symbolic.symbolic_inputs) gives the symbolic stand-ins of a
    dynamic graph's inputs: their fakes get symbolic sizes and SymInt inputs placeholders."""
    kinds, ints = split_args(symbolic_args(args, symbolic))
    state = lift_state(gm)
    devices = devices_of(args, state)
    if len(devices) > 1:
        raise TraceError(
            BreakReason.UNSUPPORTED_OBJECT,
            f"the compiled graph's inputs live on several devices: {sorted(map(str, devices))}",
            hint="move the inputs to one device before the compiled region",
        )
    tracer = Tracer(devices.pop() if devices else None)
    stand_ins = list(symbolic) if symbolic is not None else [None] * len(args)
    fakes: list[Any] = []
    for a, kind, s in zip(args, kinds, stand_ins, strict=True):
        if kind == "sym":
            fakes.append(s if s is not None else a)
        elif kind == "tensor":
            fakes.append(meta_like(s, a.requires_grad) if s is not None else tracer.to_fake(a))
    fakes += [tracer.to_fake(r.get()) for r in state]
    for i, f in enumerate(fakes):
        tracer.placeholder(f"primals_{i + 1}", f)
    it = iter(fakes)
    call_args = [next(it) if k != "int" else a for a, k in zip(args, kinds, strict=True)]
    program = Program(
        gm=None,  # type: ignore[arg-type]
        arg_kinds=kinds,
        int_values=ints,
        state=state,
        specs=[],
        out_tree=None,  # type: ignore[arg-type]
        mutated=[],
        num_graph_outputs=0,
    )
    program.extra["device"] = tracer.device
    if any(is_symbolic(f) or symbolic_tensor(f) for f in fakes):
        program.extra["sizes"] = SizeBinder(fakes)
    return tracer, program, fakes, call_args


def check_symbolic_floats(gm: torch.nn.Module, symbolic: Sequence[Any] | None) -> None:
    """Refuse, naming the node, a graph that computes a float from symbolic sizes (Dynamo's
    `d ** -0.5` when the model width d is dynamic): ember traces integer sizes only."""
    if symbolic is None or not isinstance(gm, fx.GraphModule):
        return
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.SymFloat) and not value.node.expr.is_number:
            raise TraceError(
                BreakReason.UNSUPPORTED_OBJECT,
                f"the graph computes a symbolic float ({node.format_node()}), which ember's "
                "aot stage does not trace",
                hint="let only the sizes that vary be dynamic (dynamic=None, or "
                "torch._dynamo.mark_dynamic on the batch/sequence dims)",
            )


def symbolic_args(args: Sequence[Any], symbolic: Sequence[Any] | None) -> list[Any]:
    """The args with symbolic int inputs as their SymInts (the runtime passes plain ints)."""
    if symbolic is None:
        return list(args)
    return [s if isinstance(s, torch.SymInt) else a for a, s in zip(args, symbolic, strict=True)]


def _output_spec(
    tracer: Tracer, leaf: Any, fakes: list, graph_outs: list[torch.Tensor]
) -> OutputSpec:
    """How one returned value is rebuilt. Views are replayed on their base at run time (the
    caller's input, or an intermediate the graph returns), so they alias and stride as in
    eager; one tensor returned twice is one graph output."""
    if is_symbolic(leaf):
        raise TraceError(
            BreakReason.UNSUPPORTED_OBJECT,
            "the compiled graph returns a symbolic size",
            hint="return tensors (or compile with dynamic=False)",
        )
    if isinstance(leaf, torch.Tensor) and leaf.is_meta and not tracer.aliases.known(leaf):
        raise TraceError(
            BreakReason.TENSOR_OP_FAILED,
            "the compiled graph returns a tensor made on the meta device outside any traced op",
        )
    if not isinstance(leaf, torch.Tensor) or not tracer.aliases.known(leaf):
        return OutputSpec(OutKind.CONSTANT, value=leaf)  # incl. the gm's own tensors as-is
    root = tracer.aliases.root_of(leaf)
    chain = tuple(tracer.aliases.view_chain(leaf))
    for i, f in enumerate(fakes):
        if id(f) == root:
            return OutputSpec(OutKind.INPUT_VIEW, i, chain)
    base = tracer.aliases.tensors[root]
    k = next((k for k, g in enumerate(graph_outs) if g is base), None)
    if k is None:
        k = len(graph_outs)
        graph_outs.append(base)
    return OutputSpec(OutKind.GRAPH_VIEW if chain else OutKind.GRAPH, k, chain)


def _version(t: Any) -> int:
    """A tensor's version counter (an inference tensor has none, nor does a non-tensor)."""
    return t._version if isinstance(t, torch.Tensor) and not t.is_inference() else 0


def run_forward(
    tracer: Tracer, program: Program, gm: torch.nn.Module, fakes: list, call_args: list
) -> list[torch.Tensor]:
    """Trace gm's forward; fill the output specs; returns the graph's user outputs (fakes)."""
    n_user = len(fakes) - len(program.state)
    versions = [_version(f) for f in fakes]
    with swapped_state(program.state, fakes[n_user:]), tracer.recording():
        result = run_graph(gm, call_args, tracer)
    leaves, program.out_tree = tree_flatten(result)
    graph_outs: list[torch.Tensor] = []
    program.specs = [_output_spec(tracer, leaf, fakes, graph_outs) for leaf in leaves]
    program.extra["symbolic_views"] = any(
        is_symbolic(a) for spec in program.specs for step in spec.chain for a in _flat_args(step)
    )
    program.num_graph_outputs = len(graph_outs)
    mutated_roots = set(tracer.aliases.mutated_roots())
    if mutated_roots & {id(c) for c in tracer._const_ids.values()}:
        raise TraceError(
            BreakReason.SIDE_EFFECT,
            "the compiled graph mutates a tensor constant it captured",
            hint="register the tensor as a buffer or pass it as an input",
        )
    program.mutated = [i for i, f in enumerate(fakes) if id(f) in mutated_roots]
    bumps = [(i, _version(fakes[i]) - versions[i]) for i in program.mutated]
    program.uneven_bumps = [(i, b) for i, b in bumps if b != 1]
    return graph_outs


def _flat_args(step: ViewStep) -> list[Any]:
    out: list[Any] = []
    for a in step.args:
        out.extend(a if isinstance(a, list | tuple) else [a])
    return out


def trace_inference(
    gm: torch.nn.Module, args: Sequence[Any], symbolic: Sequence[Any] | None = None
) -> Program:
    """Trace gm(*args) with grad off into one functional graph (outputs + mutated inputs)."""
    return without_dynamo(_trace_inference, gm, args, symbolic)


def _trace_inference(
    gm: torch.nn.Module, args: Sequence[Any], symbolic: Sequence[Any] | None
) -> Program:
    check_symbolic_floats(gm, symbolic)
    tracer, program, fakes, call_args = begin(gm, args, symbolic)
    with torch.no_grad():
        graph_outs = run_forward(tracer, program, gm, fakes, call_args)
    finals = [fakes[i] for i in program.mutated]
    program.gm = tracer.finish(graph_outs + finals)
    check_functional(program.gm.graph)
    note_mutations(program.gm, program, len(graph_outs) + len(finals))
    return program


def build_outputs(program: Program, flat: Sequence[torch.Tensor], outs: Sequence[Any]) -> Any:
    """What the gm returns: graph values, views replayed on the real inputs, constants."""
    leaves: list[Any] = []
    binder = program.extra.get("sizes")
    env = binder.bind(flat) if binder is not None and program.extra.get("symbolic_views") else {}
    for spec in program.specs:
        if spec.kind is OutKind.GRAPH:
            leaves.append(outs[spec.index])
        elif spec.kind is OutKind.CONSTANT:
            leaves.append(spec.value)
        else:
            t = flat[spec.index] if spec.kind is OutKind.INPUT_VIEW else outs[spec.index]
            for step in spec.chain:
                args = binder.resolve(step.args, env) if env else step.args
                t = step.func(t, *args, **step.kwargs)
                if step.index is not None:
                    t = t[step.index]
            leaves.append(t)
    return tree_unflatten(leaves, program.out_tree)


def is_plain_tuple(program: Program) -> bool:
    """True when the gm returns exactly the graph's outputs, in order, as a flat tuple."""
    n = len(program.specs)
    return (
        program.out_tree == tree_flatten(tuple(range(n)))[1]
        and all(s.kind is OutKind.GRAPH and s.index == i for i, s in enumerate(program.specs))
        and program.num_graph_outputs == n
    )


MUTATIONS_META = "ember_input_mutations"
"""Key of `gm.meta` holding a compiled graph's (output index, input index) pairs: which
outputs are mutated inputs' final values (see `note_mutations`)."""


def note_mutations(gm: fx.GraphModule, program: Program, num_outputs: int) -> None:
    """Note on `gm` which of its outputs are the mutated inputs' final values (the last
    len(mutated) of its first `num_outputs`), for ember's backend: it may write such a value
    straight into the input's storage (a batch norm's running statistics), and
    `apply_mutations` then has nothing to copy. Other backends ignore the note."""
    base = num_outputs - len(program.mutated)
    gm.meta[MUTATIONS_META] = tuple((base + j, i) for j, i in enumerate(program.mutated))


def apply_mutations(program: Program, flat: Sequence[torch.Tensor], outs: Sequence[Any]) -> None:
    """Copy mutated inputs' final values back into the caller's tensors, as eager left them
    (a value the compiled graph already wrote into the input's storage needs no copy)."""
    if not program.mutated:
        return
    base = len(outs) - len(program.mutated)
    # the copy moves a version counter by one; an input that outer autograd saved must
    # fail its version check as in eager: no sooner (a `.data` write), no later (several
    # in-place ops). Inference tensors have no counter.
    uneven = [
        (flat[i], flat[i]._version + b)
        for i, b in program.uneven_bumps
        if not flat[i].is_inference()
    ]
    in_place = []
    with torch.no_grad():
        for j, i in enumerate(program.mutated):
            new, t = outs[base + j], flat[i]
            if new is t or (new.numel() and new.data_ptr() == t.data_ptr()):
                in_place.append(t)
            else:
                t.copy_(new)
    bump = [t for t in in_place if not t.is_inference()]
    if bump:  # as the copy would have
        torch.autograd.graph.increment_version(bump)
    if uneven:
        torch_compat.set_version_counters(*map(list, zip(*uneven, strict=True)))
