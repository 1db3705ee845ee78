"""Classes during capture: calling one constructs (namedtuples, tuple and list subclasses,
dataclasses, enums, plain Python classes, dict subclasses, nn.Modules); reading an attribute
reads the class (guarded); writing one goes to the mutation ledger, replayed after the graph.

There is one `ClassValue` per class in a capture (the builder keeps them), so a class
attribute written by the trace is seen by every later read, also by instances (see
`pending_class_attribute`).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import types
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.sources import AttrSource, ConstSource, Source
from ember.capture.values.base import (
    ConstantValue,
    FoldingRaised,
    MissingAttribute,
    Value,
    all_constant,
    from_class_statement,
)
from ember.capture.values.builtins import handles
from ember.capture.values.containers import DictValue, ListValue, TupleValue, iterator_over
from ember.capture.values.functions import BoundMethodValue, UserFunctionValue, generic_alias
from ember.capture.values.objects import UserObjectValue, _class_attribute, python_override
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


_FUNCTION_APPLY = torch.autograd.Function.__dict__["apply"]
"""`MyFn.apply` of a custom autograd.Function: one graph node (values/autograd_function.py)."""


class ClassValue(Value):
    """A class: calling it constructs; its attributes are read through a guarded source."""

    def __init__(self, cls: type, source: Source | None = None) -> None:
        self.cls = cls
        self.source = source

    def describe(self) -> str:
        return f"class {self.cls.__qualname__}"

    def python_type(self) -> type:
        return type(self.cls)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.cls

    def truth(self, tx: Translator) -> bool:
        """A class is true, unless its metaclass says otherwise (EnumType keeps it true)."""
        meta = type(self.cls)
        if meta is type or issubclass(meta, enum.EnumMeta):
            return True
        return super().truth(tx)

    def reconstruct(self, em: Emitter) -> None:
        em.cg.load_const(self.cls)

    def getattr(self, tx: Translator, name: str) -> Value:
        pending = tx.ctx.effects.load_attr(self, name)
        if pending is not None:
            return pending
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantValue(getattr(self.cls, name))
        for klass in self.cls.__mro__:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if attr is _FUNCTION_APPLY:
                    from ember.capture.values.autograd_function import FunctionApplyValue

                    return FunctionApplyValue(self)
                if isinstance(attr, classmethod):
                    return BoundMethodValue(UserFunctionValue(attr.__func__), self)
                if isinstance(attr, staticmethod):
                    return tx.ctx.builder.wrap_const(attr.__func__)
                break
        # a class attribute may be rebound between calls: read it through a guarded source
        try:
            attr = getattr(self.cls, name)
        except AttributeError as exc:
            raise MissingAttribute(f"class {self.cls.__name__!r} has no {name!r}") from exc
        return tx.ctx.builder.wrap(attr, AttrSource(self._source(), name))

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        """`Cls.attr = v` (a counter, a registry, a cached table): replayed after the graph.
        Only plain attributes: a descriptor on the metaclass would take the write over."""
        if not from_class_statement(self.cls) or hasattr(type(self.cls), name):
            return super().setattr(tx, name, value)
        tx.ctx.effects.store_attr(self, name, value)

    def _source(self) -> Source:
        return self.source or ConstSource(self.cls, self.cls.__qualname__)

    # an Enum class is a container of its members
    def iterate(self, tx: Translator) -> list[Value]:
        if issubclass(self.cls, enum.Enum):
            return [ConstantValue(member) for member in self.cls]
        return super().iterate(tx)

    def length(self, tx: Translator) -> int:
        if issubclass(self.cls, enum.Enum):
            return len(self.cls)
        return super().length(tx)

    def getitem(self, tx: Translator, key: Value) -> Value:
        if issubclass(self.cls, enum.Enum):
            return ConstantValue(self.cls[key.as_constant()])
        alias = generic_alias(self.cls, key)
        return alias if alias is not None else super().getitem(tx, key)

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        cls = self.cls
        if issubclass(cls, tuple) and hasattr(cls, "_fields"):
            return _construct_namedtuple(tx, cls, args, kwargs)
        if issubclass(cls, BaseException):
            from ember.capture.values.exceptions import construct_exception

            return construct_exception(tx, cls, args, kwargs)
        if issubclass(cls, enum.Enum):  # a lookup of a member by value
            return _fold(cls, args, kwargs)
        if issubclass(cls, torch.nn.Module):
            from ember.capture.values.modules import construct_module

            return construct_module(tx, cls, args, kwargs)
        if issubclass(cls, dict):
            return _construct_dict_object(tx, cls, args, kwargs)
        if issubclass(cls, (tuple, list)):
            return _construct_sequence(tx, cls, args, kwargs)
        if cls is types.MethodType and len(args) == 2 and not kwargs:  # contextlib.ExitStack
            fn = args[0]
            if not isinstance(fn, UserFunctionValue) and isinstance(
                getattr(fn, "fn", None), types.FunctionType
            ):  # a Python function read from a class ember lists as a builtin's
                fn = UserFunctionValue(fn.fn)
            if isinstance(fn, UserFunctionValue):
                return BoundMethodValue(fn, args[1])
        meta_call = type(cls).__call__
        if meta_call is not type.__call__ and isinstance(meta_call, types.FunctionType):
            # a metaclass's own __call__ (which usually calls type.__call__ through super())
            return UserFunctionValue(meta_call).call(tx, [self, *args], kwargs)
        return self.construct(tx, args, kwargs)

    def builtin_method(
        self, tx: Translator, descriptor: Any, args: list[Value], kwargs: dict[str, Value]
    ) -> Value:
        """`type.__call__(cls, ...)` reached through `super().__call__` in a metaclass:
        the construction itself, without the metaclass's __call__ again."""
        if descriptor is type.__call__:
            return self.construct(tx, args, kwargs)
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"builtin method {descriptor!r}")

    def construct(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """What `type.__call__` does for a class statement's class: `__new__`, `__init__`."""
        cls = self.cls
        if not from_class_statement(cls):
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"constructing {cls.__module__}.{cls.__qualname__}, a class implemented in C",
            )
        if cls in _DEPRECATED_AUTOCASTS:
            return _construct_deprecated_autocast(tx, cls, args, kwargs)
        if getattr(cls, "__abstractmethods__", None):  # an abc class with abstract methods
            try:
                object.__new__(cls)  # raises CPython's own TypeError, and runs no user code
            except TypeError as exc:
                raise FoldingRaised(exc, f"TypeError: {exc}") from None
        if issubclass(cls, torch.nn.Parameter):  # as Dynamo (graph_break_on_nn_param_ctor)
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"{cls.__qualname__}(...) made in the trace: a new leaf tensor that requires "
                "grad, which a graph cannot make",
                hint="make parameters in __init__",
            )
        if cls is _BUFFER:  # the tensor, detached and marked (torch's Python, traced)
            return UserFunctionValue(cls.__new__).call(tx, [self, *args], kwargs)
        if cls.__new__ is not object.__new__:
            return self._construct_with_new(tx, args, kwargs)
        if not isinstance(cls.__init__, types.FunctionType) and cls.__init__ is not object.__init__:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"constructing {cls.__qualname__}")
        obj = UserObjectValue(cls)
        if cls.__init__ is not object.__init__:
            UserFunctionValue(cls.__init__).call(tx, [obj, *args], kwargs)
        elif args or kwargs:
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED, f"TypeError: {cls.__name__}() takes no arguments"
            )
        return obj

    def _construct_with_new(
        self, tx: Translator, args: list[Value], kwargs: dict[str, Value]
    ) -> Value:
        """A class whose `__new__` is written in Python over object's (a cache, a
        singleton, a validated constructor): `__new__` traced, then `__init__` if what it
        made is an instance of the class, as `type.__call__` does."""
        cls = self.cls
        if not isinstance(cls.__new__, types.FunctionType) or not plain_new(cls):
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"constructing {cls.__qualname__}, a class with its own __new__",
            )
        made = UserFunctionValue(cls.__new__).call(tx, [self, *args], kwargs)
        init = cls.__init__
        if not isinstance(made, UserObjectValue) or not issubclass(made.cls, cls):
            return made  # not an instance: no __init__ (type.__call__'s rule)
        if isinstance(init, types.FunctionType):
            UserFunctionValue(init).call(tx, [made, *args], kwargs)
        elif init is not object.__init__:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"constructing {cls.__qualname__}")
        return made


