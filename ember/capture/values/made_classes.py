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
from typing import TYPE_CHECKING, Any

from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.builtins import handles
from ember.capture.values.classes import ClassValue
from ember.capture.values.containers import TupleValue, iterator_over
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
