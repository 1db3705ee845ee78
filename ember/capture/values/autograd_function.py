"""A custom `torch.autograd.Function` called in the trace (`MyFn.apply(x, ...)`), captured as
one graph node, as Dynamo captures it.

Before the node is emitted, the Function's forward (with `setup_context`, where the class
defines one) is traced as a body of its own (capture/subgraph.py) with a symbolic ctx, and so
is its backward (only where the call records one: grad mode on and a tensor argument needing
a gradient). These speculations are thrown away; they prove that both functions only compute
tensors from their arguments (no side effect outside them, no graph break, no tensor read
from anywhere else) and give the outputs' metadata, and their guards stay with the capture.
The node itself calls the real `MyFn.apply` (`ember.higher_order.FunctionApply`): under
backend "eager" that is eager's own call, and ember's aot stage runs it under its recorder,
so the joint trace records the user's forward, then PyTorch's autograd calls the user's
backward on the recorded outputs and that is recorded too (never a derivative of the
forward).

What is refused, each with its reason (the call then runs in Python at a graph break):
in-place Functions (`ctx.mark_dirty`), forward-mode (`save_for_forward`, `jvp`), a forward or
backward with a break or a side effect, arguments other than tensors and printable
constants, results other than a tensor or a flat tuple of tensors and constants, and a call
inside another higher-order op's function.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch.autograd.function import Function

from ember import higher_order, torch_compat
from ember.capture.subgraph import Body, SubgraphOutput, emit_higher_order, trace_body
from ember.capture.values.base import ConstantValue, MissingAttribute, Value
from ember.capture.values.containers import TupleValue
from ember.capture.values.tensor import TensorValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator

_GRAPH_CONSTANTS = (
    int,
    float,
    bool,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)
"""Non-tensor arguments a graph node can carry (fx prints them in the graph's code)."""


def _refuse(what: str, detail: str) -> Unsupported:
    return Unsupported(
        BreakReason.HIGHER_ORDER_OP,
        f"{what} cannot be captured as one graph node: {detail}",
        hint="the call runs in Python at a graph break; ember captures a Function whose "
        "forward and backward only compute tensors from their arguments",
    )


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(Function, name)


class FunctionCtxValue(Value):
    """The `ctx` of one call, while its forward and backward are speculated: attributes the
    user sets, the tensors saved for the backward, the outputs marked non-differentiable."""

    _METHODS = ("save_for_backward", "mark_non_differentiable", "set_materialize_grads")
    _REFUSED = ("mark_dirty", "save_for_forward")

    def __init__(self, cls: type, needs_input_grad: tuple[bool, ...], inline: bool) -> None:
        self.cls = cls
        self.needs_input_grad = needs_input_grad
        self.inline = inline
        """The call records no backward: its forward is traced inline, as a function."""
        self.dirty: list[TensorValue] = []
        self.attrs: dict[str, Value] = {}
        self.saved: list[Value] = []
        self.non_differentiable: list[TensorValue] = []
        self.materialize_grads = True

    def describe(self) -> str:
        return f"the ctx of {self.cls.__qualname__}.apply"

    def python_type(self) -> type:
        return self.cls._backward_cls

    def getattr(self, tx: Translator, name: str) -> Value:
        if name in self.attrs:
            return self.attrs[name]
        if name == "saved_tensors":
            return TupleValue(list(self.saved))
        if name == "needs_input_grad":
            return ConstantValue(self.needs_input_grad)
        if name in self._METHODS:
            return _CtxMethod(self, name)
        if name == "mark_dirty" and self.inline:
            return _CtxMethod(self, name)
        if name in self._REFUSED:
            raise _refuse(f"{self.cls.__qualname__}.apply", f"it calls ctx.{name}")
        if hasattr(self.python_type(), name):
            raise Unsupported(BreakReason.UNSUPPORTED_ATTRIBUTE, f"ctx.{name} of {self.cls}")
        raise MissingAttribute(f"{self.describe()} has no attribute {name!r}")

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        if hasattr(self.python_type(), name):  # the ctx's own machinery (to_save, ...)
            return super().setattr(tx, name, value)
        self.attrs[name] = value

    def call_ctx_method(self, name: str, args: list[Value]) -> Value:
        if name == "save_for_backward":
            if not all(isinstance(a, TensorValue) or _is_none(a) for a in args):
                raise Unsupported(
                    BreakReason.EXCEPTION_RAISED,
                    "ctx.save_for_backward takes tensors or None",
                )
            self.saved = list(args)
        elif name == "mark_dirty":
            self.dirty += [a for a in args if isinstance(a, TensorValue)]
        elif name == "mark_non_differentiable":
            self.non_differentiable += [a for a in args if isinstance(a, TensorValue)]
        else:
            self.materialize_grads = bool(args[0].as_constant())
        return ConstantValue(None)


def _is_none(value: Value) -> bool:
    return value.is_constant() and value.as_constant() is None


class _CtxMethod(Value):
    def __init__(self, ctx: FunctionCtxValue, name: str) -> None:
        self.ctx = ctx
        self.name = name

    def describe(self) -> str:
        return f"ctx.{self.name}"

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if kwargs:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"ctx.{self.name} with keywords")
        return self.ctx.call_ctx_method(self.name, args)


