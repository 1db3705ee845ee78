"""Tensors during capture: an fx node plus a meta example carrying dtype, shape, stride and
requires_grad (the real device is kept beside it); and the one path by which any torch call
becomes a graph node.

`tensor_op` runs the call on the meta examples (so shapes and errors are exactly PyTorch's),
then records a node whose arguments are the same values in graph form. Results that are plain
Python values (sizes, flags) become constants and leave no node behind.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_leaves

from ember import torch_compat
from ember.capture import autocast
from ember.capture.guards import GuardKind
from ember.capture.shapes import SYM_TYPES
from ember.capture.sources import AttrSource, ItemSource, MethodResultSource
from ember.capture.values.base import ConstantValue, MissingAttribute, Value
from ember.capture.values.inference_mode import made_tensor_is_inference, records_no_autograd
from ember.capture.values.meta import is_data_dependent_error, result_device, run_on_meta
from ember.capture.values.objects import pin_class_attribute
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator

# Attributes whose value is fixed by the tensor's metadata (pinned by the tensor guard).
_META_ATTRS = frozenset(
    [
        "shape",
        "dtype",
        "device",
        "ndim",
        "requires_grad",
        "is_cuda",
        "layout",
        "is_sparse",
        "is_quantized",
        "is_meta",
        "is_cpu",
        "is_mps",
        "itemsize",
        "is_nested",
        "is_mkldnn",
        "is_sparse_csr",
        "nbytes",
    ]
)
# Attributes that are tensors: recorded as getattr nodes.
_TENSOR_ATTRS = frozenset(["T", "mT", "H", "mH", "real", "imag", "data"])
# Methods whose result depends on a storage the example does not have.
_STORAGE_STATE = frozenset(["storage_offset", "is_conj", "is_neg", "is_shared", "is_pinned"])
# Methods whose result is fixed by metadata.
_META_METHODS = frozenset(
    [
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "stride",
        "is_contiguous",
        "element_size",
        "is_floating_point",
        "is_complex",
        "get_device",
        "is_signed",
        "has_names",
    ]
)
# Methods that hand tensor data to Python: the graph must end before them.
_TO_PYTHON = frozenset(
    [
        "item",
        "tolist",
        "numpy",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__len__",
        "cpu_data",
    ]
)
_SCALED_BY_A_NUMBER = frozenset({"addcdiv", "addcdiv_", "addcmul", "addcmul_"})
"""Ops whose `value=` must be a Python number (a tensor there fails in the meta kernel)."""

_REFUSED = {
    "backward": "calling backward() inside a compiled region",
    "retain_grad": "retain_grad()",
    "data_ptr": "data pointers",
    "untyped_storage": "storage access",
}


def _asks_for_grad(args: list[Value], kwargs: dict[str, Value]) -> bool:
    flag = args[0] if args else kwargs.get("requires_grad")
    return flag is None or not flag.is_constant() or bool(flag.as_constant())


class TensorValue(Value):
    inference: bool | None = None
    """Whether it is an inference tensor, where known (see `is_inference`)."""
    grad_fn: Value | None = None
    """The stand-in of its `grad_fn` last read (values/grad_fn.py)."""
    python_attrs: dict[str, Value] | None = None
    """Constants set as Python attributes on a tensor the trace made (`nn.Buffer`'s
    `persistent` and `_is_buffer`): read back from here, and set on the real tensor where
    it leaves the graph."""

    def __init__(
        self, node: torch.fx.Node, example: torch.Tensor, device: torch.device, source=None
    ) -> None:
        self.node = node
        self.example = example
        self.device = device
        """Where the real tensor lives (the meta example only knows 'meta')."""
        self.source = source
        self.python_cls = torch.Tensor

    def describe(self) -> str:
        shape = "x".join(str(s) for s in self.example.shape)
        return (
            f"tensor {self.node.name} ({str(self.example.dtype).removeprefix('torch.')}[{shape}])"
        )

    def python_type(self) -> type:
        return self.python_cls

    def as_constant(self) -> Any:
        from ember.capture.values.base import NotConstant

        raise NotConstant(self.describe(), BreakReason.TENSOR_TO_PYTHON)

    def truth(self, tx: Translator) -> bool:
        count = self.example.numel()
        if isinstance(count, int) and count != 1:  # what eager raises, known from the size
            from ember.capture.values.exceptions import raise_in_trace

            what = "no values" if count == 0 else "more than one value"
            message = f"Boolean value of Tensor with {what} is ambiguous"
            raise_in_trace(tx, RuntimeError, [ConstantValue(message)], f"RuntimeError: {message}")
        raise Unsupported(
            BreakReason.DATA_DEPENDENT_BRANCH,
            f"branching on the value of {self.describe()}",
            hint="use torch.where, or move the branch outside the compiled function",
        )

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.functions import MethodValue

        if self.python_attrs is not None and name in self.python_attrs:
            return self.python_attrs[name]
        if name in _DEVICE_ATTRS:
            return ConstantValue(_DEVICE_ATTRS[name](self.device))
        if name in ("is_leaf", "grad_fn"):
            return self._autograd_history(tx, name)
        if name in _META_ATTRS:
            return ConstantValue(getattr(self.example, name))
        if name in _TENSOR_ATTRS:
            return tensor_op(tx, "call_function", getattr, [self, ConstantValue(name)], {})
        if name == "grad":
            return self._grad(tx)
        if name == "__class__":  # pinned by the tensor's guard (its type), or made here
            return tx.ctx.builder.wrap_const(self.python_cls)
        if callable(getattr(torch.Tensor, name, None)):
            return MethodValue(self, name)
        if not hasattr(torch.Tensor, name):
            # what eager raises: getattr(x, name, default) and hasattr(x, name) rely on it
            raise MissingAttribute(f"tensor has no attribute {name!r}")
        raise Unsupported(BreakReason.UNSUPPORTED_ATTRIBUTE, f"tensor attribute {name!r}")

    def _storage_state(self, tx: Translator, name: str) -> Value:
        """What the example does not mirror of an outside tensor (its offset into its
        storage, its conjugate and negative bits, shared or pinned memory): read from the
        tensor and guarded. Of a tensor made in the trace, the conjugate and negative bits
        are the example's (inputs' examples lack them: a known gap); its offset may be that
        of a view of an input, which the example cannot know: a break."""
        real = tx.ctx.builder.real_object(self) if self.source is not None else None
        if real is None and name in ("is_conj", "is_neg"):
            return ConstantValue(getattr(self.example, name)())
        if real is None:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"Tensor.{name}() of {self.describe()}")
        value = getattr(real, name)()
        tx.ctx.guards.add(GuardKind.EQUALS_MATCH, MethodResultSource(self.source, name), value)
        return ConstantValue(value)

    def _autograd_history(self, tx: Translator, name: str) -> Value:
        """`is_leaf`, and `grad_fn` where it is None: from the example, which mirrors an
        outside tensor's history on the call captured; a later call's tensor may have
        another (`x * 2` for a leaf), so the answer is guarded. A `grad_fn` that is not None
        is a stand-in (values/grad_fn.py)."""
        real = tx.ctx.builder.real_object(self) if self.source is not None else None
        leaf = self.example.is_leaf if real is None else real.is_leaf
        if real is not None:
            tx.ctx.guards.add(GuardKind.EQUALS_MATCH, AttrSource(self.source, "is_leaf"), leaf)
        if name == "is_leaf":
            return ConstantValue(leaf)
        if leaf or not self.example.requires_grad:  # requires_grad: the tensor's own guard
            return ConstantValue(None)
        from ember.capture.values.grad_fn import GradFnValue

        # one node until an in-place op gives the tensor a new one (`g is t.grad_fn`)
        if self.grad_fn is None or self.grad_fn.version != self.example._version:
            self.grad_fn = GradFnValue(self)
        return self.grad_fn

    def _grad(self, tx: Translator) -> Value:
        """`p.grad` of a tensor from outside (an optimizer reading its parameters' gradients):
        the gradient as it is now, a graph input (or None), guarded through `p.grad`, or what
        the trace assigned to it. Backward breaks the graph. A tensor made in the trace has
        no gradient the capture could know: a break."""
        assigned = tx.ctx.effects.load_attr(self, "grad")
        if assigned is not None:
            return assigned
        real = tx.ctx.builder.real_object(self) if self.source is not None else None
        if real is None:
            raise Unsupported(
                BreakReason.UNSUPPORTED_ATTRIBUTE, f"reading .grad of {self.describe()}"
            )
        return tx.ctx.builder.wrap(real.grad, AttrSource(self.source, "grad"))

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        """`p.grad = None` (or a gradient of p's size, dtype and device, which is all that
        eager accepts) on a tensor from outside: written after the graph, read back from
        the ledger until then. A constant set on a tensor the trace made is kept with it
        (`python_attrs`)."""
        if self.source is None and value.is_constant() and not hasattr(torch.Tensor, name):
            self.python_attrs = {**(self.python_attrs or {}), name: value}
            return None
        if name != "grad" or self.source is None or not self._fits_as_grad(value):
            return super().setattr(tx, name, value)
        tx.ctx.effects.store_attr(self, name, value)

    def _fits_as_grad(self, value: Value) -> bool:
        if value.is_constant():
            return value.as_constant() is None
        mine, given = self.example, getattr(value, "example", None)
        return (
            isinstance(value, TensorValue)
            and value.device == self.device
            and given.dtype == mine.dtype
            and given.shape == mine.shape
            and given.layout == mine.layout
        )

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        member = getattr(torch.Tensor, name, None)
        if member is not None:  # `torch.Tensor.relu = ...` after the capture changes the call
            pin_class_attribute(tx, torch.Tensor, name, member)
        if name in _STORAGE_STATE:
            return self._storage_state(tx, name)
        if name in _META_METHODS:
            from ember.capture.values.base import constants

            kw = {k: v.as_constant() for k, v in kwargs.items()}
            result = getattr(self.example, name)(*constants(args), **kw)
            return ConstantValue(result)
        if name == "type" and not args and not kwargs:  # the type's name, with the real device
            probe = torch.empty(0, dtype=self.example.dtype, device=self.device)
            return ConstantValue(probe.type())
        if name in _TO_PYTHON:
            raise Unsupported(
                BreakReason.TENSOR_TO_PYTHON,
                f"Tensor.{name}() on {self.describe()} needs the tensor's data in Python",
                hint="keep the value as a tensor, or move this outside the compiled function",
            )
        if name == "register_hook":
            from ember.capture.values.tensor_hooks import register_hook

            return register_hook(tx, self, args, kwargs)
        if name == "is_inference" and not args and not kwargs:
            return ConstantValue(self.is_inference(tx))
        if name in _REFUSED:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, _REFUSED[name])
        if name == "requires_grad_" and self.source is None and _asks_for_grad(args, kwargs):
            # a tensor the graph makes would come out of it with no autograd history of
            # its own: it must be made a leaf in Python, as Dynamo breaks here too
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"requires_grad_() on {self.describe()}, a tensor made in the graph",
                hint="call requires_grad_() outside the compiled function, or detach the "
                "result if only its values are needed",
            )
        if name in _SCALED_BY_A_NUMBER and len(args) == 2 and kwargs.keys() == {"value"}:
            if isinstance(kwargs["value"], TensorValue):
                return self._scaled_by_a_tensor(tx, name, args, kwargs["value"])
        return tensor_op(tx, "call_method", name, [self, *args], kwargs)

    def _scaled_by_a_tensor(
        self, tx: Translator, name: str, args: list[Value], scale: TensorValue
    ) -> Value:
        """`p.addcdiv_(a, b, value=t)` with a 0-d tensor `t` (torch.optim's Adam while
        compiling, where its step counts stay tensors): `value` must be a Python number, so
        the op is written as `p.add_(a / b * t)`, as torch.compile writes it."""
        combine = operator.truediv if name.startswith("addcdiv") else operator.mul
        term = tensor_op(tx, "call_function", combine, list(args), {})
        term = tensor_op(tx, "call_function", operator.mul, [term, scale], {})
        return tensor_op(
            tx, "call_method", "add_" if name.endswith("_") else "add", [self, term], {}
        )

    def is_inference(self, tx: Translator) -> bool:
        """Whether it is an inference tensor: a tensor from outside says so itself (its
        TENSOR_MATCH guard checks its dispatch keys, which differ for inference tensors); a
        tensor the trace made, by the mode it was made in (values/inference_mode.py). The
        meta examples are ordinary tensors, so they cannot tell."""
        known = self.known_inference(tx)
        if known is None:
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"Tensor.is_inference() of {self.describe()}, a view whose base is not known",
            )
        return known

    def known_inference(self, tx: Translator) -> bool | None:
        if self.inference is None and self.source is not None:
            real = tx.ctx.builder.real_object(self)
            if isinstance(real, torch.Tensor):
                self.inference = real.is_inference()
        return self.inference

    def length(self, tx: Translator) -> int:
        if self.example.dim() == 0:
            raise Unsupported(BreakReason.EXCEPTION_RAISED, "len() of a 0-d tensor")
        return self.example.shape[0]

    def iterate(self, tx: Translator) -> list[Value]:
        return [
            tensor_op(tx, "call_function", operator.getitem, [self, ConstantValue(i)], {})
            for i in range(self.length(tx))
        ]

    def getitem(self, tx: Translator, key: Value) -> Value:
        return tensor_op(tx, "call_function", operator.getitem, [self, key], {})

    def setitem(self, tx: Translator, key: Value, value: Value) -> None:
        tensor_op(tx, "call_function", operator.setitem, [self, key, value], {})

    def reconstruct(self, em: Emitter) -> None:
        if not self.python_attrs:
            return em.load_tensor(self)
        em.cg.load_const(_with_attrs, push_null=True)
        em.load_tensor(self)
        em.attribute_map(self.python_attrs)
        em.cg.call(2)
        return None

    def is_buffer_marked(self, tx: Translator) -> bool:
        """`isinstance(t, nn.Buffer)`: `nn.Buffer`'s metaclass asks for a true `_is_buffer`
        attribute on the tensor. Of an outside tensor, its instance dict is read and
        guarded (present or not, and the flag)."""
        if self.source is None:
            flag = (self.python_attrs or {}).get("_is_buffer")
            return flag is not None and bool(flag.as_constant())
        real = tx.ctx.builder.real_object(self)
        if real is None:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, "isinstance(tensor, nn.Buffer)")
        table = AttrSource(self.source, "__dict__")
        present = "_is_buffer" in real.__dict__
        tx.ctx.guards.add(GuardKind.DICT_CONTAINS, table, ("_is_buffer", present))
        if not present:
            return False
        flag = real.__dict__["_is_buffer"]
        tx.ctx.guards.add(GuardKind.EQUALS_MATCH, ItemSource(table, "_is_buffer"), flag)
        return bool(flag)


def _with_attrs(tensor: torch.Tensor, attrs: dict[str, Any]) -> torch.Tensor:
    """Run-time half of a tensor made in the graph that the trace set attributes on."""
    for name, value in attrs.items():
        setattr(tensor, name, value)
    return tensor


def _map_tensors(
    value: Value, leaf: Callable[[TensorValue], Any], size: Callable[[Any], Any] | None = None
) -> Any:
    """The value as a Python argument, with each tensor replaced by `leaf(tensor)` and, with
    `size`, each symbolic size (a SymInt in a constant) by `size(symint)`."""
    from ember.capture.values.containers import SequenceValue, SliceValue
    from ember.capture.values.list_objects import ListObjectValue

    if isinstance(value, TensorValue):
        return leaf(value)
    if isinstance(value, ListObjectValue):  # a list subclass: torch takes it as a list
        value = value.contents
    if isinstance(value, SequenceValue):
        items = [_map_tensors(v, leaf, size) for v in value.items]
        return items if value.python_type() is list else tuple(items)
    if isinstance(value, SliceValue):
        return slice(*(_map_tensors(v, leaf, size) for v in value.parts))
    if value.is_constant():
        const = _python_scalar(value.symbolic())
        return _map_sizes(const, size) if size is not None else const
    raise Unsupported(
        BreakReason.UNSUPPORTED_OBJECT, f"{value.describe()} passed to a tensor operation"
    )


def _is_numpy_scalar(const: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(const, numpy.generic)


def _python_scalar(const: Any) -> Any:
    """A numpy scalar (`np.finfo(np.float32).eps`) as the Python number torch takes it for
    in an op (the same weak type in promotion); the graph's code then names no numpy.
    Constant tuples and lists (sizes) are converted item by item."""
    if _is_numpy_scalar(const):
        return const.item()
    if type(const) in (tuple, list) and any(map(_is_numpy_scalar, const)):
        return type(const)(map(_python_scalar, const))
    return const


_DATA_FACTORIES = frozenset([torch.tensor, torch.as_tensor, torch.asarray])
"""Factories whose result dtype follows their data: a numpy float64 there makes a float64
tensor where a Python float makes the default dtype."""


def _numpy_data_dtype(target: Any, args: list[Value], kwargs: dict[str, Value]) -> dict:
    """`torch.tensor(np.float64(2.0))`: the data reach the graph as Python numbers, so the
    dtype numpy's scalars give the tensor is passed explicitly (computed here, on the
    constant data)."""
    if target not in _DATA_FACTORIES or "dtype" in kwargs or not args:
        return kwargs
    from ember.capture.values.base import NotConstant

    try:
        data = args[0].as_constant()
    except NotConstant:  # tensors among them: copied as they are
        return kwargs
    if not any(map(_is_numpy_scalar, tree_leaves(data))):
        return kwargs
    return {**kwargs, "dtype": ConstantValue(target(data).dtype)}


def _map_sizes(const: Any, size: Callable[[Any], Any]) -> Any:
    if isinstance(const, SYM_TYPES):
        return size(const)
    if type(const) in (tuple, list, torch.Size) and any(isinstance(c, SYM_TYPES) for c in const):
        items = [_map_sizes(c, size) for c in const]
        return items if type(const) is list else tuple(items)
    return const


def graph_arg(value: Value, out: Any) -> Any:
    """The value as an fx node argument of `out`'s graph: tensors become their nodes,
    symbolic sizes the nodes computing them."""
    return _map_tensors(value, lambda t: t.node, out.size_arg)


def example_arg(value: Value) -> Any:
    """The value with tensors replaced by their meta examples."""
    return _map_tensors(value, lambda t: t.example)


_DEVICE_ATTRS = {
    "device": lambda d: d,
    "is_cuda": lambda d: d.type == "cuda",
    "is_cpu": lambda d: d.type == "cpu",
    "is_mps": lambda d: d.type == "mps",
    "is_meta": lambda d: d.type == "meta",
}


def _op_name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", repr(target))


def tensor_op(
    tx: Translator, kind: str, target: Any, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    """Record a torch call as a graph node and return the symbolic result. Under autocast,
    the casts autocast makes on the inputs are recorded first (capture/autocast.py)."""
    inputs = _tensor_values([*args, *kwargs.values()])
    if autocast.active(tx.ctx.autocast) and any(t.example.is_floating_point() for t in inputs):
        cast = _autocast_inputs(tx, kind, target, args, kwargs, inputs)
        if cast:
            args = [_substituted(a, cast) for a in args]
            kwargs = {k: _substituted(v, cast) for k, v in kwargs.items()}
            inputs = _tensor_values([*args, *kwargs.values()])
    kwargs = _numpy_data_dtype(target, args, kwargs)
    ex_args = [example_arg(a) for a in args]
    ex_kwargs = {k: example_arg(v) for k, v in kwargs.items()}
    name = _op_name(target)
    versions = [t.example._version for t in inputs]
    try:
        no_autograd = records_no_autograd(tx.ctx.out)
        result = run_on_meta(kind, target, ex_args, ex_kwargs, no_autograd=no_autograd)
    except Unsupported:
        raise
    except Exception as exc:
        if is_data_dependent_error(exc):
            raise Unsupported(
                BreakReason.DATA_DEPENDENT_OP,
                f"{name}: output shape depends on tensor values",
                hint="ember specializes on static shapes; move this op outside the compiled region",
            ) from exc
        raise Unsupported(
            BreakReason.TENSOR_OP_FAILED, f"{name} raised {type(exc).__name__}: {exc}"
        ) from exc
    out = tx.ctx.out
    node_args = tuple(graph_arg(a, out) for a in args)
    node_kwargs = {k: graph_arg(v, out) for k, v in kwargs.items()}
    node = tx.ctx.out.create_node(kind, target, node_args, node_kwargs)
    written = [t for t, v in zip(inputs, versions) if t.example._version != v]
    if written:
        tx.ctx.out.check_writes(written)
        tx.ctx.effects.touch()  # wrote to a tensor: a side effect, as a list append is
    device = result_device(kind, target, ex_args, ex_kwargs, [t.device for t in inputs])
    wrapped = wrap_result(tx, node, result, device, inputs)
    subclass = _result_subclass(inputs)
    for made in _tensor_values([wrapped]):
        if made.node is not None and all(made is not t for t in inputs):
            made.python_cls = subclass
            view = made.example._is_view()
            bases = [(t.example, t.known_inference(tx)) for t in inputs] if view else []
            made.inference = made_tensor_is_inference(tx.ctx.out, made.example, bases)
    return wrapped


def _autocast_inputs(
    tx: Translator,
    kind: str,
    target: Any,
    args: list[Value],
    kwargs: dict[str, Value],
    inputs: list[TensorValue],
) -> dict[int, TensorValue]:
    """The inputs autocast casts before this op, each as its recorded `.to(dtype)` (keyed
    by the id of the input's value)."""
    devices = {id(t.example): t.device for t in inputs}
    by_example = {id(t.example): t for t in inputs}
    try:
        dtypes = autocast.input_casts(
            tx.ctx.autocast,
            kind,
            target,
            [example_arg(a) for a in args],
            {k: example_arg(v) for k, v in kwargs.items()},
            devices,
        )
    except Exception as exc:
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"{_op_name(target)} under torch.autocast: its casts could not be made explicit "
            f"({type(exc).__name__}: {exc})",
            hint="call this op outside the autocast region",
        ) from exc
    return {
        id(by_example[key]): tensor_op(
            tx, "call_method", "to", [by_example[key], ConstantValue(dtype)], {}
        )
        for key, dtype in dtypes.items()
    }


