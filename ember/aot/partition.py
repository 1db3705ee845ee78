"""Split a joint forward+backward graph into a forward graph and a backward graph.

Input: the joint GraphModule of joint.py, (primals..., tangents...) -> (forward outputs...,
gradients...). Output: `Partition`: forward = primals -> (forward outputs..., saved...),
backward = (saved..., tangents...) -> gradients.

Which values cross from forward to backward ("saved") decides the activation memory of
training. Two policies:

- naive: save every tangent-independent value that a tangent-dependent node reads;
- min-cut rematerialization (the default): a max-flow/min-cut over the tangent-independent
  part of the graph, where cutting a node costs the bytes of its value. Cheap ops (pointwise,
  views, fills) may be recomputed in the backward from what is saved; expensive ones
  (matmul, convolution, reductions) and random ones never are (a random op recomputed would
  draw a different mask), so their values are saved when the backward needs them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
import torch.fx as fx

from ember import logs, torch_compat
from ember.aot.functionalize import is_view_op
from ember.aot.schedule import (
    MIN_SPLIT_GAIN,
    BackwardSplit,
    peak_bytes,
    reorder_for_memory,
    split_backward,
)
from ember.aot.symbolic import is_symbolic, numel_hint, symbolic_tensor

aten = torch.ops.aten

# ops that are not tagged pointwise but are as cheap to recompute as to load
_CHEAP = {
    aten.empty_like.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.full_like.default,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_empty.default,
    aten.full.default,
    aten.zeros.default,
    aten.ones.default,
    aten.empty.memory_format,
    aten.scalar_tensor.default,
    aten._to_copy.default,
    aten.copy.default,
    aten.expand.default,
}


@dataclass
class Partition:
    """Forward and backward graphs and what the forward saves for the backward."""

    forward: fx.GraphModule
    backward: fx.GraphModule
    saved: list[str]  # node names, in the order they trail the forward's outputs
    saved_bytes: int
    naive_saved_bytes: int
    split: BackwardSplit | None = None  # the backward as two autograd nodes, when that helps


def _nbytes(node: fx.Node) -> float:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return float(numel_hint(val) * val.element_size())  # a symbolic size counts its hint
    if isinstance(val, torch.SymInt):
        return 8.0  # a size the backward needs (saved as a Python int)
    return math.inf  # tuples are never saved whole: their items are


def _is_view_call(node: object) -> bool:
    t = getattr(node, "target", None)
    return isinstance(t, torch_compat.OpOverload) and is_view_op(t)


def _storage_root(node: fx.Node) -> fx.Node:
    """The node whose storage a view (chain) keeps alive."""
    while node.op == "call_function":
        if node.target is operator.getitem and _is_view_call(node.args[0]):
            node = node.args[0].args[0]  # type: ignore[union-attr,assignment]
        elif _is_view_call(node):
            node = node.args[0]  # type: ignore[assignment]
        else:
            return node
    return node


def storage_bytes(nodes: Iterable[fx.Node]) -> int:
    """Bytes kept alive by saving these values: views count their base, each base once."""
    return int(sum(_nbytes(r) for r in {_storage_root(n) for n in nodes}))


def _is_size(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.SymInt)


def is_symbolic_graph(graph: fx.Graph) -> bool:
    """Whether a traced graph has symbolic sizes (SymInt or symbolically sized inputs)."""
    return any(
        symbolic_tensor(v) or is_symbolic(v)
        for v in (n.meta.get("val") for n in graph.find_nodes(op="placeholder"))
    )


def _is_random(node: fx.Node) -> bool:
    t = node.target
    return isinstance(t, torch_compat.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags


def recomputable(node: fx.Node) -> bool:
    """May the backward compute this value again instead of loading it? Any op of a
    checkpointed region may (the user asked for it), but a random one."""
    if node.op == "get_attr":
        return True
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return recomputable(node.args[0])  # type: ignore[arg-type]
    t = node.target
    if not isinstance(t, torch_compat.OpOverload) or _is_random(node):
        return False
    if _region(node) is not None:
        return True
    return torch.Tag.pointwise in t.tags or is_view_op(t) or t in _CHEAP


def _region(node: fx.Node) -> int | None:
    """The checkpointed region that recorded the node (aot/higher_order.py), if any."""
    return node.meta.get("recompute_region")


def _ancestors(roots: Iterable[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [r for r in roots if isinstance(r, fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


class _Analysis:
    """Which nodes the forward outputs need, which the gradients need, which see tangents."""

    def __init__(
        self,
        joint: fx.GraphModule,
        num_primals: int,
        num_fwd_outputs: int,
        mutated: Sequence[int] = (),
    ) -> None:
        self.graph = joint.graph
        self.placeholders = list(self.graph.find_nodes(op="placeholder"))
        self.primals = self.placeholders[:num_primals]
        # the runtime copies a mutated input's new value into it before the backward runs:
        # saved, it (or a view of it) would hold the new value, not the one the backward read
        self.overwritten = {self.primals[i] for i in mutated}
        self.tangents = self.placeholders[num_primals:]
        out = next(iter(self.graph.find_nodes(op="output")))
        outs = list(out.args[0])
        self.fwd_outs = outs[:num_fwd_outputs]
        self.grads = outs[num_fwd_outputs:]
        self.tangent_dep: set[fx.Node] = set(self.tangents)
        for n in self.graph.nodes:
            if any(i in self.tangent_dep for i in n.all_input_nodes):
                self.tangent_dep.add(n)
        self.fw_required = _ancestors(self.fwd_outs)
        self.bw_required = _ancestors(self.grads)
        self.grad_set = {g for g in self.grads if isinstance(g, fx.Node)}
        self.fwd_out_set = {o for o in self.fwd_outs if isinstance(o, fx.Node)}
        self.has_regions = any(_region(n) is not None for n in self.graph.nodes)

    def leaves_region(self, n: fx.Node) -> bool:
        """A value of a checkpointed region that the rest of the forward reads (or returns):
        saved when the backward needs it, as eager's checkpoint keeps it (recomputing it
        would recompute every region before it, from the first one's input)."""
        region = _region(n)
        return region is not None and (
            n in self.fwd_out_set
            or any(u in self.fw_required and _region(u) != region for u in n.users)
        )

    def must_recompute(self, n: fx.Node) -> bool:
        """A value inside a checkpointed region that nothing after the region reads in the
        forward: the backward computes it again, never loads it."""
        return _region(n) is not None and recomputable(n) and not self.leaves_region(n)

    def bw_readers(self, n: fx.Node) -> bool:
        """True when a backward node (or a gradient output) reads n directly."""
        if n in self.grad_set:
            return True
        return any(u in self.tangent_dep and u in self.bw_required for u in n.users)

    def naive_saved(self) -> list[fx.Node]:
        return [
            n
            for n in self.graph.nodes
            if n in self.bw_required and n not in self.tangent_dep and self.bw_readers(n)
        ]

    def min_cut_saved(self) -> list[fx.Node]:
        """Max-flow/min-cut: the cheapest set of values from which the backward can go on."""
        g = nx.DiGraph()
        candidates = [
            n for n in self.graph.nodes if n in self.bw_required and n not in self.tangent_dep
        ]
        for n in candidates:
            # saving a view keeps its whole base alive; a multi-output node (split's list,
            # a fused kernel's tuple) is never saved whole, only its items
            cost = _nbytes(n)
            if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor):
                cost = _nbytes(_storage_root(n))
            if self.must_recompute(n) or _storage_root(n) in self.overwritten:
                cost = math.inf
            g.add_edge(f"{n.name}_in", f"{n.name}_out", capacity=cost)
            must_run_forward = n.op == "placeholder" or _is_random(n) or self.leaves_region(n)
            if not recomputable(n) and (n in self.fw_required or n.op != "call_function"):
                must_run_forward = True
            if n.target is operator.getitem and not recomputable(n):
                must_run_forward = True
            if must_run_forward:
                g.add_edge("source", f"{n.name}_in", capacity=math.inf)
            if self.bw_readers(n):
                g.add_edge(f"{n.name}_out", "sink", capacity=math.inf)
            for u in n.users:
                if u in self.bw_required and u not in self.tangent_dep:
                    g.add_edge(f"{n.name}_out", f"{u.name}_in", capacity=math.inf)
        if "sink" not in g or "source" not in g:
            return self.naive_saved()
        _, (reachable, _unreachable) = nx.minimum_cut(g, "source", "sink")
        return [
            n
            for n in candidates
            if f"{n.name}_in" in reachable and f"{n.name}_out" not in reachable
        ]