def plain_new(cls: type) -> bool:
    """Whether every `__new__` of `cls`'s MRO is written in Python but object's: an
    instance is then made by `object.__new__(cls)` (in the trace, and when break code makes
    it again without running the Python ones)."""
    for klass in cls.__mro__:
        new = klass.__dict__.get("__new__")
        if new is None or klass is object:
            continue
        if not (isinstance(new, staticmethod) and isinstance(new.__func__, types.FunctionType)):
            return False
    return True


_BUFFER = getattr(torch.nn, "Buffer", None)
"""torch >= 2.5's buffer marker: `Buffer(t)` is `t.detach()` with `persistent` and
`_is_buffer` set on it (a plain Tensor, so no `__init__`), which `Module.__setattr__`
registers as `register_buffer` would."""

_DEPRECATED_AUTOCASTS = (torch.cpu.amp.autocast, torch.cuda.amp.autocast)
"""torch.autocast subclasses marked `typing_extensions.deprecated`: their `__new__` warns
(FutureWarning), then makes the object as object.__new__ does; their `__init__` calls
torch.autocast's with the device."""


def _construct_deprecated_autocast(
    tx: Translator, cls: type, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    """The warning is issued while capturing, at the user's line and through the
    `__warningregistry__` of the user's module, as eager's first call issues it (under the
    default filters, once per line; a cached call does not warn again), then the object is
    made and its `__init__` inlined as for other classes."""
    import warnings

    where, _ = tx.location()
    filename, _, line = where.rpartition(":")
    warnings.warn_explicit(
        cls.__deprecated__,
        FutureWarning,
        filename,
        int(line) if line.isdigit() else 0,
        module=tx.f_globals.get("__name__"),
        registry=tx.f_globals.setdefault("__warningregistry__", {}),
        module_globals=tx.f_globals,
    )
    obj = UserObjectValue(cls)
    UserFunctionValue(cls.__init__).call(tx, [obj, *args], kwargs)
    return obj


def pending_class_attribute(tx: Translator, cls: type, name: str) -> Value | None:
    """A write the trace made to `name` on `cls` or a base, which instances see."""
    for klass in cls.__mro__:
        if from_class_statement(klass):
            pending = tx.ctx.effects.load_attr(tx.ctx.builder.class_value(klass), name)
            if pending is not None:
                return pending
        if name in klass.__dict__:
            return None
    return None


def _fold(cls: type, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if not all_constant(args) or not all_constant(list(kwargs.values())):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"{cls.__name__} of non-constants")
    kw = {k: v.as_constant() for k, v in kwargs.items()}
    return ConstantValue(cls(*(a.as_constant() for a in args), **kw))


def _construct_namedtuple(tx: Translator, cls: type, args: list[Value], kwargs: dict) -> Value:
    fields = cls._fields
    values = dict(zip(fields, args))
    values.update(kwargs)
    defaults = getattr(cls, "_field_defaults", {})
    missing = [f for f in fields if f not in values and f not in defaults]
    if missing or len(args) > len(fields):
        raise Unsupported(BreakReason.EXCEPTION_RAISED, f"TypeError: {cls.__name__}() arguments")
    items = [values[f] if f in values else tx.ctx.builder.wrap_const(defaults[f]) for f in fields]
    return TupleValue(items, struct_type=cls)


def _construct_sequence(tx: Translator, cls: type, args: list[Value], kwargs: dict) -> Value:
    """A tuple or list subclass that keeps the builtin construction (its methods written in
    Python are inlined on the value, see SequenceValue.getattr)."""
    if (
        kwargs
        or len(args) > 1
        or any(python_override(cls, n) is not None for n in ("__new__", "__init__"))
    ):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"constructing {cls.__qualname__}")
    items = iterator_over(tx, args[0]).iterate(tx) if args else []
    if issubclass(cls, tuple):
        return TupleValue(items, struct_type=cls)
    result = ListValue(items)
    result.list_type = cls
    return result


