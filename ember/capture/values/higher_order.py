"""Higher-order calls captured as one graph node each, their functions traced as bodies of
their own (capture/subgraph.py):

- `torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=...)`: one
  `ember.higher_order.checkpoint` node; ember's aot recomputes the body in the backward.
- `torch.cond(pred, true_fn, false_fn, operands)`: one `torch.ops.higher_order.cond` node
  with both branches (a constant predicate just calls its branch, as eager does).

A function that cannot be a body (it has side effects outside itself, or something in it
cannot be captured) makes the call a graph break, with the body's reason: the call then
runs in Python exactly as eagerly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.utils.checkpoint

from ember import higher_order
from ember.capture.subgraph import (
    Body,
    add_submodule,
    align_operands,
    emit_higher_order,
    leaves_of,
    rebuild_result,
    trace_body,
)
from ember.capture.values.base import Value
from ember.capture.values.builtins import handles
from ember.capture.values.containers import SequenceValue
from ember.capture.values.tensor import TensorValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator

_CHECKPOINT = "torch.utils.checkpoint.checkpoint"
_OPTIONS = ("use_reentrant", "preserve_rng_state", "determinism_check", "debug", "early_stop")


def _constant_option(value: Value, name: str) -> object:
    if not value.is_constant():
        raise Unsupported(BreakReason.HIGHER_ORDER_OP, f"{_CHECKPOINT}({name}=...) not constant")
    return value.as_constant()


@handles(torch.utils.checkpoint.checkpoint)
def _checkpoint(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
    kwargs = dict(kwargs)
    fn = args[0] if args else kwargs.pop("function")
    options = {k: _constant_option(kwargs.pop(k), k) for k in _OPTIONS if k in kwargs}
    context_fn = kwargs.pop("context_fn", None)
    if context_fn is not None and context_fn.as_constant() is not (
        torch.utils.checkpoint.noop_context_fn
    ):
        raise Unsupported(
            BreakReason.HIGHER_ORDER_OP,
            f"{_CHECKPOINT} with a context_fn (selective checkpointing) is not captured",
        )
    use_reentrant = options.get("use_reentrant")
    use_reentrant = True if use_reentrant is None else bool(use_reentrant)
    if use_reentrant and kwargs:
        raise Unsupported(
            BreakReason.EXCEPTION_RAISED,
            f"{_CHECKPOINT}(use_reentrant=True) takes no keyword arguments for the function",
        )
    body_args = args[1:]
    if not torch.is_grad_enabled():  # nothing to recompute: checkpoint just calls fn
        return fn.call(tx, body_args, kwargs)
    if use_reentrant and not any(
        isinstance(a, TensorValue) and a.example.requires_grad for a in body_args
    ):
        # the reentrant form runs fn under no_grad when no tensor argument needs a
        # gradient: nothing it computes gets one, parameters included
        tx.set_grad_enabled(False)
        try:
            return fn.call(tx, body_args, kwargs)
        finally:
            tx.set_grad_enabled(True)
    body = trace_body(tx, fn, body_args, kwargs, _CHECKPOINT)
    if any(n.target is torch.ops.higher_order.cond for n in _all_nodes(body.gm)):
        raise Unsupported(
            BreakReason.HIGHER_ORDER_OP,
            f"{_CHECKPOINT} cannot be captured as one graph node: its function calls "
            "torch.cond, which ember's aot stage cannot recompute",
        )
    attr = add_submodule(tx.ctx.out, "wrap_body", body.gm)
    outs = emit_higher_order(
        tx,
        higher_order.checkpoint,
        (attr, *body.operands),
        {"use_reentrant": use_reentrant},
        [o.example for o in body.outputs],
        [o.device for o in body.outputs],
    )
    return rebuild_result(body.result, {id(i): o for i, o in zip(body.outputs, outs)})


def _all_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes of a body and of the bodies inside it."""
    return [n for m in gm.modules() if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes]


