"""Callables during capture: user functions (inlined), closures made in the frame, bound
methods, functools.partial, builtins and torch functions.

User functions are never run: their bytecode is interpreted by a child translator that shares
the graph, guards and ledger (inlining). Torch functions become graph nodes. Builtins go
through the table in `builtins.py`, keyed by the builtin object itself.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.guards import GuardKind
from ember.capture.sources import AttrSource, ConstSource, ItemSource, Source
from ember.capture.values.base import (
    ConstantValue,
    FoldingRaised,
    MissingAttribute,
    Value,
    all_constant,
)
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


def _name(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or ""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    return f"{module}.{qual}" if module and module != "builtins" else qual


_SETS_GRAD_MODE = (torch.inference_mode.__enter__, torch.inference_mode.__exit__)
"""Functions that run at a break and set the grad mode themselves (break_site.py)."""


class UserFunctionValue(Value):
    """A Python function defined outside the frame (the builder guards its identity)."""

    def __init__(self, fn: types.FunctionType, source=None) -> None:
        self.fn = fn
        self.source = source
        self.cached_by: Any = None
        """The source of the functools.lru_cache wrapper it is called through: inlined, the
        function body is traced, but code run at a graph break calls the wrapper, so the
        cache (and a `warning_once`) behaves as in Python."""
        self.by_code = False
        """Guarded by its code, not its identity (a local function or closure, which its
        maker makes anew on each call): its cells, defaults and names are read through its
        source, and generated code reloads it from there."""

    def describe(self) -> str:
        return f"function {_name(self.fn)}"

    def python_type(self) -> type:
        return types.FunctionType

    def is_constant(self) -> bool:
        return not self.by_code

    def as_constant(self) -> Any:
        return self.fn

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        from ember.capture.values.built_modules import module_init
        from ember.capture.values.compiler import is_constant_result, runs_in_python

        fn = self.fn
        if fn is torch.amp.autocast_mode.autocast.__exit__ and _entered_outside(args):
            from ember.capture.handlers.control import leave_entered_block

            return leave_entered_block(tx, args[0])
        why = runs_in_python(fn)
        if why is not None:
            exc = Unsupported(BreakReason.UNSUPPORTED_CALL, f"{self.describe()} {why}")
            exc.sets_grad_mode = fn in _SETS_GRAD_MODE
            raise exc
        if is_constant_result(fn):
            return _constant_result(tx, fn, args, kwargs)
        if module_init(tx, fn, args, kwargs):
            return ConstantValue(None)
        source = self.source or ConstSource(fn, _name(fn))
        defaults = GuardedDefaults(tx, fn, source)
        kwdefaults = GuardedKwDefaults(tx, fn, source)
        closure = [
            RealCell(c, _cell_source(self.source, i, c))
            if self.source is None or not self.by_code
            else RealCell(c, _cell_source(self.source, i, c), _cell_holder(self.source, i), False)
            for i, c in enumerate(fn.__closure__ or ())
        ]
        return tx.inline_call(
            fn.__code__,
            fn.__globals__,
            args,
            kwargs,
            defaults,
            kwdefaults,
            closure,
            self.describe(),
        )

    def getattr(self, tx: Translator, name: str) -> Value:
        return function_attribute(tx, self, self.fn, name)

    def reconstruct(self, em: Emitter) -> None:
        if self.cached_by is not None:
            return self.cached_by.emit(em.cg)
        if self.source is not None:
            return super().reconstruct(em)
        em.cg.load_const(self.fn)


def _constant_result(tx: Translator, fn: Any, args: list[Value], kwargs: dict) -> Value:
    """assume_constant_result: called now, on constants; its result is baked in unguarded."""
    if not all_constant(args) or not all_constant(list(kwargs.values())):
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"{_name(fn)} (assume_constant_result) called with values known only at run time",
        )
    try:
        result = fn(
            *(a.as_constant() for a in args), **{k: v.as_constant() for k, v in kwargs.items()}
        )
    except Exception as exc:
        raise FoldingRaised(exc, f"{_name(fn)} raised {type(exc).__name__}: {exc}") from exc
    return tx.ctx.builder.wrap_const(result)


_FUNCTION_CONSTANT_ATTRS = frozenset(
    ["__name__", "__qualname__", "__module__", "__doc__", "__code__"]
)
"""Attributes read as constants once the function object is pinned (by its ID_MATCH guard,
or because the trace made it). `__code__` could be reassigned, but inlining already runs the
code object the function had at capture, so reading it adds no assumption of its own."""


def function_attribute(tx: Translator, owner: Value, fn: types.FunctionType, name: str) -> Value:
    """`fn.name` for a Python function: the constant attributes above, the defaults (what
    inlining uses too) and entries of the function's `__dict__` (`__wrapped__` set by
    functools.wraps, a decorator's marker), read through a guarded source when there is one."""
    by_code = getattr(owner, "by_code", False) and owner.source is not None
    if name in _FUNCTION_CONSTANT_ATTRS and not (by_code and name != "__code__"):
        return ConstantValue(getattr(fn, name))
    if name in _FUNCTION_CONSTANT_ATTRS:  # names of a function guarded by its code only
        return tx.ctx.builder.wrap(getattr(fn, name), AttrSource(owner.source, name))
    if name in ("__defaults__", "__kwdefaults__", "__annotations__"):
        if by_code:  # this call's function has its own (a default made by its maker)
            return tx.ctx.builder.wrap(getattr(fn, name), AttrSource(owner.source, name))
        return tx.ctx.builder.wrap_const(getattr(fn, name))
    if name in fn.__dict__:
        if owner.source is not None:
            return tx.ctx.builder.wrap(fn.__dict__[name], AttrSource(owner.source, name))
        return tx.ctx.builder.wrap_const(fn.__dict__[name])
    if name == "__dict__" or hasattr(types.FunctionType, name):
        return Value.getattr(owner, tx, name)
    raise MissingAttribute(f"function {_name(fn)!r} has no attribute {name!r}")


