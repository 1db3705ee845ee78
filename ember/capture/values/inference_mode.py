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
block runs under it, in CPython and in the resume function. `inference_mode(False)` (a
block that leaves inference mode, with grad mode on, as C++'s InferenceMode(false) sets it)
is captured the same way. Grad mode switched on inside an inference block (`enable_grad()`)
is a node as anywhere else; the ops there still record no autograd, so their examples are
made under no_grad (tensor.py's `tensor_op` asks `records_no_autograd`).

Whether a tensor is an inference tensor (`is_inference()`) follows from the mode it was
made in: `made_tensor_is_inference` answers it for each op's results.
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(eq=False)
class Block:
    """An inference-mode block open in the trace."""

    node: torch.fx.Node
    """Its enter node (the exit node takes it)."""
    grad_outside: bool
    mode: bool
    grad_inside: bool | None = None
    """At a break inside it: the trace's grad mode inside it there (break code sets it)."""


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
        if not plain or type(given.as_constant()) is not bool:
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                "torch.inference_mode other than with a constant True or False",
            )
        return InferenceModeValue(given.as_constant())


class InferenceModeValue(Value):
    """A `torch.inference_mode(mode)` object made in the trace."""

    def __init__(self, mode: bool = True) -> None:
        self.mode = mode
        self.entered: list[Block] = []
        """Its open blocks (one, unless the object is entered again inside itself)."""

    def describe(self) -> str:
        return "torch.inference_mode()"

    def python_type(self) -> type:
        return torch.inference_mode

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """`torch.inference_mode(mode)(fn)`: the decorator, on a function of the trace."""
        from ember.capture.values.grad_decorated import GradModeDecoratedValue, decorates

        if not self.entered and len(args) == 1 and not kwargs and decorates(args[0]):
            return GradModeDecoratedValue(self.mode, args[0], inference=True)
        return super().call(tx, args, kwargs)

    def enter(self, tx: Translator) -> Value:
        out = tx.ctx.out
        node = out.create_node("call_function", ENTER, (self.mode,), {})
        block = Block(node, torch.is_grad_enabled(), self.mode)
        out.inference_blocks.append(block)
        self.entered.append(block)
        torch_compat.set_grad_enabled(not self.mode)  # the graph's node does it when it runs
        tx.ctx.effects.touch()  # an instruction that fails after this starts again
        return ConstantValue(None)

    def exit(self, tx: Translator) -> Value:
        block = self.entered.pop()
        out = tx.ctx.out
        out.inference_blocks.remove(block)
        out.create_node("call_function", EXIT, (block.node,), {})
        torch_compat.set_grad_enabled(block.grad_outside)
        tx.ctx.effects.touch()
        return ConstantValue(None)

    def reconstruct(self, em: Emitter) -> None:
        """Not entered (handed on at a break before its `with`): made again."""
        if self.entered:
            return super().reconstruct(em)
        em.cg.load_const(torch.inference_mode, push_null=True)
        em.cg.load_const(self.mode)
        em.cg.call(1)


def enter_again(grad_outside: bool, mode: bool, grad_inside: bool | None) -> Callable[..., Any]:
    """Break code inside a traced inference-mode block (the graph left inference mode at its
    end): enter one for real, so that its `__exit__` (returned, where the block's was)
    restores the grad mode outside the block; then the grad mode the trace had inside it
    (an `enable_grad()` there). Blocks are entered again outermost first."""
    torch_compat.set_grad_enabled(grad_outside)
    manager = torch.inference_mode(mode)
    manager.__enter__()
    if grad_inside is not None:  # noted where the capture stopped (grad_mode_outside_blocks)
        torch_compat.set_grad_enabled(grad_inside)
    return manager.__exit__


def traced_inference_mode(out: Any) -> bool | None:
    """The mode of the innermost inference-mode block open in the trace (None: none is)."""
    return out.inference_blocks[-1].mode if out.inference_blocks else None


def records_no_autograd(out: Any) -> bool:
    """Ops traced now record no autograd whatever the grad mode: in inference mode (the
    innermost traced block's, else the caller's) with grad mode on. Inside a traced
    `inference_mode(False)` block they do record it, also under the caller's inference mode."""
    mode = traced_inference_mode(out)
    inference = torch_compat.callers_inference_mode() if mode is None else mode
    return inference and torch.is_grad_enabled()


def made_tensor_is_inference(
    out: Any, result: torch.Tensor, inputs: list[tuple[torch.Tensor, bool | None]]
) -> bool | None:
    """Whether a tensor an op made is an inference tensor, as torch decides it: a view
    shares its base's answer (also in inference mode, where a view of an ordinary tensor is
    an ordinary one); anything else is one exactly when made in inference mode (the
    innermost traced block's, else the caller's). None where the view's base is not known
    (the examples' `_base` links are the meta tensors')."""
    if result._is_view():
        base = result._base
        for example, inference in inputs:  # each input's example and its answer
            if example is base or example._base is base:
                return inference
        return None
    mode = traced_inference_mode(out)
    return torch_compat.callers_inference_mode() if mode is None else mode


def close_open_blocks(out: Any) -> None:
    """A graph that ends inside inference-mode blocks (at a break) leaves them at its end."""
    for block in reversed(out.inference_blocks):
        out.create_node("call_function", EXIT, (block.node,), {})


def grad_mode_outside_blocks(out: Any) -> bool:
    """The grad mode now, or, inside traced inference-mode blocks, outside the outermost:
    what break code sets before it enters the blocks again for real (their real
    `__exit__` gives that mode back, and the trace turned grad mode off only in itself).
    Called where the capture stops: each open block notes the grad mode inside it then."""
    blocks = out.inference_blocks
    for block, inner in zip(blocks, blocks[1:]):
        block.grad_inside = inner.grad_outside
    if blocks:
        blocks[-1].grad_inside = torch.is_grad_enabled()
    return blocks[0].grad_outside if blocks else torch.is_grad_enabled()
