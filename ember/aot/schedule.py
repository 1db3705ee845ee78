"""Memory-aware node order for a backward graph.

A backward graph runs as one autograd node, so unlike eager autograd (which frees each node's
saved tensors as soon as that node has run) its peak memory is set by the order of its ops.
Joint order follows autograd's engine, which allocates a large weight gradient while a
same-sized activation gradient is still waiting for a cheap reduction. This pass reorders a
functional graph greedily: among the ops whose inputs are ready, run the one that grows live
memory least (bytes it allocates minus bytes its inputs' last uses release), ties broken by the
original order. Views allocate nothing and keep their base alive; pinned inputs (tangents held
by autograd's engine, parameters) are never counted as released.

Takes and returns an fx.GraphModule; random ops are never reordered (they do not occur in
backward graphs; the pass refuses graphs that contain them).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.fx as fx

from ember import torch_compat
from ember.aot.functionalize import is_view_op
from ember.aot.symbolic import numel_hint

GraphLike = TypeVar("GraphLike", fx.GraphModule, fx.Graph)
MAX_NODES = 3000  # the greedy choice is quadratic; beyond this keep the traced order


def _nbytes(val: object) -> int:
    if isinstance(val, torch.Tensor):
        return numel_hint(val) * val.element_size()  # a symbolic size counts its hint
    if isinstance(val, list | tuple):
        return sum(_nbytes(v) for v in val)
    return 0


def _is_view(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return _is_view(node.args[0])  # type: ignore[arg-type]
    return isinstance(node.target, torch_compat.OpOverload) and is_view_op(node.target)


class _Memory:
    """Storage owners and their pending uses; an owner's bytes are released at its last use."""

    def __init__(self, nodes: list[fx.Node], pinned: set[fx.Node]) -> None:
        self.owner: dict[fx.Node, fx.Node] = {}
        self.pending: dict[fx.Node, int] = {}
        for n in nodes:
            if n.op == "call_function" and (n.target is operator.getitem or _is_view(n)):
                parent = n.args[0]
                self.owner[n] = self.owner[parent] if _is_view(n) else n  # type: ignore[index]
            else:
                self.owner[n] = n
            self.pending.setdefault(self.owner[n], 0)
        for n in nodes:
            o = self.owner[n]
            self.pending[o] += len(n.users)
            if n in pinned or any(u.op == "output" for u in n.users):
                self.pending[o] += 1 << 30  # never released by this graph
        self.alloc = {
            n: 0 if _is_view(n) or n.target is operator.getitem else _nbytes(n.meta.get("val"))
            for n in nodes
        }
        # placeholders count too: a boxed backward frees a saved activation at its last use
        # (pinned ones, never released, are kept out by their pending count)
        self.size = {
            n: _nbytes(n.meta.get("val")) if n.op in ("call_function", "placeholder") else 0
            for n in nodes
        }
        for n in nodes:
            if isinstance(n.meta.get("val"), list | tuple):
                self.size[n] = 0  # tuple results are owned by their getitems

    def score(self, node: fx.Node) -> int:
        uses: dict[fx.Node, int] = {}
        for i in node.all_input_nodes:
            o = self.owner[i]
            uses[o] = uses.get(o, 0) + 1
        freed = sum(self.size[o] for o, k in uses.items() if self.pending[o] == k)
        return self.alloc[node] - freed

    def run(self, node: fx.Node) -> None:
        for i in node.all_input_nodes:
            self.pending[self.owner[i]] -= 1


def _graph(gm: fx.GraphModule | fx.Graph) -> fx.Graph:
    return gm.graph if isinstance(gm, fx.GraphModule) else gm


def reorder_for_memory(
    gm: GraphLike, pinned_names: set[str], lazy_names: frozenset[str] = frozenset()
) -> GraphLike:
    """Greedy low-peak order of gm's ops (see module docstring); gm's semantics unchanged.
    Takes and returns a GraphModule, or a bare Graph (cheap: no code generation), as the
    partitioner's trial splits use. Nodes named in `lazy_names` (a checkpointed region's
    recomputation) take no part in the greedy choice: each runs just before the first node
    that needs it, so a region is computed again only when its gradients are next (chosen
    one by one, the cheap first ops of every region would all run at the start)."""
    nodes = list(_graph(gm).nodes)
    lazy = {n for n in nodes if n.name in lazy_names}
    body = [n for n in nodes if n.op not in ("placeholder", "output", "get_attr")]
    if len(body) > MAX_NODES or any(
        isinstance(n.target, torch_compat.OpOverload)
        and torch.Tag.nondeterministic_seeded in n.target.tags
        for n in body
    ):
        return gm
    pinned = {n for n in nodes if n.op == "placeholder" and n.name in pinned_names}
    mem = _Memory(nodes, pinned)
    position = {n: i for i, n in enumerate(nodes)}
    done = {n for n in nodes if n.op in ("placeholder", "get_attr")} | lazy
    body = [n for n in body if n not in lazy]
    waiting = {n: sum(1 for i in n.all_input_nodes if i not in done) for n in body}
    ready = [n for n in body if waiting[n] == 0]
    order: list[fx.Node] = []
    while ready:
        best = min(ready, key=lambda n: (mem.score(n), position[n]))
        ready.remove(best)
        mem.run(best)
        order.append(best)
        for u in best.users:
            if u in waiting:
                waiting[u] -= sum(1 for i in u.all_input_nodes if i is best)
                if waiting[u] == 0:
                    ready.append(u)
    if len(order) != len(body):
        return gm  # not a DAG over body nodes; leave it alone
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in nodes:
        if n.op in ("placeholder", "get_attr"):
            env[n] = graph.node_copy(n, lambda x: env[x])
    for n in order:
        _copy_with_lazy_inputs(graph, n, env)
    out = nodes[-1]
    _copy_with_lazy_inputs(graph, out, env)
    return fx.GraphModule(gm, graph) if isinstance(gm, fx.GraphModule) else graph


