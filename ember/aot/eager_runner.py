"""The `aot_eager` 'compiler': run an aten graph with PyTorch's kernels, freeing early.

`gm.forward(*args)` keeps every argument alive until it returns (the caller's tuple holds
them), so a backward graph would hold every saved activation to its end. `BoxedRunner` also
accepts the *boxed* convention: `run_boxed(args_list)` takes ownership of the list, clears it,
and drops each value after its last use, as eager autograd frees saved tensors node by node.
The runtime calls `run_boxed` on any compiled callable that sets `boxed_call = True`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _load(template: Any, env: list[Any]) -> Any:
    if isinstance(template, _Slot):
        return env[template.index]
    if isinstance(template, list | tuple):
        return type(template)(_load(t, env) for t in template)
    if isinstance(template, dict):
        return {k: _load(v, env) for k, v in template.items()}
    return template


class BoxedRunner:
    """A small interpreter over a functional aten graph with last-use freeing."""

    boxed_call = True

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        slots: dict[fx.Node, int] = {}
        nodes = list(gm.graph.nodes)
        last_use: dict[fx.Node, fx.Node] = {}
        for node in nodes:
            for inp in node.all_input_nodes:
                last_use[inp] = node
        self.num_inputs = 0
        self.steps: list[tuple[Any, Any, Any, int, tuple[int, ...]]] = []
        for node in nodes:
            slots[node] = len(slots)
            freed = tuple(slots[i] for i, user in last_use.items() if user is node)
            to_slot = lambda n: _Slot(slots[n])  # noqa: B023  (used at once, inside the loop)
            if node.op == "placeholder":
                self.num_inputs += 1
            elif node.op == "get_attr":
                self.steps.append((_const, (getattr(gm, node.target),), {}, slots[node], ()))
            elif node.op == "call_function":
                args = fx.node.map_arg(node.args, to_slot)
                kwargs = fx.node.map_arg(node.kwargs, to_slot)
                self.steps.append((node.target, args, kwargs, slots[node], freed))
            elif node.op == "output":
                self.output = fx.node.map_arg(node.args[0], to_slot)
        self.size = len(slots)

    def run_boxed(self, args: list[Any]) -> Any:
        env: list[Any] = [None] * self.size
        env[: self.num_inputs] = args
        args.clear()
        for fn, a, kw, out, freed in self.steps:
            env[out] = fn(*_load(a, env), **_load(kw, env))
            for i in freed:
                if i != out:
                    env[i] = None
        return _load(self.output, env)

    def __call__(self, *args: Any) -> Any:
        return self.run_boxed(list(args))


def _const(t: torch.Tensor) -> torch.Tensor:
    return t


def eager_compile_aten(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> BoxedRunner:
    """The `aot_eager` 'compiler': PyTorch's kernels, values freed after their last use."""
    return BoxedRunner(gm)
