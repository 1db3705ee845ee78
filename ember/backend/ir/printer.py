"""Readable text of the loop IR, for logs ("schedule"/"kernels") and snapshot tests."""

from __future__ import annotations

from ember.backend.ir import nodes as ir


def expr_str(e: ir.Expr) -> str:
    if isinstance(e, ir.Load):
        masks = "".join(f" if {m.lo} <= {m.value} < {m.hi}" for m in e.mask)
        return f"{e.buffer}[{e.index}]{masks}"
    if isinstance(e, ir.Const):
        return f"{e.value!r}:{e.dtype.value}"
    if isinstance(e, ir.IndexValue):
        return f"index({e.index}):{e.dtype.value}"
    if isinstance(e, ir.Unary):
        return f"{e.op.value}({expr_str(e.x)})"
    if isinstance(e, ir.Binary):
        return f"{e.op.value}({expr_str(e.a)}, {expr_str(e.b)})"
    if isinstance(e, ir.Where):
        return f"where({expr_str(e.cond)}, {expr_str(e.a)}, {expr_str(e.b)})"
    if isinstance(e, ir.Cast):
        return f"{e.dtype.value}({expr_str(e.x)})"
    raise TypeError(f"not an expression: {e!r}")


def _dtype(d) -> str:
    return d.value if isinstance(d, ir.DType) else str(d)


def _layout(lay: ir.Layout) -> str:
    off = f", offset={lay.offset}" if lay.offset else ""
    return f"size={list(lay.size)}, stride={list(lay.stride)}{off}"


def _arg(a) -> str:
    if isinstance(a, ir.TensorArg):
        return f"{a.buffer}<{_layout(a.layout)}>"
    if isinstance(a, tuple):
        return "(" + ", ".join(_arg(x) for x in a) + ")"
    return repr(a)


def node_str(n: ir.Node) -> str:
    if isinstance(n, ir.Pointwise):
        return (
            f"{n.name} = pointwise{list(n.ranges)} {n.dtype.value} [{n.index}] = {expr_str(n.body)}"
        )
    if isinstance(n, ir.Reduction):
        return (
            f"{n.name} = {n.reduction_type.value}{list(n.ranges)}"
            f"x{list(n.reduction_ranges)} {n.dtype.value} [{n.index}] <- {expr_str(n.body)}"
        )
    args = ", ".join([_arg(a) for a in n.args] + [f"{k}={_arg(v)}" for k, v in n.kwargs])
    return f"{', '.join(n.outputs)} = {n.kind.value} {n.op}({args})"


def graph_str(g: ir.LoopGraph) -> str:
    lines = [f"size {sym} = {src}" for sym, src in g.symbols]
    for b in g.inputs:
        lines.append(f"input {b.name}: {_dtype(b.dtype)} {_layout(b.layout)}")
    for b in g.buffers:
        lines.append(f"buffer {b.name}: {_dtype(b.dtype)} {_layout(b.layout)}")
    lines += [node_str(n) for n in g.nodes]
    outs = [
        f"{o.buffer}<{_layout(o.layout)}>" if isinstance(o, ir.Output) else str(o)
        for o in g.outputs
    ]
    lines.append("return " + ", ".join(outs))
    return "\n".join(lines)