def _copy_with_lazy_inputs(graph: fx.Graph, node: fx.Node, env: dict[fx.Node, fx.Node]) -> None:
    """Copy `node` into `graph`, preceded by the inputs not copied yet (lazy ones), each
    after its own inputs."""
    stack = [node]
    while stack:
        top = stack[-1]
        missing = [i for i in top.all_input_nodes if i not in env]
        if missing:
            stack.extend(reversed(missing))
            continue
        stack.pop()
        if top not in env:
            env[top] = graph.node_copy(top, lambda x: env[x])


def peak_bytes(
    gm: fx.GraphModule | fx.Graph,
    pinned_names: set[str],
    resident_names: set[str],
    release_after: dict[str, set[str]] | None = None,
    timeline: list[int] | None = None,
) -> int:
    """Peak bytes of running gm in its node order, each value freed after its last use.

    Placeholders named in `resident_names` (saved activations, tangents) are live from the
    start and count; other placeholders (parameters, the caller's inputs) exist anyway and do
    not. Pinned values and graph outputs are not released at their last use; a pinned value
    is released after the node that `release_after` maps to it (tangents held by autograd's
    engine until a backward stage returns). The partitioner compares these estimates."""
    nodes = list(_graph(gm).nodes)
    pinned = {n for n in nodes if n.name in pinned_names}
    by_name = {n.name: n for n in nodes}
    mem = _Memory(nodes, pinned)
    size = dict(mem.size)
    live = 0
    for n in nodes:
        if n.op == "placeholder":
            size[n] = _nbytes(n.meta.get("val")) if n.name in resident_names else 0
            live += size[n]
    peak = live
    released: set[fx.Node] = set()

    def release(o: fx.Node) -> int:
        if o in released:
            return 0
        released.add(o)
        return size[o]

    for n in nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        live += mem.alloc[n]
        peak = max(peak, live)
        if timeline is not None:
            timeline.append(live)  # bytes held while this node runs
        for i in n.all_input_nodes:
            o = mem.owner[i]
            mem.pending[o] -= 1
            if mem.pending[o] == 0:
                live -= release(o)
        if not n.users and mem.pending[mem.owner[n]] == 0:
            live -= release(mem.owner[n])
        for name in (release_after or {}).get(n.name, ()):
            live -= release(mem.owner[by_name[name]])
    return peak


@dataclass
class BackwardSplit:
    """A backward graph cut into two autograd nodes, so the tangents (which autograd's engine
    holds for as long as the node that receives them runs) are released after the first.

    first: (saved it reads..., tangents...) -> (its gradients..., crossing values...)
    second: (saved it reads..., crossing values...) -> (its gradients...)
    The crossing values reach the second node as the gradients of placeholder outputs."""

    first: fx.GraphModule
    second: fx.GraphModule
    first_saved: list[str]  # names of the backward's saved placeholders, in input order
    second_saved: list[str]
    first_grads: list[int]  # positions among the backward's outputs
    second_grads: list[int]
    num_cross: int
    peak: int  # estimated peak bytes, and the unsplit backward's
    unsplit_peak: int


MAX_SPLIT_TRIALS = 64  # split points evaluated (each is a linear simulation)
MIN_SPLIT_GAIN = 1 << 18  # a second autograd node costs per-call time: split for >= 256 KiB


