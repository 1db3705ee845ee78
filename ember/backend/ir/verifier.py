"""Checks of a LoopGraph's invariants, run after lowering and before scheduling.

Catches lowering bugs where they are made (a load from an unknown buffer, an index using a
loop variable the node does not have, a read before the write) instead of as wrong numbers.
"""

from __future__ import annotations

from ember.backend import indexing
from ember.backend.ir import nodes as ir


class IRError(Exception):
    pass


def _check_expr(node_name: str, e: ir.Expr, allowed: set[str], known: dict) -> None:
    for sub in ir.walk(e):
        if not isinstance(sub.dtype, ir.DType):
            raise IRError(f"{node_name}: expression of non-kernel dtype {sub.dtype}")
        if isinstance(sub, ir.Load):
            if sub.buffer not in known:
                raise IRError(f"{node_name}: load from undefined buffer {sub.buffer}")
            if known[sub.buffer].dtype != sub.dtype:
                raise IRError(f"{node_name}: load of {sub.buffer} with dtype {sub.dtype}")
        if isinstance(sub, ir.Load | ir.IndexValue):
            extra = indexing.free_names(sub.index) - allowed
            for m in sub.mask if isinstance(sub, ir.Load) else ():
                extra |= indexing.free_names(m.value) - allowed
            if extra:
                raise IRError(f"{node_name}: index uses unknown variables {sorted(extra)}")


def verify(g: ir.LoopGraph) -> ir.LoopGraph:
    """Raise IRError on the first violated invariant; return the graph unchanged."""
    buffers = g.buffer_map()
    if len(buffers) != len(g.inputs) + len(g.buffers):
        raise IRError("duplicate buffer names")
    defined = {b.name: b for b in g.inputs}
    sizes = {sym.name for sym, _ in g.symbols}  # size symbols may appear in any index
    for n in g.nodes:
        if isinstance(n, ir.ExternCall):
            for name in ir.node_reads(n):
                if name not in defined:
                    raise IRError(f"extern {n.op} reads undefined buffer {name}")
        else:
            xs = {f"x{i}" for i in range(len(n.ranges))} | sizes
            rs = (
                {f"r{i}" for i in range(len(n.reduction_ranges))}
                if isinstance(n, ir.Reduction)
                else set()
            )
            _check_expr(n.name, n.body, xs | rs, defined)
            if indexing.free_names(n.index) - xs:
                raise IRError(f"{n.name}: store index uses reduction or unknown variables")
            if any(s == 1 for s in n.ranges):
                raise IRError(f"{n.name}: unit range in {n.ranges} (squeeze it)")
        for name in ir.node_outputs(n):
            if name in defined:
                raise IRError(f"buffer {name} written twice")
            if name not in buffers:
                raise IRError(f"node writes undeclared buffer {name}")
            defined[name] = buffers[name]
    for o in g.buffer_outputs():
        if o.buffer not in defined:
            raise IRError(f"output {o.buffer} is never written")
    return g
