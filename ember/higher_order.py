"""The higher-order ops that ember's captured graphs call, and what each does when a graph
runs as torch code (backend "eager", or any backend that calls gm.forward).

A higher-order op takes a function (a GraphModule of the torch-level body, traced by
capture/subgraph.py) besides tensors. ember's aot stage (aot/higher_order.py) does not call
these functions: it reads the nodes and compiles the bodies (a checkpointed body is inlined
and recomputed in the backward; cond's branches are compiled apart).

A custom `torch.autograd.Function` call is a `FunctionApply` node: it calls the Function's
own `apply`, so ember's aot stage records the user's forward and, through PyTorch's
autograd, the user's backward in its joint trace.

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


def register_traced_hook(body: Callable[..., Any], tensor: torch.Tensor, *operands: Any) -> None:
    """`tensor.register_hook(fn)` where capture traced `fn` as `body(grad, *operands)`
    (capture/values/tensor_hooks.py): a body with no outputs is a hook returning None."""

    def hook(grad: torch.Tensor) -> torch.Tensor | None:
        outputs = body(grad, *operands)
        return outputs[0] if outputs else None

    tensor.register_hook(hook)


class FunctionApply:
    """The target of a captured `MyFn.apply(...)` call (capture/values/autograd_function.py):
    calls it, and returns its tensors as a tuple (the node's outputs are read by index).
    Nothing is traced here: ember's aot stage runs it under its recorder, where PyTorch's
    autograd records the user's forward and, in the joint trace, calls the user's backward."""

    def __init__(self, cls: type[torch.autograd.Function]) -> None:
        self.cls = cls
        self.__name__ = self.__qualname__ = f"{cls.__name__}_apply"  # fx names globals so
        self.__module__ = cls.__module__

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        result = self.cls.apply(*args)
        items = result if isinstance(result, tuple) else (result,)
        return tuple(i for i in items if isinstance(i, torch.Tensor))

    def __repr__(self) -> str:
        return f"{self.cls.__qualname__}.apply"


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
    from ember.aot.symbolic import symbolic_inputs

    symbolic = symbolic_inputs(gm, example_inputs)
    if symbolic is None:
        return compile_fx(gm, example_inputs)
    from torch._guards import TracingContext, tracing

    mode, fakes = _fake_inputs(symbolic, example_inputs)
    with tracing(TracingContext(mode)):
        return compile_fx(gm, fakes)


def _fake_inputs(symbolic: list[Any], example_inputs: list[Any]) -> tuple[Any, list[Any]]:
    """A graph with size symbols (ember.compile's dynamic shapes) as Inductor gets it from
    Dynamo: fake inputs of a FakeTensorMode on the graph's ShapeEnv, the symbolic tensors
    with the graph's own symbols, and the symbols themselves."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    sizes = [v for s in symbolic if s is not None for v in getattr(s, "shape", [s])]
    shape_env = next(v for v in sizes if isinstance(v, torch.SymInt)).node.shape_env
    mode = FakeTensorMode(shape_env=shape_env)
    fakes = []
    for s, real in zip(symbolic, example_inputs, strict=True):
        if s is None:
            static = isinstance(real, torch.Tensor)
            fakes.append(mode.from_tensor(real, static_shapes=True) if static else real)
        elif isinstance(s, torch.Tensor):
            with mode:
                fake = torch.empty_strided(s.shape, s.stride(), dtype=s.dtype, device=real.device)
            fakes.append(fake.requires_grad_(real.requires_grad))
        else:
            fakes.append(s)
    return mode, fakes
