"""torch.func transforms in the trace.

`torch.vmap(fn, in_dims, out_dims)(*args)` and `torch.func.grad(fn, argnums)(*args)` are
captured as one node each: fn is traced as a body (capture/subgraph.py; vmap's body sees one
sample of each batched argument) and the node calls `ember.higher_order.vmap` / `grad`, which
apply PyTorch's own transform to the body. The result's metadata comes from running that
node on meta tensors, so it is exactly what eager's transform makes.

What these do not cover (nested in_dims or outputs, has_aux, non-tensor arguments to batch,
and the other transforms: jacrev, jacfwd, vjp, jvp, hessian, linearize, functionalize,
grad_and_value) is refused at the call with its name: the program then runs that call in
Python, at a graph break.
"""

from __future__ import annotations

import os
import types
from typing import TYPE_CHECKING, Any

import torch
import torch._functorch
import torch.func

from ember import higher_order
from ember.capture.subgraph import (
    Argument,
    add_submodule,
    emit_higher_order,
    leaves_of,
    rebuild_result,
    trace_body,
)
from ember.capture.values.base import Value
from ember.capture.values.builtins import handles
from ember.capture.values.containers import TupleValue
from ember.capture.values.meta import run_on_meta
from ember.capture.values.tensor import TensorValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


def _refuse(what: str, detail: str) -> Unsupported:
    return Unsupported(
        BreakReason.HIGHER_ORDER_OP,
        f"{what} {detail}",
        hint="the call runs in Python; ember captures vmap(fn, in_dims, out_dims) over "
        "tensors and grad(fn, argnums) of a function returning one tensor",
    )


def _options(what: str, names: tuple[str, ...], args: list[Value], kwargs: dict) -> dict:
    given = dict(zip(names, args)) | kwargs
    unknown = set(given) - set(names)
    if unknown or len(args) > len(names):
        raise _refuse(what, f"with arguments {sorted(unknown)}")
    options = {}
    for name, value in given.items():
        if name != "func":
            if not value.is_constant():
                raise _refuse(what, f"with a {name} that is not a constant")
            options[name] = value.as_constant()
    return options


class TransformedValue(Value):
    """`torch.vmap(fn, ...)` or `torch.func.grad(fn, ...)` made in the trace: calling it
    captures fn as a body; it is rebuilt by calling the transform again if it escapes."""

    def __init__(self, transform: Any, fn: Value, options: dict[str, Any]) -> None:
        self.transform = transform
        self.fn = fn
        self.options = options

    def describe(self) -> str:
        return f"{self.transform.__module__}.{self.transform.__name__}({self.fn.describe()})"

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if kwargs:
            raise _refuse(self.describe(), "called with keyword arguments")
        if self.transform is torch.vmap:
            return _call_vmap(tx, self, args)
        return _call_grad(tx, self, args)

    def contained(self) -> list[Value]:
        return [self.fn]

    def reconstruct(self, em: Emitter) -> None:
        em.cg.load_const(self.transform, push_null=True)  # NULL before or after, per version
        em.reconstruct(self.fn)
        for value in self.options.values():
            em.cg.load_const(value)
        em.cg.call(1 + len(self.options), tuple(self.options))