def _substituted(value: Value, replacements: dict[int, Value]) -> Value:
    """`value` with the tensors in `replacements` (by id) replaced, inside lists too."""
    from ember.capture.values.containers import SequenceValue

    if id(value) in replacements:
        return replacements[id(value)]
    if isinstance(value, SequenceValue) and any(id(v) in replacements for v in value.items):
        return type(value)([_substituted(v, replacements) for v in value.items])
    return value


def _result_subclass(inputs: list[TensorValue]) -> type:
    """The class of the tensors an op returns, as torch's `__torch_function__` protocol
    makes it: Tensor's own `__torch_function__` converts them to the class of the first
    overriding argument (a subclass before its bases); a class that disables it
    (nn.Parameter) gives plain tensors."""
    found = torch.Tensor
    for tensor in inputs:
        cls = tensor.python_cls
        override = getattr(cls, "__torch_function__", None)
        if cls is torch.Tensor or override is torch_compat.disabled_torch_function:
            continue
        if found is torch.Tensor or (issubclass(cls, found) and cls is not found):
            found = cls
    return found


def _tensor_values(values: list[Value]) -> list[TensorValue]:
    from ember.capture.values.containers import SequenceValue

    found = []
    for value in values:
        if isinstance(value, TensorValue):
            found.append(value)
        elif isinstance(value, SequenceValue):
            found.extend(_tensor_values(value.items))
    return found