class GuardedDefaults:
    """`fn.__defaults__` as argument binding reads it: a default is wrapped, and so guarded
    (a changed default must recompile), only when a call leaves its parameter out."""

    def __init__(self, tx: Translator, fn: types.FunctionType, source: Source) -> None:
        self.tx = tx
        self.values = fn.__defaults__ or ()
        self.source = AttrSource(source, "__defaults__")
        self._guarded = False

    def __len__(self) -> int:
        if not self._guarded and self.values:
            self._guarded = True
            self.tx.ctx.guards.add(GuardKind.LENGTH_MATCH, self.source, (tuple, len(self.values)))
        return len(self.values)

    def __getitem__(self, index: int) -> Value:
        return self.tx.ctx.builder.wrap(self.values[index], ItemSource(self.source, index))


class GuardedKwDefaults:
    """`fn.__kwdefaults__` likewise: a keyword-only default is guarded when it is used."""

    def __init__(self, tx: Translator, fn: types.FunctionType, source: Source) -> None:
        self.tx = tx
        self.values = fn.__kwdefaults__ or {}
        self.source = AttrSource(source, "__kwdefaults__")

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def __getitem__(self, name: str) -> Value:
        self.tx.ctx.guards.add(GuardKind.DICT_CONTAINS, self.source, (name, True))
        return self.tx.ctx.builder.wrap(self.values[name], ItemSource(self.source, name))


