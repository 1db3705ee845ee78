"""Classes that traced code makes by calling a class factory: `collections.namedtuple(...)`
and `type(name, bases, namespace)`.

The factory runs while capturing, on the call's constant arguments, so the trace reads,
constructs and checks instances of a real class (as Dynamo does for namedtuple). Eagerly,
each call of the function makes a class of its own; so where the class (or an instance of
it) outlives the graph, the code after the graph makes it again with the same call, once
per call (`MadeClassValue.reconstruct`, deduplicated by the Emitter), and rebuilt instances
are of that class, not of the one made while capturing.
"""

from __future__ import annotations

import collections
import types
from typing import TYPE_CHECKING, Any

from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.builtins import handles
from ember.capture.values.classes import ClassValue
from ember.capture.values.containers import DictValue, TupleValue, iterator_over
from ember.capture.values.functions import NestedFunctionValue, UserFunctionValue
from ember.capture.values.objects import UserObjectValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


class MadeClassValue(ClassValue):
    """A class made in the trace by `factory(*args, **kwargs)`; it has no source (it is a
    new object on every call), and is rebuilt by that call."""

    def __init__(
        self, cls: type, factory: Any, args: list[Value], kwargs: dict[str, Value]
    ) -> None:
        super().__init__(cls)
        self.factory = factory
        self.args = args
        self.kwargs = kwargs
        self.namespace: dict[str, Value] = {}
        """`type(name, bases, ns)`: the namespace's values as the trace had them (a function
        made in the trace is read back as that value, not as the real function made for
        the class while capturing)."""
        self.written: dict[str, Value] = {}
        """Class attributes the trace set (`P.scale = 3`): set again on the class made
        after the graph, which is the only one the caller sees."""

    @property  # type: ignore[override]
    def source(self) -> None:  # noqa: D102 (always None: the builder's ConstSource is not it)
        return None

    @source.setter
    def source(self, value: Any) -> None:
        pass

    def describe(self) -> str:
        return f"class {self.cls.__qualname__} made in the trace"

    def getattr(self, tx: Translator, name: str) -> Value:
        if name in self.written:
            return self.written[name]
        if name in self.namespace:
            return self.namespace[name]
        return super().getattr(tx, name)

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        if value is self or hasattr(type(self.cls), name) or name.startswith("__"):
            raise Unsupported(
                BreakReason.SIDE_EFFECT,
                f"setting {name!r} on {self.describe()} (a special name or the class itself)",
            )
        self.written[name] = value

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        result = super().call(tx, args, kwargs)
        if isinstance(result, TupleValue) and result.struct_type is self.cls:
            result.made_class = self
        if isinstance(result, UserObjectValue) and result.cls is self.cls:
            result.made_class = self
        return result

    def reconstruct(self, em: Emitter) -> None:
        em.cg.load_const(self.factory, push_null=True)
        for arg in self.args:
            em.reconstruct(arg)
        for value in self.kwargs.values():
            em.reconstruct(value)
        em.cg.call(len(self.args) + len(self.kwargs), tuple(self.kwargs))
        for name, value in self.written.items():
            em.cg.copy(1)
            em.reconstruct(value)
            em.cg.swap(2)
            em.cg.store_attr(name)


def _made(tx: Translator, cls: type, factory: Any, args: list[Value], kwargs: dict) -> Value:
    value = MadeClassValue(cls, factory, args, kwargs)
    tx.ctx.builder.adopt_class(value)
    return value


def _constants(args: list[Value], kwargs: dict[str, Value], what: str) -> tuple[list, dict]:
    if not all(a.is_constant() for a in [*args, *kwargs.values()]):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"{what} of values that are not constants")
    return [a.as_constant() for a in args], {k: v.as_constant() for k, v in kwargs.items()}


