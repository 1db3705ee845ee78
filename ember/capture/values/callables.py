"""operator.itemgetter, attrgetter and methodcaller: C-implemented callables made with
arguments (`sorted(rows, key=itemgetter(1))`, Counter.most_common's key). Made in the trace
or reached from the frame (then read back through `__reduce__`, which says how each was
made, and guarded by identity: they are immutable)."""

from __future__ import annotations

import functools
import inspect
import operator
import types
from typing import TYPE_CHECKING, Any

from ember.capture.values.base import ConstantValue, Value, all_constant
from ember.capture.values.builtins import handles
from ember.capture.values.containers import TupleValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


class GetterValue(Value):
    """`kind(*args, **kwargs)` for kind in itemgetter / attrgetter / methodcaller."""

    def __init__(self, kind: type, args: list[Value], kwargs: dict[str, Value]) -> None:
        self.kind = kind
        self.args = args
        self.kwargs = kwargs

    def describe(self) -> str:
        return f"operator.{self.kind.__name__}"

    def python_type(self) -> type:
        return self.kind

    def contained(self) -> list[Value]:
        return [*self.args, *self.kwargs.values()]

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if len(args) != 1 or kwargs:
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED, f"{self.describe()} expects one argument"
            )
        obj = args[0]
        if self.kind is operator.methodcaller:
            name = self.args[0].as_constant()
            return obj.getattr(tx, name).call(tx, self.args[1:], self.kwargs)
        results = [self._get(tx, obj, key) for key in self.args]
        return results[0] if len(results) == 1 else TupleValue(results)

    def _get(self, tx: Translator, obj: Value, key: Value) -> Value:
        if self.kind is operator.itemgetter:
            return obj.getitem(tx, key)
        for part in key.as_constant().split("."):  # attrgetter("a.b")
            obj = obj.getattr(tx, part)
        return obj

    def reconstruct(self, em: Emitter) -> None:
        em.cg.load_const(self.kind, push_null=True)
        for part in [*self.args, *self.kwargs.values()]:
            em.reconstruct(part)
        em.cg.call(len(self.args) + len(self.kwargs), tuple(self.kwargs))


def _getter_for(kind: type):
    def handler(tx, args, kwargs):
        if not args or (kind is not operator.methodcaller and kwargs):
            raise Unsupported(BreakReason.EXCEPTION_RAISED, f"{kind.__name__}() arguments")
        if kind is not operator.itemgetter and not all_constant(args[:1]):
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"{kind.__name__} of a non-constant")
        return GetterValue(kind, list(args), dict(kwargs))

    return handler


for _kind in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
    handles(_kind)(_getter_for(_kind))


def getter_value(obj: Any) -> GetterValue | None:
    """The value of an itemgetter/attrgetter/methodcaller object from outside, made from
    what its `__reduce__` says; None for any other object."""
    kind = type(obj)
    if kind not in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
        return None
    maker, args = obj.__reduce__()
    kwargs: dict[str, Any] = {}
    if isinstance(maker, functools.partial):  # methodcaller with keywords
        args, kwargs = (*maker.args, *args), maker.keywords
    if not all(type(a) in (int, str, float, bool, type(None)) for a in (*args, *kwargs.values())):
        return None  # keys the guard could not vouch for
    return GetterValue(
        kind, [ConstantValue(a) for a in args], {k: ConstantValue(v) for k, v in kwargs.items()}
    )


@handles(inspect.signature)
def _signature(tx, args, kwargs):
    """`inspect.signature(f)` of a function ember knows (its identity guarded), folded to
    the Signature object itself: libraries ask it inside forward to adapt their calls
    (transformers' apply_chunking_to_forward); inspect's own code walks `__wrapped__`
    chains with address memos that a trace cannot follow."""
    from ember.capture.sources import AttrSource
    from ember.capture.values.functions import BoundMethodValue, UserFunctionValue

    target, bound = args[0], False
    if isinstance(target, BoundMethodValue):
        target, bound = target.fn, True
    if not isinstance(target, UserFunctionValue) or not all_constant(list(kwargs.values())):
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL, f"inspect.signature of {args[0].describe()}"
        )
    fn = target.fn
    if fn.__defaults__ and target.source is not None:  # the signature shows them: guard them
        tx.ctx.builder.wrap(fn.__defaults__, AttrSource(target.source, "__defaults__"))
    options = {k: v.as_constant() for k, v in kwargs.items()}
    real = types.MethodType(fn, object()) if bound else fn
    return ConstantValue(inspect.signature(real, **options))