class RealCell:
    """A real closure cell (of the compiled function or of an inlined one) and the source
    through which its contents are read and guarded.

    `holder` reloads the cell object itself in generated code (None: the cell is the same on
    every call and is loaded as a constant). `fixed` says whether it is: a cell of a function
    guarded by identity is; one that a resume function receives as a parameter, or one of a
    closure guarded by its code (made again on each call), is not, and nothing made at
    capture time may hold it."""

    def __init__(
        self,
        cell: types.CellType,
        source: Source,
        holder: Source | None = None,
        fixed: bool = True,
    ) -> None:
        self.cell = cell
        self.source = source
        self.holder = holder
        self.fixed = fixed

    def emit(self, cg: Any) -> None:
        """Push the cell object."""
        if self.holder is not None:
            self.holder.emit(cg)
        else:
            cg.load_const(self.cell)


def _cell_source(owner: Source | None, index: int, cell: types.CellType) -> Source:
    if owner is None:
        return AttrSource(ConstSource(cell, "cell"), "cell_contents")
    return AttrSource(_cell_holder(owner, index), "cell_contents")


def _cell_holder(owner: Source, index: int) -> Source:
    return ItemSource(AttrSource(owner, "__closure__"), index)


class NestedFunctionValue(Value):
    """A function or lambda created by MAKE_FUNCTION during capture."""

    def __init__(
        self,
        code: types.CodeType,
        f_globals: dict,
        defaults: tuple[Value, ...],
        kwdefaults: dict[str, Value],
        closure: tuple,
        qualname: str,
    ) -> None:
        self.code = code
        self.f_globals = f_globals
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure
        self.qualname = qualname
        self.annotations: Value | None = None
        """MAKE_FUNCTION's annotations (a tuple of names and values, 3.11-3.13)."""
        self.written: dict[str, Value] = {}
        """The naming attributes the trace set (functools.wraps: `__name__`, `__doc__`, ...)."""
        self.namespace: Value | None = None
        """Its `__dict__` (a DictValue, made when first read or written: `__wrapped__`)."""

    def describe(self) -> str:
        return f"function {self.qualname}"

    def contained(self) -> list[Value]:
        inside = [*self.defaults, *self.kwdefaults.values()]
        inside += [c.contents for c in self.closure if getattr(c, "contents", None) is not None]
        return inside

    def reconstruct(self, em: Emitter) -> None:
        """Made again as CPython's MAKE_FUNCTION makes it (name, qualname, module and doc
        come from the code and the globals), with its defaults, keyword defaults and
        annotations, and a closure of real cells: a cell of a frame is the very cell that
        frame's resume function gets (`Emitter.load_cell`), so writes on either side are
        seen by the other."""
        from ember.capture.values.containers import DictValue, TupleValue

        cg = em.cg
        cg.load_const(types.FunctionType, push_null=True)
        cg.load_const(self.code)
        cg.load_const(self.f_globals)
        cg.load_const(None)
        if self.defaults:
            em.reconstruct(TupleValue(list(self.defaults)))
        else:
            cg.load_const(None)
        if self.closure:
            for cell in self.closure:
                em.load_cell(cell)
            cg.build("TUPLE", len(self.closure))
        else:
            cg.load_const(None)
        cg.call(5)
        parts = {
            "__kwdefaults__": DictValue(dict(self.kwdefaults)) if self.kwdefaults else None,
            "__annotations__": self.annotations_dict(),
        }
        parts.update(self.written)
        if self.namespace is not None:
            if not all(isinstance(k, str) for k in self.namespace.items):
                raise Unsupported(BreakReason.UNSUPPORTED_OBJECT, f"{self.describe()}'s __dict__")
            parts.update(self.namespace.items)
        for attr, value in parts.items():
            if value is not None:  # stack: function, value, function
                em.reconstruct(value)
                cg.copy(2)
                cg.store_attr(attr)

    def python_type(self) -> type:
        return types.FunctionType

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return tx.inline_call(self.code, *self._frame_parts(args, kwargs))

    def _frame_parts(self, args: list[Value], kwargs: dict[str, Value]) -> tuple:
        return (
            self.f_globals,
            args,
            kwargs,
            self.defaults,
            self.kwdefaults,
            list(self.closure),
            self.describe(),
        )

    def annotations_dict(self) -> Value | None:
        """`__annotations__` as a dict (one object, as CPython's function keeps one), from
        MAKE_FUNCTION's tuple of names and values; None when the function has none."""
        from ember.capture.values.containers import DictValue, TupleValue

        if isinstance(self.annotations, TupleValue):
            pairs = self.annotations.items
            names = [p.as_constant() for p in pairs[0::2]]
            self.annotations = DictValue(dict(zip(names, pairs[1::2])))
        return self.annotations

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.containers import DictValue, TupleValue

        if name == "__defaults__":
            return TupleValue(list(self.defaults)) if self.defaults else ConstantValue(None)
        if name == "__kwdefaults__":
            return DictValue(dict(self.kwdefaults)) if self.kwdefaults else ConstantValue(None)
        if name == "__annotations__":
            if self.annotations_dict() is None:
                self.annotations = DictValue({})
            return self.annotations
        if name in self.written:
            return self.written[name]
        if name in ("__name__", "__qualname__"):
            return ConstantValue(self.code.co_name if name == "__name__" else self.qualname)
        if name == "__code__":
            return ConstantValue(self.code)
        if name == "__module__":
            return ConstantValue(self.f_globals.get("__name__"))
        if name == "__doc__":  # MAKE_FUNCTION's: the code's first constant, if a string
            first = self.code.co_consts[0] if self.code.co_consts else None
            return ConstantValue(first if isinstance(first, str) else None)
        if name == "__type_params__" and hasattr(types.FunctionType, name):  # 3.12+
            return ConstantValue(())  # MAKE_FUNCTION's (a generic function sets its own)
        if name == "__dict__":
            return self._namespace()
        if self.namespace is not None and self.namespace.contains(ConstantValue(name)):
            return self.namespace.items[name]
        return super().getattr(tx, name)

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        """What functools.wraps writes; the function's code, defaults and closure stay."""
        if name in ("__defaults__", "__kwdefaults__", "__code__", "__closure__", "__dict__"):
            return super().setattr(tx, name, value)
        from ember.capture.values.reachability import reachable

        if reachable([value], [self]):  # `g.me = g`: break code cannot make the cycle again
            raise Unsupported(
                BreakReason.UNSUPPORTED_OBJECT,
                f"{self.describe()} made during capture would refer to itself through "
                f"`.{name}`: the attribute is set in Python",
            )
        tx.ctx.effects.touch(self)
        if name == "__annotations__":
            self.annotations = value
        elif name in _NAMING_ATTRIBUTES:
            self.written[name] = value
        else:
            self._namespace().items[name] = value

    def _namespace(self) -> Value:
        from ember.capture.values.containers import DictValue

        if self.namespace is None:
            self.namespace = DictValue({})
        return self.namespace