class _Forward(Value):
    """What `apply` runs before the node exists: forward, then `setup_context` where the
    class defines one (its forward then takes no ctx)."""

    def __init__(self, tx: Translator, cls: type, ctx: FunctionCtxValue) -> None:
        self.cls = cls
        self.ctx = ctx
        self.forward = tx.ctx.builder.wrap_const(cls.forward)
        self.setup = _overrides(cls, "setup_context")
        self.setup_context = tx.ctx.builder.wrap_const(cls.setup_context) if self.setup else None

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if self.setup_context is None:
            return self.forward.call(tx, [self.ctx, *args], {})
        result = self.forward.call(tx, args, {})
        self.setup_context.call(tx, [self.ctx, TupleValue(list(args)), result], {})
        return result


class FunctionApplyValue(Value):
    """`MyFn.apply` for a Function subclass that keeps `Function.apply`."""

    def __init__(self, cls_value: Value) -> None:
        self.cls_value = cls_value
        self.cls: type = cls_value.as_constant()

    def describe(self) -> str:
        return f"{self.cls.__qualname__}.apply"

    def python_type(self) -> type:
        return type(self.cls.apply)

    def getattr(self, tx: Translator, name: str) -> Value:
        if name == "__self__":
            return self.cls_value
        return super().getattr(tx, name)

    def reconstruct(self, em: Emitter) -> None:
        em.reconstruct(self.cls_value)
        em.cg.load_attr("apply")

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        what = self.describe()
        cls = self.cls
        for name in ("jvp", "vmap"):
            if _overrides(cls, name):
                raise _refuse(what, f"it defines {name} (ember captures forward and backward)")
        if not isinstance(inspect.getattr_static(cls, "forward"), staticmethod):
            raise _refuse(what, "its forward is not a staticmethod")
        args = _bound_arguments(tx, cls, args, kwargs, what)
        needs = tuple(isinstance(a, TensorValue) and a.example.requires_grad for a in args)
        records_backward = torch.is_grad_enabled() and any(needs)
        ctx = FunctionCtxValue(cls, needs, inline=not records_backward)
        if ctx.inline:
            return _inline(tx, cls, ctx, args)
        if isinstance(tx.ctx.out, SubgraphOutput):
            raise _refuse(what, "it is called inside another higher-order op's function")
        return _one_node(tx, cls, ctx, args)