def _construct_dict_object(tx: Translator, cls: type, args: list[Value], kwargs: dict) -> Value:
    """`cls(...)` for a dict subclass written in Python: the builtin `__new__`, then its
    `__init__` (a dataclass's generated one for ModelOutput), inlined."""
    from ember.capture.values.mappings import DictObjectValue, storage_type

    if storage_type(cls) is None or python_override(cls, "__new__") is not None:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"constructing {cls.__qualname__}")
    obj = DictObjectValue(cls)
    _class_attribute(tx, obj, cls, "__init__", None).call(tx, args, kwargs)
    return obj


# dataclasses: fields are read from the class, so the helpers need not look at Field objects


def _dataclass_of(value: Value) -> type:
    cls = value.python_type()
    if not dataclasses.is_dataclass(cls) or isinstance(value, ClassValue):
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "TypeError: a dataclass instance needed")
    return cls


@handles(dataclasses.replace)
def _replace(tx, args, kwargs):
    """A new instance made by the class's `__init__` from the old fields and the changes,
    as dataclasses.replace does (init=False fields cannot be changed)."""
    obj = args[0]
    cls = _dataclass_of(obj)
    init = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            if field.name in kwargs:
                raise Unsupported(BreakReason.EXCEPTION_RAISED, f"ValueError: {field.name}")
            continue
        init[field.name] = (
            kwargs[field.name] if field.name in kwargs else obj.getattr(tx, field.name)
        )
    return tx.ctx.builder.class_value(cls).call(tx, [], init)