_NAMING_ATTRIBUTES = frozenset(
    ["__module__", "__name__", "__qualname__", "__doc__", "__type_params__"]
)


class MethodValue(Value):
    """`receiver.name` for a receiver that implements the method itself (tensor, list, ...)."""

    def __init__(self, receiver: Value, name: str) -> None:
        self.receiver = receiver
        self.name = name

    def describe(self) -> str:
        return f"method {self.name} of {self.receiver.describe()}"

    def python_type(self) -> type:
        """A method written in Python (`Tensor.backward`) binds as a `method`; one in C
        (`Tensor.sum`, `list.append`) as a builtin method."""
        attr = inspect.getattr_static(self.receiver.python_type(), self.name, None)
        return types.MethodType if isinstance(attr, types.FunctionType) else types.BuiltinMethodType

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return self.receiver.call_method(tx, self.name, args, kwargs)

    def reconstruct(self, em: Emitter) -> None:
        em.reconstruct(self.receiver)
        em.cg.load_attr(self.name)


class BoundMethodValue(Value):
    """A user function bound to a symbolic `self` (methods of modules and user objects)."""

    def __init__(self, fn: Value, receiver: Value, source=None) -> None:
        self.fn = fn
        self.receiver = receiver
        self.source = source

    def describe(self) -> str:
        return f"method {self.fn.describe()}"

    def python_type(self) -> type:
        return types.MethodType

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return self.fn.call(tx, [self.receiver, *args], kwargs)

    def reconstruct(self, em: Emitter) -> None:
        """`types.MethodType(fn, receiver)`: the very function the trace bound. Loading
        `receiver.<name>` instead finds whatever the receiver's class resolves the name to:
        for a method reached through `super()` that is the subclass's override, which break
        code would then run (again) in place of the base's method; and the attribute may be
        named otherwise than the function (an lru_cache wrapper, an alias)."""
        if self.source is not None:
            return super().reconstruct(em)
        em.cg.load_const(types.MethodType, push_null=True)
        em.reconstruct(self.fn)
        em.reconstruct(self.receiver)
        em.cg.call(2)

    def getattr(self, tx: Translator, name: str) -> Value:
        if name == "__self__":
            return self.receiver
        if name == "__func__":
            return self.fn
        return self.fn.getattr(tx, name)


