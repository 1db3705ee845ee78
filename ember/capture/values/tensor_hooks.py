"""`tensor.register_hook(fn)` on a tensor the graph computes.

The hook is traced as a body of its own (capture/subgraph.py, side effects fenced in) on a
gradient shaped like the tensor; if it is a pure tensor function (it returns a tensor or
None and changes nothing outside), the graph gets a `register_traced_hook` node
(ember/higher_order.py) that registers the body on the real tensor when the graph runs, so
the gradient the hook sees and the one it returns are eager's, whatever backend runs the
graph (aot's joint trace calls the hook on its own tensors and records the body into the
backward). Anything else (a hook that records gradients, prints, or whose handle the
code keeps) is a graph break at the call, as before; Dynamo breaks on those too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember import higher_order
from ember.bytecode.ops import Op
from ember.capture.subgraph import Argument, add_submodule, trace_body
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.tensor import TensorValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator

_WHAT = "a tensor hook"


def register_hook(
    tx: Translator, tensor: TensorValue, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    """`tensor.register_hook(fn)` captured as a graph node, or Unsupported (a break)."""
    if kwargs or len(args) != 1:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "register_hook with other arguments")
    if tensor.source is not None:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "tensor hooks on a graph input")
    if not tensor.example.requires_grad:  # eagerly a RuntimeError
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "a hook on a tensor without grad")
    following = tx.insts[tx.ip] if tx.ip < len(tx.insts) else None
    if following is None or following.op is not Op.POP_TOP:
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            "tensor hooks whose handle the code keeps (handle.remove() runs in Python)",
        )
    grad = Argument(tensor, tensor.example.detach())
    body = trace_body(tx, args[0], [grad], {}, _WHAT)
    result = body.result
    if not (
        (isinstance(result, ConstantValue) and result.as_constant() is None)
        or (isinstance(result, TensorValue) and body.outputs == [result])
    ):
        raise Unsupported(
            BreakReason.HIGHER_ORDER_OP,
            f"{_WHAT} must return a tensor it computes or None, not {result.describe()}",
        )
    if not body.operands or body.operands[0] is not tensor.node:
        raise Unsupported(BreakReason.HIGHER_ORDER_OP, f"{_WHAT}: its gradient was not its input")
    attr = add_submodule(tx.ctx.out, "hook_body", body.gm)
    # the body's first operand is the hooked tensor (its gradient's placeholder)
    node = tx.ctx.out.create_node(
        "call_function", higher_order.register_traced_hook, (attr, *body.operands), {}
    )
    node.meta["example_value"] = None
    return ConstantValue(None)  # the handle, which the next instruction drops
