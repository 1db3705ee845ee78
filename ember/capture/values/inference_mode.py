"""`with torch.inference_mode():` inside traced code (a block, or a function decorated with
`@torch.inference_mode()`, whose wrapper enters a fresh one), captured in the graph.

The graph gets a node that enters inference mode and one that leaves it
(`torch.autograd.grad_mode._enter_inference_mode` / `_exit_inference_mode`, what a
`torch.inference_mode()` block does in C++), so the ops between them run under it when the
graph runs and make inference tensors, as eagerly. The capture itself stays outside
inference mode (it reads version counters: capture/frame.py), with grad mode off inside the
block, which is what inference mode means for the ops' autograd. A graph that holds such
a block runs as captured, uncompiled, in the aot stage (aot/__init__.py): its traces do
not keep the mode switch.

At a break inside the block, the graph leaves inference mode at its end, and break code
enters a real `torch.inference_mode()` (grad mode as it was outside the block, which its
`__exit__` restores) and leaves its `__exit__` where the block's was, so the rest of the
block runs under it, in CPython and in the resume function. Only `inference_mode(True)` is
captured; `inference_mode(False)` breaks as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember import torch_compat
from ember.capture.values.base import ConstantValue, Value
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator

ENTER = torch_compat.enter_inference_mode
EXIT = torch_compat.exit_inference_mode


class InferenceModeClassValue(Value):
    """torch.inference_mode as called in the trace (also by its decorator's `clone()`)."""

    def describe(self) -> str:
        return "torch.inference_mode"

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return torch.inference_mode

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        given = args[0] if args else kwargs.get("mode", ConstantValue(True))
        plain = len(args) + len(kwargs) <= 1 and given.is_constant()
        if not plain or given.as_constant() is not True:
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                "torch.inference_mode other than as a `with` block in inference mode "
                "(`torch.inference_mode()` or `(True)`)",
            )
        return InferenceModeValue()


class InferenceModeValue(Value):
    """A `torch.inference_mode()` object made in the trace."""

    def __init__(self) -> None:
        self.entered: list[tuple[torch.fx.Node, bool]] = []
        """Per open block: its enter node and the grad mode outside it."""

    def describe(self) -> str:
        return "torch.inference_mode()"

    def python_type(self) -> type:
        return torch.inference_mode

    def enter(self, tx: Translator) -> Value:
        out = tx.ctx.out
        node = out.create_node("call_function", ENTER, (True,), {})
        out.inference_blocks.append((node, torch.is_grad_enabled()))
        self.entered.append((node, torch.is_grad_enabled()))
        torch_compat.set_grad_enabled(False)  # the graph's node does it when it runs
        tx.ctx.effects.touch()  # an instruction that fails after this starts again
        return ConstantValue(None)

    def exit(self, tx: Translator) -> Value:
        node, outside = self.entered.pop()
        out = tx.ctx.out
        out.inference_blocks.remove((node, outside))
        out.create_node("call_function", EXIT, (node,), {})
        torch_compat.set_grad_enabled(outside)
        tx.ctx.effects.touch()
        return ConstantValue(None)

    def reconstruct(self, em: Emitter) -> None:
        """Not entered (handed on at a break before its `with`): made again."""
        if self.entered:
            return super().reconstruct(em)
        em.cg.load_const(torch.inference_mode, push_null=True)
        em.cg.call(0)


def enter_again(grad_outside: bool) -> Callable[..., Any]:
    """Break code inside a traced inference-mode block (the graph left inference mode at its
    end): enter one for real, so that its `__exit__` (returned, where the block's was)
    restores the grad mode outside the block. Grad mode is off inside (the trace refuses
    to turn it on there)."""
    torch_compat.set_grad_enabled(grad_outside)
    manager = torch.inference_mode()
    manager.__enter__()
    return manager.__exit__


def close_open_blocks(out: Any) -> None:
    """A graph that ends inside inference-mode blocks (at a break) leaves them at its end."""
    for node, _ in reversed(out.inference_blocks):
        out.create_node("call_function", EXIT, (node,), {})


def grad_mode_outside_blocks(out: Any) -> bool:
    """The grad mode now, or, inside traced inference-mode blocks, outside the outermost:
    what break code sets before it enters the blocks again for real (their real
    `__exit__` gives that mode back, and the trace turned grad mode off only in itself)."""
    return out.inference_blocks[0][1] if out.inference_blocks else torch.is_grad_enabled()
