"""The `aot_eager` 'compiler': run an aten graph with PyTorch's kernels, freeing early.

`gm.forward(*args)` keeps every argument alive until it returns (the caller's tuple holds
them), so a backward graph would hold every saved activation to its end. `BoxedRunner`
generates a Python function over the graph that takes the *boxed* convention: `run_boxed(list)`
takes ownership of the list, clears it, and deletes each value after its last use, as eager
autograd frees saved tensors node by node. The runtime calls `run_boxed` on any compiled
callable that sets `boxed_call = True`.

Generated code (not an interpreter loop) because the per-op Python cost adds up: a
transformer block's forward and backward are several hundred aten calls per step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx


class _Source:
    """Builds the generated function's text; non-node arguments become named globals."""

    def __init__(self) -> None:
        self.globals: dict[str, Any] = {}
        self.names: dict[fx.Node, str] = {}

    def const(self, value: Any) -> str:
        if value is None or isinstance(value, bool | int | str):
            return repr(value)
        if isinstance(value, float) and math.isfinite(value):
            return repr(value)
        name = f"_k{len(self.globals)}"
        self.globals[name] = value
        return name

    def expr(self, arg: Any) -> str:
        if isinstance(arg, fx.Node):
            return self.names[arg]
        if isinstance(arg, tuple):
            return "(" + "".join(self.expr(a) + ", " for a in arg) + ")"
        if isinstance(arg, list):
            return "[" + ", ".join(self.expr(a) for a in arg) + "]"
        if isinstance(arg, dict):
            return "{" + ", ".join(f"{k!r}: {self.expr(v)}" for k, v in arg.items()) + "}"
        return self.const(arg)


def _generate(gm: fx.GraphModule) -> tuple[str, dict[str, Any]]:
    """Source of `run(args)` for gm's graph, and the globals it needs."""
    src = _Source()
    nodes = list(gm.graph.nodes)
    last_use: dict[fx.Node, fx.Node] = {}
    for node in nodes:
        for inp in node.all_input_nodes:
            last_use[inp] = node
    dies_at: dict[fx.Node, list[fx.Node]] = {}
    for value, user in last_use.items():
        dies_at.setdefault(user, []).append(value)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        src.names[n] = f"a{i}"
    lines = ["def run(args):"]
    if placeholders:
        lines.append("    " + "".join(src.names[n] + ", " for n in placeholders) + "= args")
    lines.append("    args.clear()")
    for i, node in enumerate(nodes):
        if node.op == "placeholder":
            continue
        if node.op == "output":
            lines.append(f"    return {src.expr(tuple(node.args[0]))}")
            break
        name = src.names[node] = f"v{i}"
        if node.op == "get_attr":
            lines.append(f"    {name} = {src.const(getattr(gm, node.target))}")  # type: ignore[arg-type]
        else:
            fn = src.const(node.target)
            args = "".join(src.expr(a) + ", " for a in node.args)
            kwargs = "".join(f"{k}={src.expr(v)}, " for k, v in node.kwargs.items())
            lines.append(f"    {name} = {fn}({args}{kwargs})")
        dead = [src.names[v] for v in dies_at.get(node, []) if v is not node]
        if not node.users:
            dead.append(name)
        if dead:
            lines.append(f"    del {', '.join(dead)}")
    return "\n".join(lines) + "\n", src.globals


class BoxedRunner:
    """Runs a functional aten graph through generated code with last-use freeing."""

    boxed_call = True

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.source, scope = _generate(gm)
        exec(compile(self.source, f"<ember aot_eager {id(gm):x}>", "exec"), scope)  # noqa: S102
        self.run_boxed = scope["run"]

    def __call__(self, *args: Any) -> Any:
        return self.run_boxed(list(args))


def eager_compile_aten(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> BoxedRunner:
    """The `aot_eager` 'compiler': PyTorch's kernels, values freed after their last use."""
    return BoxedRunner(gm)
