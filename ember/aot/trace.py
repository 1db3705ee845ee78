"""ember's dispatch-level tracer: run a program on meta tensors and record every aten op.

Takes any Python callable over tensors (a torch-level fx.GraphModule, or the joint
forward+backward function of joint.py) and meta stand-ins for its inputs; returns a
*functional* aten-level `torch.fx.Graph` whose nodes call `OpOverload`s
(`torch.ops.aten.add.Tensor`) and carry `meta["val"]`, a meta tensor with what eager would
have produced (shape, dtype, strides).

How: a `TorchDispatchMode` (the recorder) sees every aten op on the meta tensors that stand for
the program's tensors (ember/meta.py: no FakeTensorMode, so no torch._dynamo import). Each op
runs on the meta tensors (so shapes and strides are PyTorch's own; device arguments are
redirected to meta while it runs and recorded with the inputs' real device) and is appended
to the graph, with tensor arguments replaced by the nodes holding their *current* values
(functionalize.AliasTracker): in-place and `out=` ops are recorded as their functional forms
and views of mutated tensors are regenerated. Python scalars stay constants in the graph; real
tensors that show up (constants of the traced program) become `get_attr` constants.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._sympy.functions import FloorDiv, PythonMod

from ember import torch_compat
from ember.aot import convolution
from ember.aot.attention import EagerAttention
from ember.aot.dropout import FusedDropout
from ember.aot.functionalize import (
    AliasTracker,
    ViewStep,
    functional_variant,
    is_inplace,
    is_view_op,
    mutated_args,
)
from ember.aot.symbolic import SYM_TYPES, is_symbolic
from ember.aot.symbolic_meta import SymbolicMeta
from ember.errors import BreakReason, Unsupported
from ember.meta import META, to_meta
from ember.torch_compat import python_dispatcher

aten = torch.ops.aten


def _map_args(fn: Callable[[Any], Any], tree: Any) -> Any:
    """`fn` applied to the leaves of an aten call's arguments. Those only nest tuples, lists
    and dicts, so this plain walk does what pytree's tree_map would at a fraction of its
    cost (the tracer maps every op's arguments several times)."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind([_map_args(fn, a) for a in tree])
    if kind is dict:
        return {k: _map_args(fn, v) for k, v in tree.items()}
    return fn(tree)


def _leaves(tree: Any) -> Iterator[Any]:
    kind = type(tree)
    if kind is tuple or kind is list:
        for a in tree:
            yield from _leaves(a)
    elif kind is dict:
        for a in tree.values():
            yield from _leaves(a)
    else:
        yield tree


def _as_list(arg: Any) -> list[Any]:
    return list(arg) if isinstance(arg, (list, tuple)) else [arg]


class TraceError(Unsupported):
    """The program cannot be traced into an aten graph (data-dependent value, odd aliasing)."""


class RunEagerly(TraceError):
    """A graph whose eager behaviour a compiled forward/backward pair would not reproduce
    (an input that requires grad rebased by an in-place op under grad; a value the backward
    needs overwritten in place): the torch-level graph then runs as it is, so autograd does
    exactly what it does in eager, errors included."""


def _fail(detail: str, hint: str = "") -> TraceError:
    return TraceError(BreakReason.TENSOR_OP_FAILED, detail, hint=hint)


class _Recorder(TorchDispatchMode):
    """Forwards every aten op to the tracer, which runs it on meta tensors and records it."""

    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return self.tracer.dispatch(func, args, kwargs or {})


class _PythonData(TorchFunctionMode):
    """Python data that PyTorch turns into a tensor directly on a traced tensor's device,
    without an aten op, keeps no values on a meta tensor: `x[[0, 2]]` (CPython makes the
    list an index tensor) and `x.new_tensor([1, 2])`. Such data is made a real tensor here
    first, on the graph's device, which the recorder sees as a constant of the graph."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in _INDEXING and len(args) > 1:
            args = (args[0], _index_tensors(args[1]), *args[2:])
        elif func is torch.Tensor.new_tensor and len(args) > 1 and args[0].is_meta:
            if not any(isinstance(leaf, torch.Tensor) for leaf in _leaves(args[1])):
                return self._new_tensor(args[0], args[1], **kwargs)
        return func(*args, **kwargs)

    def _new_tensor(
        self,
        like: torch.Tensor,
        data: Any,
        dtype: torch.dtype | None = None,
        device: Any = None,
        requires_grad: bool = False,
        **layout: Any,
    ) -> torch.Tensor:
        if device is None or torch.device(device).type == "meta":
            device = self.device
        dtype = dtype or like.dtype
        return torch.tensor(data, dtype=dtype, device=device, requires_grad=requires_grad, **layout)


_INDEXING = frozenset([torch.Tensor.__getitem__, torch.Tensor.__setitem__])


def _index_tensors(index: Any) -> Any:
    if isinstance(index, list) and all(type(i) is int for i in _leaves(index)):
        return torch.tensor(index)
    if isinstance(index, tuple):
        return tuple(_index_tensors(i) for i in index)
    return index


class Tracer:
    """Builds one functional aten graph; holds the graph, the alias state and constants."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")  # where the real tensors live
        self.graph = fx.Graph()
        self.aliases = AliasTracker(self)
        self.constants: dict[str, torch.Tensor] = {}
        self._const_ids: dict[int, torch.Tensor] = {}
        self._last_placeholder: fx.Node | None = None
        # symbolic sizes: the node computing each size expression met so far, and where each
        # size symbol can be read (a SymInt input, or a size/stride of a tensor input)
        self._sym_nodes: dict[sympy.Expr, fx.Node] = {}
        self._sym_sources: dict[sympy.Symbol, tuple[Any, fx.Node, int, Any]] = {}
        self._region: int | None = None
        self._regions = itertools.count()
        self._shortcuts: SymbolicMeta | None = None  # set when the trace is symbolic

    @contextlib.contextmanager
    def recompute_region(self) -> Iterator[None]:
        """Nodes recorded inside are tagged `meta["recompute_region"]` with the region's number:
        a checkpointed body (aot/higher_order.py), which the partitioner recomputes."""
        outer, self._region = self._region, next(self._regions)
        try:
            yield
        finally:
            self._region = outer

    # -- the Emitter protocol used by functionalize --------------------------------------------
    def emit(self, func: Any, args: tuple, kwargs: dict, val: Any) -> fx.Node:
        node = self.graph.call_function(func, args, kwargs)
        node.meta["val"] = val
        if self._region is not None:
            node.meta["recompute_region"] = self._region
        return node

    def fake(self, node: fx.Node) -> torch.Tensor:
        return node.meta["val"]

    # -- inputs --------------------------------------------------------------------------------
    def to_fake(self, t: torch.Tensor) -> torch.Tensor:
        """The meta stand-in of a real tensor (strides, offset and requires_grad kept)."""
        return to_meta(t)

    def placeholder(self, name: str, fake: Any) -> fx.Node:
        """A graph input holding `fake` (a meta tensor, or a SymInt for a symbolic size
        input); placeholders stay in front of all other nodes."""
        if self._last_placeholder is None:
            first = next(iter(self.graph.nodes), None)
            ctx = (
                self.graph.inserting_before(first)
                if first is not None
                else contextlib.nullcontext()
            )
        else:
            ctx = self.graph.inserting_after(self._last_placeholder)
        with ctx:
            node = self.graph.placeholder(name)
        node.meta["val"] = fake
        self._last_placeholder = node
        if isinstance(fake, torch.Tensor):
            self.aliases.add_root(fake, node)
            for op, values in (
                (aten.sym_size.int, fake.shape),
                (aten.sym_stride.int, fake.stride()),
            ):
                for d, v in enumerate(values):
                    if is_symbolic(v) and isinstance(v.node.expr, sympy.Symbol):
                        self._sym_sources.setdefault(v.node.expr, (op, node, d, v))
        elif is_symbolic(fake) and isinstance(fake.node.expr, sympy.Symbol):
            self._sym_nodes.setdefault(fake.node.expr, node)
        return node

    # -- symbolic sizes ------------------------------------------------------------------------
    def sym_value(self, v: Any) -> Any:
        """What the graph records for a SymInt argument: a number when its ShapeEnv knows
        it, else the node computing it from the inputs (sym_size of an input, arithmetic)."""
        expr = v.node.expr
        if expr.is_number:
            return _number(expr)
        return self._sym_expr(expr)

    def _sym_expr(self, expr: sympy.Expr) -> Any:
        if expr.is_number:
            return _number(expr)
        node = self._sym_nodes.get(expr)
        if node is not None:
            return node
        if isinstance(expr, sympy.Symbol):
            if expr not in self._sym_sources:
                raise _fail(f"size symbol {expr} is not a size of any graph input")
            op, src, d, v = self._sym_sources[expr]
            node = self.emit(op, (src, d), {}, v)
        else:
            fn = _SYM_OPS.get(type(expr)) or _SYM_OPS.get(expr.func)
            if fn is None:
                raise _fail(f"size expression {expr} ({type(expr).__name__}) is not supported")
            parts = [self._sym_expr(arg) for arg in expr.args]
            node = parts[0]
            for nxt in parts[1:]:
                val = fn(_val(node), _val(nxt))
                node = self.emit(fn, (node, nxt), {}, val)
        self._sym_nodes[expr] = node
        return node

    def _constant(self, t: torch.Tensor) -> torch.Tensor:
        """Make a real tensor met during tracing a graph constant; returns its meta stand-in."""
        fake = self._const_ids.get(id(t))
        if fake is None:
            name = f"_ember_constant{len(self.constants)}"
            self.constants[name] = t
            fake = self.to_fake(t)
            node = self.graph.get_attr(name)
            node.meta["val"] = fake
            self.aliases.add_root(fake, node)
            self._const_ids[id(t)] = fake
        return fake

    # -- recording -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Run code whose aten ops are recorded (and run on meta tensors); composite ops that
        pick their kernel by device take the one eager would take: attention on the CPU
        (attention.py), dropout elsewhere (dropout.py)."""
        by_device = EagerAttention() if self.device.type == "cpu" else FusedDropout()
        # symbolic sizes: C++ composite kernels need concrete sizes, their Python
        # decompositions (run through the Python dispatcher) take SymInts
        symbolic = python_dispatcher() if self._sym_sources or self._sym_nodes else None
        if symbolic is not None and self._shortcuts is None:
            self._shortcuts = SymbolicMeta()
        with (
            symbolic or contextlib.nullcontext(),
            _Recorder(self),
            by_device,
            _PythonData(self.device),
        ):
            yield

    def value(self, t: torch.Tensor) -> fx.Node:
        """The node holding the current value of a traced tensor."""
        if not self.aliases.known(t):
            raise _fail(
                "a tensor reached an aten op without being an input, a constant or the "
                "result of a traced op",
                hint="pass the tensor as an input of the compiled function",
            )
        return self.aliases.read(t)

    def _record(self, tree: Any) -> Any:
        """Arguments as the graph records them: tensors as value nodes, real devices (where
        the program named meta)."""

        def record(a: Any) -> Any:
            if isinstance(a, torch.Tensor):
                return self.value(a)
            if isinstance(a, SYM_TYPES):
                return self.sym_value(a)
            if isinstance(a, torch.device) and a.type == "meta":
                return self.device
            return a

        return _map_args(record, tree)

    def _lift(self, tree: Any) -> Any:
        def lift(a: Any) -> Any:
            if isinstance(a, torch.Tensor) and not a.is_meta:
                return self._constant(a)
            return a

        return _map_args(lift, tree)

    def _on_meta(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run an op on meta tensors: device arguments point at meta while it runs."""
        position = _device_position(func)
        if position is not None and position >= len(args):
            kwargs = {**kwargs, "device": META}
        args = _map_args(lambda a: META if isinstance(a, torch.device) else a, args)
        shortcuts, key = self._shortcuts, None
        if shortcuts is not None:
            out, key = shortcuts.result(func, args, kwargs)
            if out is not None:
                return out
        try:
            out = func(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as e:
            tags = getattr(func, "tags", ())
            if torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags:
                raise _fail(
                    f"{func} needs the value of a tensor (data-dependent): {e}",
                    hint="keep .item(), .tolist() and value-dependent shapes out of the "
                    "compiled region",
                ) from e
            raise
        if key is not None:
            shortcuts.remember(key, args, out)
        return out

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Record one aten op and return its (meta) result."""
        args, kwargs = self._lift((args, kwargs))
        special = _SPECIAL.get(func)
        if special is not None:
            result = special(self, func, args, kwargs)
            if result is not NotImplemented:
                return result
        if mutated_args(func):
            return self._record_mutation(func, args, kwargs)
        out = self._on_meta(func, args, kwargs)
        if not any(isinstance(o, torch.Tensor) for o in _leaves(out)):
            return out
        node = self.emit(func, self._record(args), self._record(kwargs), out)
        if is_view_op(func):
            self._bind_views(func, args, kwargs, out, node)
        else:
            self._bind_roots(out, node)
        return out

    def _bind_roots(self, out: Any, node: fx.Node) -> None:
        if isinstance(out, torch.Tensor):
            self.aliases.add_root(out, node)
            return
        for i, o in enumerate(out):
            if isinstance(o, torch.Tensor):
                item = self.emit(operator.getitem, (node, i), {}, o)
                self.aliases.add_root(o, item)

    def _bind_views(self, func: Any, args: tuple, kwargs: dict, out: Any, node: fx.Node) -> None:
        src = args[0]
        rest = args[1:]
        if any(isinstance(a, torch.Tensor) for a in _leaves((rest, kwargs))):
            raise _fail(f"view op {func} with tensor arguments is not supported")
        if isinstance(out, torch.Tensor):
            self.aliases.add_view(out, src, ViewStep(func, rest, kwargs, None), node)
            return
        for i, o in enumerate(out):
            item = self.emit(operator.getitem, (node, i), {}, o)
            self.aliases.add_view(o, src, ViewStep(func, rest, kwargs, i), item)

    def _record_mutation(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An op that writes its arguments: record its functional form, then the writes."""
        schema = func._schema
        written = mutated_args(func)
        if is_inplace(func) and is_view_op(functional_variant(func)):
            if self._sole_intermediate(args[0]):
                return self._rebind_view(func, args, kwargs)
            raise _fail(
                f"{func} changes a tensor's shape or strides in place",
                hint="use the out-of-place view (e.g. x = x.t() instead of x.t_())",
            )
        out = self._on_meta(func, args, kwargs)
        fvar = functional_variant(func)
        f_args, f_kwargs = _rebind(func, fvar, args, kwargs)
        f_val = self._on_meta(fvar, f_args, f_kwargs)
        node = self.emit(fvar, self._record(f_args), self._record(f_kwargs), f_val)
        nodes = self._items(node, f_val)
        given = dict(zip([a.name for a in schema.arguments], args, strict=False)) | kwargs
        # a foreach op writes each tensor of its list argument (`_foreach_add_(xs, 1)`)
        targets = [t for i in written for t in _as_list(given[schema.arguments[i].name])]
        if fvar._schema.name.endswith("_functional") and not is_inplace(func):
            # foo_functional returns foo's outputs, then the new values of what foo writes
            n_orig = len(schema.returns)
            outs = [out] if isinstance(out, torch.Tensor) else list(out)
            for o, n in zip(outs, nodes[:n_orig], strict=True):
                if isinstance(o, torch.Tensor):
                    self.aliases.add_root(o, n)
            nodes = nodes[n_orig:]
        for t, n in zip(targets, nodes, strict=True):
            self._write(t, n)
        return out

    def _sole_intermediate(self, t: Any) -> bool:
        """A tensor made inside the graph that nothing else views (matmul's decomposition
        squeezes such a result in place): changing its layout in place is then the same as
        rebinding it to the out-of-place view."""
        aliases = self.aliases
        if not isinstance(t, torch.Tensor) or not aliases.known(t):
            return False
        key = id(t)
        if aliases.root_of(t) != key or aliases.root_value[key].op == "placeholder":
            return False
        return not any(i.root == key for k, i in aliases.info.items() if k != key)

    def _rebind_view(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An in-place view (x.transpose_(0, 1)) of an intermediate: recorded as its
        out-of-place form, and the meta tensor takes the new layout. The node that made `x`
        keeps a stand-in with the layout it produced (its meta is what the backend sizes
        buffers by; before, the in-place op reshaped it too: nn.GRU's batch_first output)."""
        src = args[0]
        self.value(src).meta["val"] = src.as_strided(src.shape, src.stride(), src.storage_offset())
        fvar = functional_variant(func)
        f_args, f_kwargs = _rebind(func, fvar, args, kwargs)
        f_val = self._on_meta(fvar, f_args, f_kwargs)
        node = self.emit(fvar, self._record(f_args), self._record(f_kwargs), f_val)
        out = self._on_meta(func, args, kwargs)
        self.aliases.add_root(out, node)
        return out

    def _items(self, node: fx.Node, val: Any) -> list[fx.Node]:
        if isinstance(val, torch.Tensor):
            return [node]
        return [self.emit(operator.getitem, (node, i), {}, v) for i, v in enumerate(val)]

    def _write(self, target: torch.Tensor, value: fx.Node) -> None:
        """`target` now holds `value`; cast/broadcast like an in-place op would."""
        val = self.fake(value)
        if val.shape != target.shape or val.dtype != target.dtype:
            current = self.value(target)
            fake = aten.copy.default(self.fake(current), val)
            value = self.emit(aten.copy.default, (current, value), {}, fake)
        self.aliases.write(target, value)

    def finish(self, outputs: list[Any]) -> fx.GraphModule:
        """Set the graph's outputs (tensors become their value nodes); build the module."""
        return self.finish_nodes(
            [self.value(o) if isinstance(o, torch.Tensor) else o for o in outputs]
        )

    def finish_nodes(self, outputs: list[Any]) -> fx.GraphModule:
        """Set the graph's outputs (nodes or constants) and build the GraphModule."""
        out = self.graph.output(tuple(outputs))
        out.meta["val"] = tuple(o.meta["val"] if isinstance(o, fx.Node) else o for o in outputs)
        root = torch.nn.Module()
        for name, t in self.constants.items():
            setattr(root, name, t)
        self.graph.eliminate_dead_code()
        return fx.GraphModule(root, self.graph)


def _bound(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """An op's arguments by their schema names, in schema order (every one given: the
    batch-norm ops these rules serve have no defaults)."""
    names = [a.name for a in func._schema.arguments]
    given = dict(zip(names, args, strict=False)) | kwargs
    return {n: given[n] for n in names}


def _native_batch_norm(tracer: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    """native_batch_norm writes running stats without saying so in its schema."""
    bound = _bound(func, args, kwargs)
    if not bound.get("training") or bound.get("running_mean") is None:
        return NotImplemented
    out = tracer._on_meta(func, args, kwargs)
    fvar = aten._native_batch_norm_legit_functional.default
    f_args = tuple(bound.values())
    f_val = tracer._on_meta(fvar, f_args, {})
    node = tracer.emit(fvar, tracer._record(f_args), {}, f_val)
    nodes = tracer._items(node, f_val)
    for o, n in zip(out, nodes[:3], strict=True):
        tracer.aliases.add_root(o, n)
    tracer._write(bound["running_mean"], nodes[3])
    tracer._write(bound["running_var"], nodes[4])
    return out


def _batch_norm_backward(tracer: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    """In training, native_batch_norm_backward reads only the saved batch statistics, yet
    autograd hands it the running statistics too (after the forward's update): recorded as
    they come, the partitioner would save two more tensors per batch norm for a backward
    that never reads them. They are recorded as None, which the op accepts."""
    bound = _bound(func, args, kwargs)
    if not bound.get("train") or bound.get("running_mean") is None:
        return NotImplemented
    bound |= {"running_mean": None, "running_var": None}
    return tracer.dispatch(func, tuple(bound.values()), {})


def _device_position(func: Any) -> int | None:
    """Schema position of `func`'s `device` argument (factory ops and copies take one)."""
    if func not in _DEVICE_POSITION:
        names = [a.name for a in func._schema.arguments]
        _DEVICE_POSITION[func] = names.index("device") if "device" in names else None
    return _DEVICE_POSITION[func]


_DEVICE_POSITION: dict[Any, int | None] = {}


def _rebind(func: Any, fvar: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Arguments for `fvar` from a call of `func`, matched by name (written ones dropped)."""
    given = {a.name: a.default_value for a in func._schema.arguments if a.has_default_value()}
    given |= dict(zip([a.name for a in func._schema.arguments], args, strict=False)) | kwargs
    f_args: list[Any] = []
    f_kwargs: dict[str, Any] = {}
    positional = True
    for a in fvar._schema.arguments:
        if a.name not in given:
            positional = False
            continue
        if positional and not a.kwarg_only:
            f_args.append(given[a.name])
        else:
            f_kwargs[a.name] = given[a.name]
    return tuple(f_args), f_kwargs


def _number(expr: sympy.Expr) -> Any:
    return int(expr) if expr.is_integer else float(expr)


def _val(v: Any) -> Any:
    return v.meta["val"] if isinstance(v, fx.Node) else v


_SYM_OPS: dict[Any, Callable[[Any, Any], Any]] = {
    sympy.Add: operator.add,
    sympy.Mul: operator.mul,
    FloorDiv: operator.floordiv,
    PythonMod: operator.mod,
    sympy.Mod: operator.mod,
}


def _lift_fresh(tracer: Tracer, func: Any, args: tuple, kwargs: dict) -> Any:
    """`torch.tensor(data)` hands its new tensor to `lift_fresh`, which returns it as is; in
    the graph that tensor is a constant, so a copy of it is what eager's new tensor is (a
    graph returning the constant itself would return one object on every call)."""
    return tracer.dispatch(aten.lift_fresh_copy.default, args, kwargs)


SpecialRule = Callable[[Tracer, Any, tuple, dict], Any]
_SPECIAL: dict[Any, SpecialRule] = {
    aten.lift_fresh.default: _lift_fresh,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.native_batch_norm_backward.default: _batch_norm_backward,
    aten.convolution.default: convolution.convolution,
    aten.convolution_backward.default: convolution.convolution_backward,
}


def check_functional(graph: fx.Graph) -> None:
    """Verifier: no node of a traced graph may write its arguments."""
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch_compat.OpOverload):
            if mutated_args(node.target):
                raise AssertionError(f"mutating op left in functional graph: {node.format_node()}")
        if node.op not in ("output",) and "val" not in node.meta:
            raise AssertionError(f"node without meta['val']: {node.format_node()}")