def _extract(
    joint: fx.GraphModule,
    keep: set[fx.Node],
    inputs: list[fx.Node],
    outputs: list,
    lazy: frozenset[fx.Node] = frozenset(),
    as_module: bool = True,
) -> fx.GraphModule | fx.Graph:
    """A new graph computing `outputs` from `inputs` with the kept nodes, in joint order;
    `lazy` nodes (recomputations) are placed just before their first user, so a recomputed
    activation is not alive for the whole backward."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        p = graph.placeholder(n.name)
        p.meta = dict(n.meta)
        env[n] = p

    def emit(n: fx.Node) -> None:
        stack = [n]
        while stack:
            top = stack[-1]
            missing = [i for i in top.all_input_nodes if i not in env]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            if top not in env:
                env[top] = graph.node_copy(top, lambda x: env[x])

    for n in joint.graph.nodes:
        if n in keep and n not in env and n not in lazy and n.op not in ("placeholder", "output"):
            emit(n)
    for o in outputs:
        if isinstance(o, fx.Node) and o not in env:
            emit(o)
    result = tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs)
    out = graph.output(result)
    out.meta["val"] = tuple(r.meta.get("val") if isinstance(r, fx.Node) else r for r in result)
    graph.eliminate_dead_code()
    return fx.GraphModule(joint, graph) if as_module else graph


def _needed(outputs: Iterable, available: set[fx.Node]) -> set[fx.Node]:
    """Nodes needed for outputs when `available` nodes are inputs (search stops there)."""
    seen: set[fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in available:
            continue
        if n.op == "placeholder":
            raise AssertionError(f"partition: backward needs unsaved primal {n.name}")
        stack.extend(n.all_input_nodes)
    return seen


def _split(
    joint: fx.GraphModule, a: _Analysis, saved: list[fx.Node], as_module: bool = True
) -> tuple[Any, Any, list[fx.Node]]:
    """Forward and (memory-ordered) backward graphs for a saved set; saved values the
    backward no longer reads are dropped (the third result is the saved list kept).
    `as_module=False` gives bare fx.Graphs (no code generation: trials only estimate)."""
    available = set(saved) | set(a.tangents)
    bwd_keep = _needed(a.grads, available)
    # sizes last: the runtime keeps them apart from the tensors autograd saves
    saved = [n for n in saved if n in bwd_keep]
    saved = [n for n in saved if not _is_size(n)] + [n for n in saved if _is_size(n)]
    fwd_keep = _ancestors(a.fwd_outs + saved)
    forward = _extract(joint, fwd_keep, a.primals, a.fwd_outs + saved, as_module=as_module)
    recomputed = frozenset(n for n in bwd_keep if n not in a.tangent_dep)
    backward = _extract(
        joint, bwd_keep, saved + a.tangents, a.grads, recomputed, as_module=as_module
    )
    # tangents stay alive in autograd's engine, inputs (and views of them) in the caller:
    # neither is released
    pinned = _of_inputs(saved) | {n.name for n in a.tangents}
    lazy = frozenset(n.name for n in recomputed) if a.has_regions else frozenset()
    return forward, reorder_for_memory(backward, pinned, lazy), saved


def _of_inputs(saved: list[fx.Node]) -> set[str]:
    """Saved values that are graph inputs or views of them (parameters, W.t()): the caller
    keeps their storage, so the backward neither holds nor frees their bytes."""
    return {n.name for n in saved if _storage_root(n).op == "placeholder"}


def _backward_peak(a: _Analysis, backward: Any, saved: list[fx.Node]) -> int:
    inputs = _of_inputs(saved)
    pinned = inputs | {n.name for n in a.tangents}
    resident = {n.name for n in saved if n.name not in inputs} | {n.name for n in a.tangents}
    return peak_bytes(backward, pinned, resident)


def _step_peak(a: _Analysis, forward: Any, backward: Any, saved: list[fx.Node]) -> int:
    """Estimated peak bytes of a training step with these graphs: the forward's peak (its
    outputs and saved values retained) or the backward's (saved values and tangents live at
    its start, each freed after its last use), whichever is higher."""
    return max(peak_bytes(forward, set(), set()), _backward_peak(a, backward, saved))


# pointwise ops whose recomputation costs real arithmetic (a transcendental per element),
# unlike adds and multiplies that fuse into their consumer for free
_COSTLY = {
    getattr(aten, name).default
    for name in (
        "gelu erf erfc exp exp2 expm1 log log1p log2 log10 tanh sigmoid silu mish softplus "
        "elu sin cos tan asin acos atan sinh cosh erfinv lgamma digamma"
    ).split()
    if hasattr(aten, name)
}
MAX_SAVE_TRIALS = 8
# below this a recomputation costs microseconds: not worth a trial (each is a re-split)
MIN_SAVE_BYTES = 1 << 18


def _save_free_recomputations(
    joint: fx.GraphModule, a: _Analysis, saved: list[fx.Node]
) -> tuple[fx.GraphModule, fx.GraphModule, list[fx.Node]]:
    """Min-cut minimizes saved bytes, but a saved byte only costs memory if it raises the
    step's peak. When the peak is set elsewhere (an MLP's peak is its last weight-gradient
    GEMM, where the saved activations are already freed), recomputing a GELU in the
    backward buys nothing and costs a pass of erf over the activation. So each costly
    recomputation (largest first) is tried as a saved value instead, and kept saved when the
    estimated step peak does not grow. The splits are bare graphs (no code generation); the
    chosen one becomes the two modules, so a large graph is not split once more at the end."""
    best = _split(joint, a, saved, as_module=False)
    forward, backward, saved = best
    peak = _step_peak(a, forward, backward, saved)
    names = {n.name: n for n in joint.graph.nodes}
    recomputed = [
        names[n.name]
        for n in backward.nodes
        if n.op == "call_function" and n.target in _COSTLY and n.name in names
    ]
    recomputed = [
        n
        for n in recomputed
        if n not in a.tangent_dep and _nbytes(n) >= MIN_SAVE_BYTES and _region(n) is None
    ]
    recomputed.sort(key=_nbytes, reverse=True)
    for node in recomputed[:MAX_SAVE_TRIALS]:
        trial = _split(joint, a, [*saved, node], as_module=False)
        trial_peak = _step_peak(a, *trial)
        if trial_peak <= peak:
            logs.log("aot", "partition: saving %s (step peak stays %d bytes)", node.name, peak)
            best, saved, peak = trial, trial[2], trial_peak
    forward, backward, saved = best
    return fx.GraphModule(joint, forward), fx.GraphModule(joint, backward), saved


def partition(
    joint: fx.GraphModule,
    num_primals: int,
    num_fwd_outputs: int,
    *,
    recompute: bool = True,
    split_stages: bool = True,
    mutated: Sequence[int] = (),
) -> Partition:
    """Split the joint graph; `recompute=False` gives the naive 'save what is read' (and
    one backward node); `split_stages=False` keeps the backward one autograd node.
    `mutated`: primal positions whose inputs the runtime overwrites (never saved)."""
    a = _Analysis(joint, num_primals, num_fwd_outputs, mutated)
    naive = a.naive_saved()
    if recompute:
        forward, backward, saved = _save_free_recomputations(joint, a, a.min_cut_saved())
    else:
        forward, backward, saved = _split(joint, a, naive)
    split = None
    # two backward nodes hand crossing values over as gradients of stand-ins whose shapes
    # would have to be evaluated per call: not done for symbolic sizes
    if recompute and split_stages and not is_symbolic_graph(joint.graph):
        # an order that counts the tangents as released at their last read puts every
        # tangent reader early (the weight gradient of the last layer first): the order
        # a split after the last tangent reader wants
        primal_saved = _of_inputs(saved)
        tangent_bytes = storage_bytes(a.tangents)
        early = backward
        if tangent_bytes >= MIN_SPLIT_GAIN:
            early = reorder_for_memory(backward, primal_saved)
        split = split_backward(
            early,
            [n.name for n in saved],
            [n.name for n in a.tangents],
            primal_saved,
            baseline=_backward_peak(a, backward, saved),
        )
    if split is not None:
        logs.log(
            "aot",
            "partition: backward in two autograd nodes (%d values cross; estimated peak %d "
            "bytes instead of %d)",
            split.num_cross,
            split.peak,
            split.unsplit_peak,
        )
    result = Partition(
        forward=forward,
        backward=backward,
        saved=[n.name for n in saved],
        saved_bytes=storage_bytes(saved),
        naive_saved_bytes=storage_bytes(naive),
        split=split,
    )
    logs.log(
        "aot",
        "partition: saved %d values, %d bytes, %d of them graph inputs "
        "(naive: %d values, %d bytes)%s",
        len(saved),
        result.saved_bytes,
        storage_bytes(n for n in saved if _storage_root(n).op == "placeholder"),
        len(naive),
        result.naive_saved_bytes,
        "" if recompute else " [recompute off]",
    )
    return result