def split_backward(
    gm: fx.GraphModule,
    saved: list[str],
    tangents: list[str],
    primals: set[str],
    baseline: int | None = None,
) -> BackwardSplit | None:
    """The split point after the last reader of a tangent that lowers the estimated peak
    most, or None when no split lowers it below `baseline` (the unsplit backward's peak).
    A split pins the crossing values for the whole second stage (the engine holds them as
    its incoming gradients), so it only pays when the tangents are bigger than what stays
    pinned: an MLP's output gradient (batch x d_out) against the activation gradient that
    the last weight-gradient GEMM reads anyway."""
    nodes = list(gm.graph.nodes)
    body = [n for n in nodes if n.op not in ("placeholder", "output", "get_attr")]
    pos = {n: i for i, n in enumerate(body)}
    tangent_nodes = [n for n in nodes if n.op == "placeholder" and n.name in tangents]
    readers = [pos[u] for t in tangent_nodes for u in t.users if u in pos]
    if not readers or max(readers) >= len(body) - 1:
        return None
    tangent_bytes = sum(_nbytes(t.meta.get("val")) for t in tangent_nodes)
    if tangent_bytes < MIN_SPLIT_GAIN or len(body) > MAX_NODES:
        return None  # nothing worth releasing, or too big to search cheaply
    resident = {n for n in saved if n not in primals} | set(tangents)
    live: list[int] = []
    unsplit = peak_bytes(gm, primals | set(tangents), resident, timeline=live)
    if baseline is not None:
        unsplit = min(unsplit, baseline)  # the peak of the order used when not splitting
    start = max(readers)
    # a split releases at most the tangents, and only after the last of their readers
    best_case = max(max(live[: start + 1]), max(live[start + 1 :]) - tangent_bytes)
    if best_case > unsplit - MIN_SPLIT_GAIN:
        return None
    owner = _Memory(nodes, set()).owner
    step = max(1, (len(body) - 1 - start) // MAX_SPLIT_TRIALS)
    best: tuple[int, int, list[fx.Node]] | None = None
    for k in range(start, len(body) - 1, step):
        first_body, second_body, cross = _stages(body, k)
        if any(owner[c] in tangent_nodes for c in cross):
            continue  # a view of a tangent crosses: the tangent is not released
        if not all(_differentiable(c.meta.get("val")) for c in cross):
            continue  # only floating tensors travel as gradients (bool masks would be lost)
        pinned = primals | set(tangents) | {c.name for c in cross}
        peak = peak_bytes(gm, pinned, resident, {first_body[-1].name: set(tangents)})
        if best is None or peak < best[0]:
            best = (peak, k, cross)
    if best is None or best[0] > unsplit - MIN_SPLIT_GAIN:
        return None
    peak, k, _ = best
    first_body, second_body, cross = _stages(body, k)
    first = set(first_body)
    outs = list(nodes[-1].args[0])
    in_first = [isinstance(g, fx.Node) and (g in first or g.op == "placeholder") for g in outs]
    first_grads = [i for i, f in enumerate(in_first) if f]
    second_grads = [i for i, f in enumerate(in_first) if not f]
    saved_nodes = [n for n in nodes if n.op == "placeholder" and n.name in saved]
    reads_first = {i for n in first for i in n.all_input_nodes}
    reads_first |= {outs[i] for i in first_grads}
    reads_second = {i for n in second_body for i in n.all_input_nodes}
    s1 = [n for n in saved_nodes if n in reads_first]
    s2 = [n for n in saved_nodes if n in reads_second]
    g1 = _subgraph(gm, [*s1, *tangent_nodes], first_body, [outs[i] for i in first_grads] + cross)
    g2 = _subgraph(gm, [*s2, *cross], second_body, [outs[i] for i in second_grads])
    return BackwardSplit(
        first=g1,
        second=g2,
        first_saved=[n.name for n in s1],
        second_saved=[n.name for n in s2],
        first_grads=first_grads,
        second_grads=second_grads,
        num_cross=len(cross),
        peak=peak,
        unsplit_peak=unsplit,
    )


def _differentiable(val: object) -> bool:
    return isinstance(val, torch.Tensor) and (val.is_floating_point() or val.is_complex())


def _stages(body: list[fx.Node], k: int) -> tuple[list[fx.Node], list[fx.Node], list[fx.Node]]:
    """Nodes of the two stages when splitting after body[k], and the values that cross.
    Views and getitems of first-stage values (the t(t(mm)) of a weight gradient) join the
    first stage: they are free, and the second then receives what it computes with."""
    first_body, second_body = body[: k + 1], []
    first = set(first_body)
    for n in body[k + 1 :]:
        free = _is_view(n) or n.target is operator.getitem
        if free and all(i in first or i.op != "call_function" for i in n.all_input_nodes):
            first_body.append(n)
            first.add(n)
        else:
            second_body.append(n)
    second = set(second_body)
    cross = [n for n in first_body if any(u in second for u in n.users)]
    return first_body, second_body, cross


def _subgraph(
    gm: fx.GraphModule, inputs: list[fx.Node], body: list[fx.Node], outputs: list
) -> fx.GraphModule:
    """A graph of `body` (in order) taking `inputs` as placeholders and returning `outputs`."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        p = graph.placeholder(n.name)
        p.meta = dict(n.meta)
        env[n] = p
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            env[n] = graph.node_copy(n, lambda x: env[x])
    for n in body:
        if n not in env:
            env[n] = graph.node_copy(n, lambda x: env[x])
    result = tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs)
    out = graph.output(result)
    out.meta["val"] = tuple(r.meta.get("val") if isinstance(r, fx.Node) else r for r in result)
    graph.eliminate_dead_code()
    return fx.GraphModule(gm, graph)