@handles(torch.vmap)
def _vmap(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
    names = ("func", "in_dims", "out_dims", "randomness", "chunk_size")
    fn = args[0] if args else kwargs["func"]
    return TransformedValue(torch.vmap, fn, _options("torch.vmap", names, args, kwargs))


@handles(torch.func.grad)
def _grad(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
    fn = args[0] if args else kwargs["func"]
    options = _options("torch.func.grad", ("func", "argnums", "has_aux"), args, kwargs)
    if options.get("has_aux"):
        raise _refuse("torch.func.grad", "with has_aux=True")
    return TransformedValue(torch.func.grad, fn, options)


def _call_vmap(tx: Translator, value: TransformedValue, args: list[Value]) -> Value:
    what = value.describe()
    in_dims = value.options.get("in_dims", 0)
    out_dims = value.options.get("out_dims", 0)
    dims = [in_dims] * len(args) if isinstance(in_dims, int) else in_dims
    if not isinstance(out_dims, int) or not isinstance(dims, tuple | list):
        raise _refuse(what, f"with in_dims={in_dims!r}, out_dims={out_dims!r}")
    if len(dims) != len(args) or not all(d is None or isinstance(d, int) for d in dims):
        raise _refuse(what, f"with in_dims={in_dims!r} for {len(args)} arguments")
    body_args: list[Any] = []
    tensor_dims: list[int | None] = []
    for arg, dim in zip(args, dims):
        if isinstance(arg, TensorValue):
            sample = arg.example if dim is None else arg.example.select(dim, 0)
            body_args.append(Argument(arg, sample))
            tensor_dims.append(dim)
        elif dim is None and arg.is_constant():
            body_args.append(arg)
        else:
            raise _refuse(what, f"batching {arg.describe()}")
    body = trace_body(tx, value.fn, body_args, {}, what)
    leaves = leaves_of(body.result, what)
    if len(leaves) != len(body.outputs) or not leaves:
        raise _refuse(what, "whose function returns something other than tensors it computes")
    lifted = [None] * (len(body.operands) - len(tensor_dims))
    options = (tuple(tensor_dims + lifted), out_dims, value.options.get("randomness", "error"))
    options += (value.options.get("chunk_size"),)
    return _emit(tx, higher_order.vmap, body, options)


def _call_grad(tx: Translator, value: TransformedValue, args: list[Value]) -> Value:
    what = value.describe()
    argnums = value.options.get("argnums", 0)
    positions = (argnums,) if isinstance(argnums, int) else argnums
    if not isinstance(positions, tuple) or not all(isinstance(p, int) for p in positions):
        raise _refuse(what, f"with argnums={argnums!r}")
    if not all(isinstance(a, TensorValue) for a in args):
        raise _refuse(what, "with arguments that are not tensors")
    if not all(-len(args) <= p < len(args) for p in positions):
        raise _refuse(what, f"with argnums={argnums!r} for {len(args)} arguments")
    body = trace_body(tx, value.fn, [Argument(a, a.example) for a in args], {}, what)
    leaves = leaves_of(body.result, what)
    if len(leaves) != 1 or len(body.outputs) != 1 or body.outputs[0].example.numel() != 1:
        raise _refuse(what, "whose function does not return one single-element tensor")
    normalized = tuple(p % len(args) for p in positions)
    grads = _emit(tx, higher_order.grad, body, (normalized,))
    return grads.items[0] if isinstance(argnums, int) else grads


def _emit(tx: Translator, target: Any, body: Any, options: tuple) -> Value:
    """The transform's node; its outputs' metadata from running it on meta examples."""
    attr = add_submodule(tx.ctx.out, "transform_body", body.gm)
    examples = [n.meta["example_value"] for n in body.operands]
    try:
        results = run_on_meta("call_function", target, [body.gm, *options, *examples], {})
    except Exception as exc:
        raise _refuse(target.__name__, f"fails on the example inputs: {exc}") from exc
    device = body.outputs[0].device
    outs = emit_higher_order(
        tx, target, (attr, *options, *body.operands), {}, list(results), [device] * len(results)
    )
    if target is higher_order.grad:
        return TupleValue(outs)
    return rebuild_result(body.result, {id(i): o for i, o in zip(body.outputs, outs)})


class TransformInternals(Value):
    """A function of torch.func's implementation (what `jacrev(f)` returns): calling it
    breaks the graph, and it runs in Python (tracing its internals would meet functorch's
    C state one call at a time)."""

    _DIRECTORY = os.path.dirname(torch._functorch.__file__) + os.sep

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    @classmethod
    def covers(cls, fn: types.FunctionType) -> bool:
        """Written in torch/_functorch (functools.wraps hides it from `__module__`), but
        functional_call: plain Python over the module's parameter tables, traced inline."""
        return fn.__code__.co_filename.startswith(cls._DIRECTORY) and fn is not (
            torch.func.functional_call
        )

    def describe(self) -> str:
        return f"{self.fn.__code__.co_filename.rsplit(os.sep, 1)[-1]}:{self.fn.__qualname__}"

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        raise _refuse(self.describe(), "(a torch.func transform) is not captured by ember")


def _unsupported_transform(name: str) -> Any:
    def handler(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        raise _refuse(f"torch.func.{name}", "is not captured by ember")

    return handler


for _name in (
    "jacrev",
    "jacfwd",
    "vjp",
    "jvp",
    "hessian",
    "linearize",
    "functionalize",
    "grad_and_value",
):
    handles(getattr(torch.func, _name))(_unsupported_transform(_name))
