"""The builtins that read, write and delete attributes (`getattr` with a default,
`hasattr`, `setattr`, `delattr`, `vars`, `object.__setattr__`/`__getattribute__`), and the
guard that keeps a missing attribute missing: registered in `builtins.BUILTINS`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.capture.values.base import ConstantValue, MissingAttribute, Value, attribute
from ember.capture.values.builtins import handles
from ember.capture.values.exceptions import TracedRaise
from ember.capture.values.tensor import TensorValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator


@handles(getattr)
def _getattr(tx, args, kwargs):
    name = args[1].as_constant()
    if len(args) == 3:
        try:
            return args[0].getattr(tx, name)
        except (MissingAttribute, TracedRaise) as exc:
            _catch_attribute_error(tx, exc, args[0], name)
            return args[2]
    return attribute(tx, args[0], name)


@handles(hasattr)
def _hasattr(tx, args, kwargs):
    name = args[1].as_constant()
    try:
        args[0].getattr(tx, name)
    except (MissingAttribute, TracedRaise) as exc:
        _catch_attribute_error(tx, exc, args[0], name)
        return ConstantValue(False)
    return ConstantValue(True)


def _catch_attribute_error(
    tx: Translator, exc: MissingAttribute | TracedRaise, obj: Value, name: str
) -> None:
    """What `getattr` with a default and `hasattr` catch: an AttributeError (a missing
    attribute, or one that traced code raised); any other exception propagates."""
    if isinstance(exc, TracedRaise) and not exc.is_a(AttributeError):
        raise exc
    guard_missing(tx, obj, name, exc)


def guard_missing(
    tx: Translator, obj: Value, name: str, exc: MissingAttribute | TracedRaise | None = None
) -> None:
    """The trace took the branch for a missing attribute: it must stay missing (unless the
    lookup that found nothing guarded that already, as dict lookups)."""
    from ember.capture.guards import GuardKind

    if isinstance(exc, TracedRaise):  # made from a missing attribute just now, if guarded
        exc = exc.__cause__
    if isinstance(exc, MissingAttribute) and exc.guarded:
        return
    if obj.source is not None and not isinstance(obj, TensorValue):
        tx.ctx.guards.add(GuardKind.MISSING_ATTR, obj.source, name)


@handles(setattr)
def _setattr(tx, args, kwargs):
    args[0].setattr(tx, args[1].as_constant(), args[2])
    return ConstantValue(None)


@handles(delattr)
def _delattr(tx, args, kwargs):
    delete = getattr(args[0], "delattr", None)
    if delete is None:
        raise Unsupported(BreakReason.SIDE_EFFECT, f"deleting an attribute of {args[0].describe()}")
    delete(tx, args[1].as_constant())
    return ConstantValue(None)


@handles(object.__setattr__)
def _object_setattr(tx, args, kwargs):
    """The default store, bypassing a class's own `__setattr__` (frozen dataclasses)."""
    from ember.capture.values.objects import BuiltinMethodValue

    return BuiltinMethodValue(object.__setattr__, args[0]).call(tx, args[1:], kwargs)


@handles(object.__getattribute__)
def _object_getattribute(tx, args, kwargs):
    from ember.capture.values.objects import BuiltinMethodValue

    return BuiltinMethodValue(object.__getattribute__, args[0]).call(tx, args[1:], kwargs)


@handles(vars)
def _vars(tx, args, kwargs):
    """`vars(obj)`: its `__dict__`, as the attribute reads it (no argument: the frame's
    locals, which the trace does not model)."""
    from ember.capture.values.objects import ModuleValue, UserObjectValue

    if len(args) != 1 or kwargs or not isinstance(args[0], ModuleValue | UserObjectValue):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "vars() of anything but an object")
    return args[0].getattr(tx, "__dict__")