def _plain_copy(as_dict: bool):
    def handler(tx, args, kwargs):
        if kwargs:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, "asdict/astuple with a factory")
        return _as_plain(tx, args[0], as_dict)

    return handler


handles(dataclasses.asdict)(_plain_copy(as_dict=True))
handles(dataclasses.astuple)(_plain_copy(as_dict=False))


def _as_plain(tx: Translator, value: Value, as_dict: bool) -> Value:
    """dataclasses' recursive copy: dataclasses become dicts (or tuples), containers are
    copied, other values are deep-copied (constants are their own copy; anything else,
    whose deep copy ember does not model, is refused)."""
    try:
        kind = value.python_type()
    except Unsupported:
        kind = None
    if kind is not None and dataclasses.is_dataclass(kind) and not isinstance(value, ClassValue):
        parts = [
            (f.name, _as_plain(tx, value.getattr(tx, f.name), as_dict))
            for f in dataclasses.fields(kind)
        ]
        if as_dict:
            return DictValue(dict(parts))
        return TupleValue([v for _, v in parts])
    if isinstance(value, TupleValue) and value.struct_type is None or isinstance(value, ListValue):
        items = [_as_plain(tx, v, as_dict) for v in value.items]
        return TupleValue(items) if isinstance(value, TupleValue) else ListValue(items)
    if isinstance(value, DictValue) and value.dict_type is dict:
        return DictValue({k: _as_plain(tx, v, as_dict) for k, v in value.items.items()})
    if value.is_constant() and type(value.as_constant()) in (int, float, str, bool, type(None)):
        return value
    raise Unsupported(
        BreakReason.UNSUPPORTED_CALL,
        f"dataclasses.asdict deep-copies {value.describe()}, which ember does not model",
    )


@handles(dataclasses.is_dataclass)
def _is_dataclass(tx, args, kwargs):
    value = args[0]
    target = value.as_constant() if isinstance(value, ClassValue) else value.python_type()
    return ConstantValue(dataclasses.is_dataclass(target))


# copy.copy / copy.deepcopy of plain data: what `copy` does through `__reduce_ex__(4)` for
# a class that customises none of it: a new instance of the class, its `__dict__` copied.

_COPY_HOOKS = ("__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__", "__getstate__")
_COPY_HOOKS += ("__setstate__", "__getnewargs__", "__getnewargs_ex__")


def _copies_plainly(cls: type) -> bool:
    """`copy` would make `cls.__new__(cls)` and copy the instance dict, and that is all."""
    return (
        all(python_override(cls, name) is None for name in _COPY_HOOKS)
        and cls.__new__ is object.__new__
        and not any("__slots__" in klass.__dict__ for klass in cls.__mro__)
    )


def _copy_value(tx: Translator, value: Value, deep: bool, memo: dict[int, Value]) -> Value:
    if id(value) in memo:
        return memo[id(value)]
    if value.is_constant() and isinstance(
        value.as_constant(), (int, float, str, bool, bytes, type(None), complex, enum.Enum)
    ):
        return value  # immutable: its own copy
    inner = (lambda v: _copy_value(tx, v, deep, memo)) if deep else (lambda v: v)
    if isinstance(value, TupleValue) and value.struct_type is None:
        copied: Value = TupleValue([inner(v) for v in value.items]) if deep else value
    elif isinstance(value, ListValue) and value.list_type is list:
        copied = ListValue([])
        memo[id(value)] = copied
        copied.items = [inner(v) for v in value.items]
    elif isinstance(value, DictValue) and value.dict_type is dict:
        copied = DictValue({})
        memo[id(value)] = copied
        copied.items = {k: inner(v) for k, v in value.items.items()}
    elif (
        isinstance(value, UserObjectValue)
        and type(value) is UserObjectValue
        and _copies_plainly(value.cls)
    ):
        state = value.getattr(tx, "__dict__")
        copied = UserObjectValue(value.cls)
        memo[id(value)] = copied
        entries = state.iterate(tx)
        copied.attrs = {k.as_constant(): inner(state.getitem(tx, k)) for k in entries}
    else:
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"copy.{'deepcopy' if deep else 'copy'} of {value.describe()}",
        )
    memo[id(value)] = copied
    return copied


def _copier(deep: bool):
    def handler(tx, args, kwargs):
        if len(args) != 1 or kwargs:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, "copy with a memo")
        return _copy_value(tx, args[0], deep, {})

    return handler


handles(copy.copy)(_copier(deep=False))
handles(copy.deepcopy)(_copier(deep=True))