class PartialValue(Value):
    """functools.partial: reached from the frame (its parts guarded, `real` the object) or
    made in the trace (rebuilt by calling functools.partial again if it escapes)."""

    def __init__(
        self,
        fn: Value,
        args: list[Value],
        kwargs: dict[str, Value],
        source: Source | None = None,
        real: functools.partial | None = None,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.source = source
        self.real = real

    def describe(self) -> str:
        return f"functools.partial({self.fn.describe()})"

    def python_type(self) -> type:
        return type(self.real) if self.real is not None else functools.partial

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return self.fn.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.containers import DictValue, TupleValue

        if name == "func":
            return self.fn
        if name == "args":
            return TupleValue(self.args)
        if name == "keywords":
            return DictValue(dict(self.kwargs))
        if self.real is not None and name in self.real.__dict__:  # set on the partial
            return tx.ctx.builder.wrap(self.real.__dict__[name], AttrSource(self.source, name))
        if name in ("__doc__", "__module__"):
            return ConstantValue(getattr(self.python_type(), name))
        raise MissingAttribute(f"'functools.partial' object has no attribute {name!r}")

    def contained(self) -> list[Value]:
        return [self.fn, *self.args, *self.kwargs.values()]

    def reconstruct(self, em: Emitter) -> None:
        if self.source is not None:
            return super().reconstruct(em)
        em.cg.load_const(functools.partial, push_null=True)
        for part in [self.fn, *self.args, *self.kwargs.values()]:
            em.reconstruct(part)
        em.cg.call(1 + len(self.args) + len(self.kwargs), tuple(self.kwargs))


def _materialized(tx: Translator, value: Value) -> Value:
    from ember.capture.values.containers import IteratorValue, TupleValue

    return TupleValue(value.iterate(tx)) if isinstance(value, IteratorValue) else value


def generic_alias(cls: Any, key: Value) -> Value | None:
    """`list[Tensor]`, `dict[str, int]`: a type subscripted by constant types is a typing
    alias (what `typing.cast(list[Tensor], xs)` in torch.optim passes), folded here."""
    if not isinstance(cls, type) or "__class_getitem__" not in dir(cls) or not key.is_constant():
        return None
    try:
        return ConstantValue(cls[key.as_constant()])
    except TypeError:
        return None


class _FunctionObjectValue(Value):
    """A function known by identity (a builtin or a torch function): a constant that is
    rebuilt by loading the object itself; calls go through the builtins table first."""

    kind = "function"

    def __init__(self, fn: Any, source=None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"{self.kind} {_name(self.fn)}"

    def python_type(self) -> type:
        return type(self.fn)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.fn

    def getattr(self, tx: Translator, name: str) -> Value:
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantValue(getattr(self.fn, name))
        attr = getattr(self.fn, name, None)
        if isinstance(attr, types.BuiltinMethodType):  # dict.fromkeys, itertools.chain.from_...
            return BuiltinValue(attr)
        if attr is None and not hasattr(self.fn, name):
            raise MissingAttribute(f"{self.describe()} has no attribute {name!r}")
        return super().getattr(tx, name)

    def getitem(self, tx: Translator, key: Value) -> Value:
        alias = generic_alias(self.fn, key)
        return alias if alias is not None else super().getitem(tx, key)

    def reconstruct(self, em: Emitter) -> None:
        em.cg.load_const(self.fn)

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        from ember.capture.values.builtins import BUILTINS

        handler = BUILTINS.get(self.fn)
        if handler is not None:
            return handler(tx, args, kwargs)
        return self.call_unlisted(tx, args, kwargs)

    def call_unlisted(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        raise NotImplementedError


class BuiltinValue(_FunctionObjectValue):
    """A function implemented in C or a pure helper: run through the builtins table, or
    folded when it is pure and all arguments are constants."""

    kind = "builtin"

    def call_unlisted(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        from ember.capture.values.builtins import is_pure

        if is_pure(self.fn):  # iterators of constants are consumed as the call would
            args = [_materialized(tx, a) for a in args]
        if is_pure(self.fn) and all_constant(args) and all_constant(list(kwargs.values())):
            try:
                result = self.fn(
                    *(a.as_constant() for a in args),
                    **{k: v.as_constant() for k, v in kwargs.items()},
                )
            except Exception as exc:
                raise FoldingRaised(
                    exc, f"{_name(self.fn)} raised {type(exc).__name__}: {exc}"
                ) from exc
            return tx.ctx.builder.wrap_const(result)
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"call to {_name(self.fn)}",
            hint="ember cannot look inside this function; move the call out of the compiled "
            "region or wrap the tensor work around it",
        )


def _entered_outside(args: list[Value]) -> bool:
    """`autocast.__exit__`'s arguments: a real torch.autocast object (not one the trace made,
    whose block the trace entered), with no exception (None, None, None)."""
    from ember.capture.values.objects import UserObjectValue

    return (
        len(args) == 4
        and isinstance(args[0], UserObjectValue)
        and not args[0].is_new
        and all(a.is_constant() and a.as_constant() is None for a in args[1:])
    )


# torch functions that change global state or leave the graph: refused, never traced.
_REFUSED_TORCH = {
    torch.manual_seed: "torch.manual_seed changes global random state",
    torch.set_default_dtype: "torch.set_default_dtype changes global state",
    torch.use_deterministic_algorithms: "torch.use_deterministic_algorithms changes global state",
    torch.set_printoptions: "torch.set_printoptions changes global state",
    torch.save: "torch.save writes files",
    torch.load: "torch.load reads files",
    **{
        setter: f"torch.{setter.__name__} changes autocast's state (enter a torch.autocast "
        "block instead)"
        for setter in (
            torch.set_autocast_enabled,
            torch.set_autocast_dtype,
            torch.set_autocast_cache_enabled,
            torch.autocast_increment_nesting,
            torch.autocast_decrement_nesting,
            torch.clear_autocast_cache,
        )
    },
}


class TorchFunctionValue(_FunctionObjectValue):
    """A torch / torch.nn.functional function: its call becomes a graph node."""

    kind = "torch function"

    def call_unlisted(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        from ember.capture.values.tensor import tensor_op

        if self.fn in _REFUSED_TORCH:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, _REFUSED_TORCH[self.fn])
        if self.fn in (torch.addcdiv, torch.addcmul) and len(args) == 3 and "out" not in kwargs:
            # the method's form, which writes a tensor `value=` as torch.compile does
            return args[0].call_method(tx, self.fn.__name__, args[1:], kwargs)
        return tensor_op(tx, "call_function", self.fn, args, kwargs)