def _one_node(tx: Translator, cls: type, ctx: FunctionCtxValue, args: list[Value]) -> Value:
    """Speculate forward and backward, then emit the node that calls `apply`."""
    what = f"{cls.__qualname__}.apply"
    with _without_grad():  # apply runs the forward so
        body = trace_body(tx, _Forward(tx, cls, ctx), args, {}, f"the forward of {what}")
    inputs = [a.node for a in args if isinstance(a, TensorValue)]
    _check_lifted(body.operands, inputs, (body.gm.graph,), what, "forward")
    outputs = _outputs(body.result, what)
    for output in outputs:
        if output.node.graph is not body.gm.graph and output.node not in inputs:
            raise _refuse(what, f"its forward returns {output.describe()} from outside")
    differentiable = [
        all(o is not m for m in ctx.non_differentiable)
        and (o.example.is_floating_point() or o.example.is_complex())
        for o in outputs
    ]
    _speculate_backward(tx, cls, ctx, body, outputs, differentiable, args)
    results = emit_higher_order(
        tx,
        higher_order.FunctionApply(cls),
        tuple(a.node if isinstance(a, TensorValue) else a.as_constant() for a in args),
        {},
        [_output_example(o.example, d) for o, d in zip(outputs, differentiable)],
        [o.device for o in outputs],
    )
    if isinstance(body.result, TensorValue):
        return results[0]
    replaced = iter(results)
    items = _tuple_items(body.result, what)
    return TupleValue([next(replaced) if isinstance(i, TensorValue) else i for i in items])


def _inline(tx: Translator, cls: type, ctx: FunctionCtxValue, args: list[Value]) -> Value:
    """A call that records no backward is its forward run under no_grad, traced inline
    (side effects and all, as for any function); `apply` hands back a new tensor (a view)
    for an argument the forward returns unchanged, and a dirty one as it is."""
    what = f"{cls.__qualname__}.apply"
    grad_mode = torch.is_grad_enabled()
    tx.set_grad_enabled(False)
    try:
        result = _Forward(tx, cls, ctx).call(tx, args, {})
        items = [result] if isinstance(result, TensorValue) else _tuple_items(result, what)
        fresh = []
        for item in items:
            if any(item is a for a in args) and all(item is not d for d in ctx.dirty):
                item = item.call_method(tx, "view_as", [item], {})
            fresh.append(item)
    finally:
        tx.set_grad_enabled(grad_mode)
    return fresh[0] if isinstance(result, TensorValue) else TupleValue(fresh)


def _tuple_items(result: Value, what: str) -> list[Value]:
    """The items of what a forward returns besides one tensor: a plain tuple."""
    if type(result) is not TupleValue or result.struct_type is not None:
        raise _refuse(what, f"its forward returns {result.describe()}")
    return list(result.items)


def _bound_arguments(
    tx: Translator, cls: type, args: list[Value], kwargs: dict[str, Value], what: str
) -> list[Value]:
    """The arguments `apply` passes on: with `setup_context`, bound to forward's signature
    (defaults filled in, as `apply` does); each a tensor or a constant a node can carry."""
    if _overrides(cls, "setup_context"):
        try:
            bound = inspect.signature(cls.forward).bind(*args, **kwargs)
        except TypeError as exc:
            raise Unsupported(BreakReason.EXCEPTION_RAISED, f"{what}: TypeError: {exc}") from None
        bound.apply_defaults()
        if bound.kwargs:
            raise _refuse(what, "its forward takes keyword-only arguments")
        args = [a if isinstance(a, Value) else tx.ctx.builder.wrap_const(a) for a in bound.args]
    elif kwargs:
        raise _refuse(what, "it is called with keyword arguments")
    for arg in args:
        if isinstance(arg, TensorValue):
            continue
        if not arg.is_constant() or not _graph_constant(arg.as_constant()):
            raise _refuse(what, f"it is passed {arg.describe()} (not a tensor or a constant)")
    return list(args)


def _graph_constant(value: Any) -> bool:
    if type(value) in (tuple, list):
        return all(_graph_constant(v) for v in value)
    return isinstance(value, _GRAPH_CONSTANTS)


@contextlib.contextmanager
def _without_grad() -> Iterator[None]:
    """Grad mode off for a speculation only: nothing goes into the graph (the speculated
    body is not kept), unlike `tx.set_grad_enabled`."""
    saved = torch.is_grad_enabled()
    torch_compat.set_grad_enabled(False)
    try:
        yield
    finally:
        torch_compat.set_grad_enabled(saved)