def _returned_input(
    result: torch.Tensor, device: torch.device, inputs: list[TensorValue]
) -> TensorValue | None:
    """The argument an op handed back as its result: in-place methods (`y.add_(1)`, `w += 1`)
    and conversions that change nothing (`x.to(x.device)`, `x.contiguous()`) return the very
    object they were called on, which `is` and the caller can see. Their meta kernels do the
    same on the examples; a device move is told apart by the real device."""
    for value in inputs:
        if value.example is result and value.device == device:
            return value
    return None


def wrap_result(
    tx: Translator,
    node: torch.fx.Node,
    result: Any,
    device: torch.device,
    inputs: list[TensorValue] = (),
) -> Value:
    """Symbolic value for a node's meta result (tensors, tuples of tensors, or constants).
    A result that is one of the `inputs` themselves is that input's value: the node stays in
    the graph for its effect, and later reads go on using the input's node, which the graph
    has mutated by then."""
    from ember.capture.values.containers import TupleValue

    if isinstance(result, torch.Tensor):
        node.meta["example_value"] = result
        same = _returned_input(result, device, inputs)
        if same is not None:
            return same
        return TensorValue(node, result, device)
    if isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in result):
        node.meta["example_value"] = result
        items = []
        for i, item in enumerate(result):
            if isinstance(item, torch.Tensor):
                sub = tx.ctx.out.create_node("call_function", operator.getitem, (node, i), {})
                sub.meta["example_value"] = item
                same = _returned_input(item, device, inputs)
                items.append(same or TensorValue(sub, item, device))
            else:
                items.append(ConstantValue(_free_of_tensors(node, item)))
        struct = type(result) if isinstance(result, tuple) and type(result) is not tuple else None
        if isinstance(result, list):
            from ember.capture.values.containers import ListValue

            return ListValue(items)
        return TupleValue(items, struct_type=struct)
    if result is not None:  # a None result is kept: the call was made for its effect
        tx.ctx.out.erase_node(node)
    return ConstantValue(_free_of_tensors(node, result))


def _free_of_tensors(node: torch.fx.Node, value: Any) -> Any:
    """A result kept as a constant must hold no tensor: the ones in a dict or a nested list
    are the capture's meta examples, which the code after the graph would be handed."""
    if any(isinstance(leaf, torch.Tensor) for leaf in tree_leaves(value)):
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"{_op_name(node.target)} returns tensors inside a {type(value).__name__}",
        )
    return value
