"""The higher-order ops that ember's captured graphs call, and what each does when a graph
runs as torch code (backend "eager", or any backend that calls gm.forward).

A higher-order op takes a function (a GraphModule of the torch-level body, traced by
capture/subgraph.py) besides tensors. ember's aot stage (aot/higher_order.py) does not call
these functions: it reads the nodes and compiles the bodies (a checkpointed body is inlined
and recomputed in the backward; cond's branches are compiled apart).

`torch.cond` nodes use PyTorch's own op, `torch.ops.higher_order.cond`, whose eager kernel
is exact. Checkpointing uses ember's `checkpoint` below rather than PyTorch's
`tag_activation_checkpoint`, whose eager kernel recomputes without restoring the random
state (dropout in a checkpointed body then gets a different mask in the backward, and
wrong gradients); `for_inductor` turns ember's nodes into PyTorch's for Inductor, which
replays random draws itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ember import torch_compat


def checkpoint(body: Callable[..., Any], *operands: Any, use_reentrant: bool = False) -> Any:
    """Run `body(*operands)` keeping only its inputs for the backward, which computes the
    body again (torch.utils.checkpoint, with the random state restored for it). The
    non-reentrant form runs for both `use_reentrant` settings: it gives the same values and
    works with torch.autograd.grad (capture already handled the one difference, that the
    reentrant form gives nothing a gradient when no tensor argument requires one)."""
    return torch.utils.checkpoint.checkpoint(body, *operands, use_reentrant=False)


def vmap(
    body: Callable[..., Any],
    in_dims: tuple[int | None, ...],
    out_dims: int,
    randomness: str,
    chunk_size: int | None,
    *operands: Any,
) -> Any:
    """`torch.vmap` of a body (capture/values/functorch.py)."""
    batched = torch.vmap(
        body, in_dims=in_dims, out_dims=out_dims, randomness=randomness, chunk_size=chunk_size
    )
    return batched(*operands)


def grad(body: Callable[..., Any], argnums: tuple[int, ...], *operands: Any) -> Any:
    """`torch.func.grad` of a body returning one single-element tensor (as a 1-tuple)."""
    return torch.func.grad(lambda *args: body(*args)[0], argnums=argnums)(*operands)


def for_inductor(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Backend "inductor" behind ember's capture: PyTorch's compile_fx, with ember's
    checkpoint nodes written as PyTorch's tag_activation_checkpoint (which Inductor knows)."""
    tag_activation_checkpoint = torch_compat.tag_activation_checkpoint()
    from torch._inductor.compile_fx import compile_fx

    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        changed = False
        for node in module.graph.find_nodes(op="call_function", target=checkpoint):
            node.target = tag_activation_checkpoint
            changed = True
        if changed:
            module.recompile()
    return compile_fx(gm, example_inputs)
