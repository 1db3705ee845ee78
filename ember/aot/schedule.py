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

import torch
import torch.fx as fx

from ember.aot.functionalize import is_view_op

MAX_NODES = 3000  # the greedy choice is quadratic; beyond this keep the traced order


def _nbytes(val: object) -> int:
    if isinstance(val, torch.Tensor):
        return val.numel() * val.element_size()
    if isinstance(val, list | tuple):
        return sum(_nbytes(v) for v in val)
    return 0


def _is_view(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return _is_view(node.args[0])  # type: ignore[arg-type]
    return isinstance(node.target, torch._ops.OpOverload) and is_view_op(node.target)


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
        self.size = {n: _nbytes(n.meta.get("val")) if n.op == "call_function" else 0 for n in nodes}
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


def reorder_for_memory(gm: fx.GraphModule, pinned_names: set[str]) -> fx.GraphModule:
    """Greedy low-peak order of gm's ops (see module docstring); gm's semantics unchanged."""
    nodes = list(gm.graph.nodes)
    body = [n for n in nodes if n.op not in ("placeholder", "output", "get_attr")]
    if len(body) > MAX_NODES or any(
        isinstance(n.target, torch._ops.OpOverload)
        and torch.Tag.nondeterministic_seeded in n.target.tags
        for n in body
    ):
        return gm
    pinned = {n for n in nodes if n.op == "placeholder" and n.name in pinned_names}
    mem = _Memory(nodes, pinned)
    position = {n: i for i, n in enumerate(nodes)}
    done = {n for n in nodes if n.op in ("placeholder", "get_attr")}
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
        env[n] = graph.node_copy(n, lambda x: env[x])
    out = nodes[-1]
    env[out] = graph.node_copy(out, lambda x: env[x])
    return fx.GraphModule(gm, graph)


def peak_bytes(gm: fx.GraphModule, pinned_names: set[str], resident_names: set[str]) -> int:
    """Peak bytes of running gm in its node order, each value freed after its last use.

    Placeholders named in `resident_names` (saved activations, tangents) are live from the
    start and count; other placeholders (parameters, the caller's inputs) exist anyway and do
    not. Pinned placeholders and graph outputs are never released. The partitioner compares
    these estimates to decide whether saving a value costs peak memory."""
    nodes = list(gm.graph.nodes)
    pinned = {n for n in nodes if n.op == "placeholder" and n.name in pinned_names}
    mem = _Memory(nodes, pinned)
    size = dict(mem.size)
    live = 0
    for n in nodes:
        if n.op == "placeholder" and n.name in resident_names:
            size[n] = _nbytes(n.meta.get("val"))
            live += size[n]
    peak = live
    for n in nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        live += mem.alloc[n]
        peak = max(peak, live)
        for i in n.all_input_nodes:
            o = mem.owner[i]
            mem.pending[o] -= 1
            if mem.pending[o] == 0:
                live -= size[o]
        if not n.users and mem.pending[mem.owner[n]] == 0:
            live -= size[mem.owner[n]]
    return peak