@handles(collections.namedtuple)
def _namedtuple(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """`collections.namedtuple(name, fields, ...)`: its body runs `eval`, writes functions'
    attributes and reads the caller's frame, none of which the trace can follow (18 breaks);
    its result depends on the arguments only (and on the calling module, for `__module__`,
    which is the traced function's module here as eagerly)."""
    plain_args, plain_kwargs = _constants(args, kwargs, "collections.namedtuple")
    if "module" not in plain_kwargs:
        plain_kwargs["module"] = tx.f_globals.get("__name__", "__main__")
        kwargs = {**kwargs, "module": ConstantValue(plain_kwargs["module"])}
    try:
        cls = collections.namedtuple(*plain_args, **plain_kwargs)
    except (TypeError, ValueError) as exc:
        raise Unsupported(
            BreakReason.EXCEPTION_RAISED, f"{type(exc).__name__} from collections.namedtuple"
        ) from exc
    return _made(tx, cls, collections.namedtuple, args, kwargs)


@handles(tuple.__new__)
def _tuple_new(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """`tuple.__new__(cls, iterable)` of a namedtuple class: its `_make` (and the
    `__new__` that namedtuple writes) build instances so, bypassing the class's own
    `__new__`."""
    cls = args[0].as_constant() if args and isinstance(args[0], ClassValue) else None
    if kwargs or len(args) != 2 or not (isinstance(cls, type) and issubclass(cls, tuple)):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "tuple.__new__ of a class not modelled")
    if not hasattr(cls, "_fields"):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"tuple.__new__({cls.__qualname__})")
    result = TupleValue(iterator_over(tx, args[1]).iterate(tx), struct_type=cls)
    if isinstance(args[0], MadeClassValue):
        result.made_class = args[0]
    return result


def make_type(tx: Translator, args: list[Value]) -> Value:
    """`type(name, bases, namespace)` with a constant name, bases whose metaclass is `type`
    and none with a Python `__init_subclass__` (it would run while capturing), and a
    namespace of constants and functions without closures (made into real functions for
    the class made while capturing)."""
    name, bases, ns = args
    if not (name.is_constant() and isinstance(name.as_constant(), str)):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "type() with a name not a constant")
    if not isinstance(bases, TupleValue) or not all(isinstance(b, ClassValue) for b in bases.items):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "type() with bases that are not classes")
    real_bases = tuple(b.as_constant() for b in bases.items)
    for base in real_bases:
        if type(base) is not type or any(
            "__init_subclass__" in k.__dict__ for k in base.__mro__ if k is not object
        ):
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"type() with base {base.__qualname__} (a metaclass or __init_subclass__)",
            )
    if not isinstance(ns, DictValue) or not all(type(k) is str for k in ns.items):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "type() with a namespace not a dict")
    plain = {k: _namespace_entry(v) for k, v in ns.items.items()}
    plain.setdefault("__module__", tx.f_globals.get("__name__", "__main__"))
    cls = type(name.as_constant(), real_bases, plain)
    snapshot = DictValue(dict(ns.items))  # later writes to the dict do not reach the class
    value = _made(tx, cls, type, [name, bases, snapshot], {})
    value.namespace = {k: v for k, v in ns.items.items() if not v.is_constant()}
    return value


def _namespace_entry(value: Value) -> Any:
    if value.is_constant():
        return value.as_constant()
    if isinstance(value, UserFunctionValue):
        return value.fn
    if (
        isinstance(value, NestedFunctionValue)
        and not value.closure
        and all(v.is_constant() for v in [*value.defaults, *value.kwdefaults.values()])
        and not value.written
        and value.namespace is None
        and value.annotations is None
    ):
        fn = types.FunctionType(
            value.code,
            value.f_globals,
            value.code.co_name,
            tuple(v.as_constant() for v in value.defaults) or None,
        )
        fn.__qualname__ = value.qualname
        fn.__kwdefaults__ = {k: v.as_constant() for k, v in value.kwdefaults.items()} or None
        return fn
    raise Unsupported(
        BreakReason.UNSUPPORTED_CALL, f"type() with a namespace holding {value.describe()}"
    )