def _check_lifted(
    operands: list[fx.Node], inputs: list[fx.Node], inner: tuple, what: str, part: str
) -> None:
    """The node passes `apply` only its arguments, and the aot stage would see a tensor read
    from elsewhere (a parameter, a global) as a constant without a gradient: such a read is
    refused. Nodes of the graphs in `inner` (the forward's, for the backward) and sizes are
    fine (the real call computes them again)."""
    for node in operands:
        if node in inputs or any(node.graph is g for g in inner):
            continue
        if isinstance(node.meta.get("example_value"), torch.Tensor):
            raise _refuse(what, f"its {part} reads tensor {node.name}, which is not an argument")


def _outputs(result: Value, what: str) -> list[TensorValue]:
    """The tensors the forward returns: one, or the tensors of a flat tuple."""
    if isinstance(result, TensorValue):
        return [result]
    items = _tuple_items(result, what)
    if not all(isinstance(i, TensorValue) or i.is_constant() for i in items):
        raise _refuse(what, f"its forward returns {result.describe()}")
    tensors = [i for i in items if isinstance(i, TensorValue)]
    if not tensors:
        raise _refuse(what, "its forward returns no tensor")
    if len({id(t) for t in tensors}) != len(tensors):
        raise _refuse(what, "its forward returns one tensor twice")
    return tensors


def _output_example(example: torch.Tensor, differentiable: bool) -> torch.Tensor:
    result = example.detach()
    return result.requires_grad_(True) if differentiable else result


def _speculate_backward(
    tx: Translator,
    cls: type,
    ctx: FunctionCtxValue,
    forward: Body,
    outputs: list[TensorValue],
    differentiable: list[bool],
    args: list[Value],
) -> None:
    """Trace the backward with one gradient per forward output (None for a non-tensor
    output, and for a non-differentiable one when the ctx does not materialize them), and
    check that it returns one gradient (or None) per argument."""
    what = f"{cls.__qualname__}.apply"
    grads_graph = fx.Graph()
    grads: list[Value] = []
    result = forward.result
    items = [result] if isinstance(result, TensorValue) else _tuple_items(result, what)
    tensors = iter(zip(outputs, differentiable))
    for item in items:
        if not isinstance(item, TensorValue):
            grads.append(ConstantValue(None))
            continue
        output, diff = next(tensors)
        if not diff and not ctx.materialize_grads:
            grads.append(ConstantValue(None))
            continue
        example = output.example.detach().clone()
        node = grads_graph.placeholder(f"grad_{len(grads)}")
        node.meta["example_value"] = example
        grads.append(TensorValue(node, example, output.device))
    user_fn = cls.vjp if _overrides(cls, "vjp") else cls.backward
    fn = tx.ctx.builder.wrap_const(user_fn)
    with _without_grad():  # the engine runs it so, without create_graph
        body = trace_body(tx, fn, [ctx, *grads], {}, f"the backward of {what}")
    inputs = [a.node for a in args if isinstance(a, TensorValue)]
    _check_lifted(body.operands, inputs, (forward.gm.graph, grads_graph), what, "backward")
    _check_gradients(body.result, args, what)


def _check_gradients(result: Value, args: list[Value], what: str) -> None:
    """One gradient per argument (more only as Nones), None for a non-tensor argument:
    what autograd checks when the backward returns (eager raises then; a refusal lets it)."""
    got = result.items if type(result) is TupleValue else [result]
    extra = got[len(args) :]
    if len(got) < len(args) or not all(_is_none(g) for g in extra):
        raise _refuse(what, f"its backward returns {len(got)} gradients for {len(args)} arguments")
    for grad, arg in zip(got, args):
        if _is_none(grad):
            continue
        if not isinstance(grad, TensorValue) or not isinstance(arg, TensorValue):
            raise _refuse(
                what, f"its backward returns {grad.describe()} as the gradient of {arg.describe()}"
            )
        shape, to = arg.example.shape, grad.example.shape
        if len(shape) > len(to) or any(
            a != b and a != 1 for a, b in zip(reversed(shape), reversed(to))
        ):  # autograd sums a gradient over the dims its input was broadcast along
            raise _refuse(
                what, f"its backward returns a gradient of shape {tuple(to)} for {arg.describe()}"
            )