def _operand_values(operands: Value | None) -> list[Value]:
    if operands is None:
        return []
    if not isinstance(operands, SequenceValue) or not all(
        isinstance(o, TensorValue) for o in operands.items
    ):
        raise Unsupported(
            BreakReason.HIGHER_ORDER_OP,
            f"torch.cond operands given as {operands.describe()}: ember captures a tuple or "
            "list of tensors",
        )
    return list(operands.items)


def _branch_outputs(body: Body, which: str) -> list[TensorValue]:
    """The tensors a branch returns: each computed by it, once, sharing no memory with an
    operand (eager torch.cond refuses aliasing with an error of its own)."""
    leaves = leaves_of(body.result, "torch.cond")
    if not all(isinstance(leaf, TensorValue) for leaf in leaves):
        raise Unsupported(
            BreakReason.HIGHER_ORDER_OP, f"the {which} branch of torch.cond returns a non-tensor"
        )
    storages = [n.meta["example_value"].untyped_storage()._cdata for n in body.operands]
    if len(body.outputs) != len(leaves) or any(
        o.example.untyped_storage()._cdata in storages for o in body.outputs
    ):
        raise Unsupported(
            BreakReason.HIGHER_ORDER_OP,
            f"the {which} branch of torch.cond returns an operand, a view of one, or one "
            "tensor twice (torch.cond refuses aliasing)",
        )
    return body.outputs


@handles(torch.cond)
def _cond(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
    names = ("pred", "true_fn", "false_fn", "operands")
    bound = dict(zip(names, args)) | kwargs
    pred, true_fn, false_fn = bound["pred"], bound["true_fn"], bound["false_fn"]
    operands = _operand_values(bound.get("operands"))
    if not isinstance(pred, TensorValue):  # a Python value: eager calls one branch
        return (true_fn if pred.as_constant() else false_fn).call(tx, operands, {})
    if pred.example.numel() != 1:
        raise Unsupported(
            BreakReason.EXCEPTION_RAISED, "torch.cond's pred must be a single-element tensor"
        )
    bodies = [
        trace_body(tx, fn, operands, {}, f"torch.cond ({which} branch)")
        for fn, which in ((true_fn, "true"), (false_fn, "false"))
    ]
    true_outs, false_outs = (_branch_outputs(b, w) for b, w in zip(bodies, ("true", "false")))
    _check_same_outputs(true_outs, false_outs)
    operands_nodes = align_operands(bodies)
    out = tx.ctx.out
    true_attr = add_submodule(out, "cond_true", bodies[0].gm)
    false_attr = add_submodule(out, "cond_false", bodies[1].gm)
    needs_grad = torch.is_grad_enabled() and any(
        n.meta["example_value"].requires_grad for n in operands_nodes
    )
    examples = [_output_example(o.example, needs_grad) for o in true_outs]
    results = emit_higher_order(
        tx,
        torch.ops.higher_order.cond,
        (pred.node, true_attr, false_attr, tuple(operands_nodes)),
        {},
        examples,
        [o.device for o in true_outs],
    )
    return rebuild_result(bodies[0].result, {id(i): o for i, o in zip(true_outs, results)})


def _check_same_outputs(true_outs: list[TensorValue], false_outs: list[TensorValue]) -> None:
    def facts(t: TensorValue) -> tuple:
        return (t.example.shape, t.example.dtype, t.example.stride(), t.device)

    if len(true_outs) != len(false_outs) or any(
        facts(a) != facts(b) for a, b in zip(true_outs, false_outs)
    ):
        raise Unsupported(
            BreakReason.HIGHER_ORDER_OP,
            "the branches of torch.cond return tensors of different number, shapes, dtypes "
            f"or strides: {[facts(t) for t in true_outs]} and {[facts(t) for t in false_outs]}",
        )


def _output_example(example: torch.Tensor, needs_grad: bool) -> torch.Tensor:
    """cond runs as an autograd.Function when an operand needs a gradient: then every
    floating output requires grad, whichever branch ran."""
    result = example.detach()
    if needs_grad and (result.is_floating_point() or result.is_complex()):
        result.requires_grad_(True)
    return result
