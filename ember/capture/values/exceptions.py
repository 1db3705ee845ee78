"""Exceptions during capture: exception objects, and raising them through the traced frames.

Traced code that raises (a `raise` statement, a KeyError from a dict lookup, an AttributeError,
StopIteration from `next`) raises `TracedRaise` in the interpreter, carrying the exception as a
Value. Each frame's loop looks up the raising instruction in its exception table and jumps to
the handler with the stack cut to the handler's depth, as CPython does; a frame with no handler
passes it on to its caller. What escapes the compiled frame is raised by its replacement code,
after the graph ran and the side effects were replayed (capture/frame.py).
"""

from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any, NoReturn

from ember.capture.sources import AttrSource
from ember.capture.values.base import ConstantValue, MissingAttribute, Value, from_class_statement
from ember.capture.values.containers import TupleValue
from ember.capture.values.functions import UserFunctionValue
from ember.capture.values.objects import UserObjectValue, python_override
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


class TracedRaise(Exception):
    """Traced code raised `value` (an ExceptionValue); the interpreter unwinds to a handler."""

    def __init__(self, value: ExceptionValue) -> None:
        super().__init__(value.describe())
        self.value = value

    def is_a(self, cls: type[BaseException]) -> bool:
        return issubclass(self.value.cls, cls)


_FIELDS = {
    StopIteration: ("value",),
    AttributeError: ("name", "obj"),
    ImportError: ("msg", "name", "path"),
}
"""C exception classes whose instances hold more than `args`, and the fields their
`__init__` sets from nothing but positional arguments (the first argument for
StopIteration.value, the only one for ImportError.msg; None for AttributeError's name and
obj and ImportError's name and path). Their C subclasses (ModuleNotFoundError) share them."""


def _fields_of(base: type) -> tuple[str, ...] | None:
    return next((_FIELDS[k] for k in base.__mro__ if k in _FIELDS), None)


def _c_base(cls: type) -> type:
    return next(k for k in cls.__mro__ if not from_class_statement(k))


def _check_modelled(cls: type) -> type:
    """The C base of `cls`, if its instances are modelled: exceptions whose state is their
    `args` (and the fields above), made without a `__new__` written in Python."""
    base = _c_base(cls)
    simple = base.__basicsize__ == BaseException.__basicsize__ or _fields_of(base) is not None
    if not simple or python_override(cls, "__new__") is not None:
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"constructing {cls.__qualname__} (an exception class with its own state or __new__)",
        )
    return base


_C_STATE = ("args", "__cause__", "__context__", "__suppress_context__", "__traceback__")


def _c_field(cls: type, name: str) -> bool:
    """Whether `name` is a field a C exception class keeps (an exception group's `message`
    and `exceptions`, OSError's `errno`): read from an exception made outside the trace."""
    found = inspect.getattr_static(cls, name, None)
    return isinstance(found, (types.MemberDescriptorType, types.GetSetDescriptorType)) and (
        not from_class_statement(found.__objclass__)
    )


class ExceptionValue(UserObjectValue):
    """An exception object: made by the traced code (`is_new`), or from outside (a resume
    function's handler receives the exception its break code caught). Besides attributes,
    it holds what BaseException keeps in C: `args`, the cause and context, and the extra
    fields of StopIteration and AttributeError."""

    def __init__(self, cls: type, args: list[Value], source=None, obj: Any = None) -> None:
        super().__init__(cls, source, obj)
        self.args = args
        base = _c_base(cls)
        self.fields: dict[str, Value] = {
            name: ConstantValue(None) for name in _fields_of(base) or ()
        }
        self.cause: Value = ConstantValue(None)
        self.context: Value = ConstantValue(None)
        self.suppress_context = False
        self.synthesized_at: int | None = None
        """For an exception ember made for a modelled builtin whose message may differ from
        Python's: the root frame's step count before the instruction that raised it."""

    def describe(self) -> str:
        return f"{self.cls.__name__} exception"

    def init_builtin(self, args: list[Value], kwargs: dict[str, Value]) -> None:
        """BaseException.__init__ (and its C subclasses' own, modelled in `_FIELDS`)."""
        if kwargs:
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL, f"{self.cls.__name__}() with keyword arguments"
            )
        self.args = list(args)
        if "value" in self.fields:
            self.fields["value"] = args[0] if args else ConstantValue(None)
        if "msg" in self.fields:
            self.fields["msg"] = args[0] if len(args) == 1 else ConstantValue(None)

    def builtin_method(self, tx: Translator, d: Any, args: list[Value], kwargs: dict) -> Value:
        if d.__name__ == "__init__" and issubclass(d.__objclass__, BaseException):
            self.init_builtin(args, kwargs)
            return ConstantValue(None)
        if d.__name__ in ("__str__", "__repr__") and not args and not kwargs:
            return ConstantValue(d(self.as_constant()))
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"builtin method {d!r}")

    def getattr(self, tx: Translator, name: str) -> Value:
        if not self.is_new:
            if name in _C_STATE or name in self.fields or _c_field(self.cls, name):
                return tx.ctx.builder.wrap(getattr(self.obj, name), AttrSource(self.source, name))
            return super().getattr(tx, name)
        if name == "args":
            return TupleValue(list(self.args))
        if name in self.fields:
            return self.fields[name]
        if name == "__cause__":
            return self.cause
        if name == "__context__":
            return self.context
        if name == "__suppress_context__":
            return ConstantValue(self.suppress_context)
        if name in ("__traceback__", "__notes__", "with_traceback", "add_note"):
            raise Unsupported(
                BreakReason.UNSUPPORTED_ATTRIBUTE,
                f"{name!r} of an exception raised in the trace (it has no traceback yet)",
            )
        return super().getattr(tx, name)

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        if not self.is_new:
            return super().setattr(tx, name, value)
        tx.ctx.effects.touch(self)
        if name == "args":
            self.args = value.iterate(tx)
        elif name in self.fields:
            self.fields[name] = value
        elif name == "__cause__":
            self.cause, self.suppress_context = value, True
        elif name == "__context__":
            self.context = value
        else:
            super().setattr(tx, name, value)

    def as_constant(self) -> BaseException:
        """A real exception equal to this one, for folding `str(e)`, `repr(e)`; NotConstant
        unless everything it holds is a constant."""
        if not self.is_new:
            return super().as_constant()
        parts = [*self.args, *self.fields.values(), *self.attrs.values()]
        if not all(p.is_constant() for p in parts):
            return super().as_constant()
        return rebuild_exception(
            self.cls,
            tuple(a.as_constant() for a in self.args),
            {k: v.as_constant() for k, v in self.fields.items()},
            {k: v.as_constant() for k, v in self.attrs.items()},
            None,
            None,
            False,
        )

    def text(self, tx: Translator, kind: Any, spec: str = "") -> Value | None:
        """`str(e)`/`repr(e)` where an exception the trace made holds objects (`KeyError(key)`
        of a key object): BaseException's C methods written out (`Name(repr, ...)`; `str` of one
        argument, KeyError's its repr), each argument's text as the trace makes it. A class
        that writes the method in Python has it inlined; other C methods: None."""
        inlined = super().text(tx, kind, spec)
        if inlined is not None or not self.is_new or kind is format and spec:
            return inlined  # one from outside: its own text, through `as_constant`
        name = "__repr__" if kind is repr else "__str__"
        owner = next(k for k in self.cls.__mro__ if name in k.__dict__)
        if owner not in (BaseException, KeyError):
            return None
        texts = [_repr_text(tx, a) for a in self.args]
        if any(t is None for t in texts):
            return None
        if kind is repr:
            return ConstantValue(f"{self.cls.__name__}({', '.join(texts)})")
        if len(self.args) == 1 and owner is KeyError:
            return ConstantValue(texts[0])
        if len(self.args) == 1:
            return _text(tx, self.args[0], str)
        return ConstantValue("" if not self.args else f"({', '.join(texts)})")

    def contained(self) -> list[Value]:
        return [*self.args, *self.fields.values(), self.cause, self.context]

    def children(self) -> list[Value]:
        return [*super().children(), *self.contained()]

    def reconstruct(self, em: Emitter) -> None:
        if not self.is_new:
            return super().reconstruct(em)
        cg = em.cg
        cg.load_const(rebuild_exception, push_null=True)
        cg.load_const(self.cls)
        em.reconstruct(TupleValue(list(self.args)))
        for group in (self.fields, self.attrs):
            for name, value in group.items():
                cg.load_const(name)
                em.reconstruct(value)
            cg.build("MAP", len(group))
        em.reconstruct(self.cause)
        em.reconstruct(self.context)
        cg.load_const(self.suppress_context)
        cg.call(7)


def _repr_text(tx: Translator, value: Value) -> str | None:
    """`repr(value)` as the trace makes it, or None where it is not a known string."""
    result = _text(tx, value, repr)
    return result.as_constant() if result is not None and result.is_constant() else None


def _text(tx: Translator, value: Value, kind: Any) -> Value | None:
    if value.is_constant():
        return ConstantValue(kind(value.as_constant()))
    text = getattr(value, "text", None)
    return text(tx, kind) if text is not None else None


class SavedException(Value):
    """What PUSH_EXC_INFO saves below the exception an `except` block handles: the one
    handled before (None: whatever the caller of the compiled function handles), which
    POP_EXCEPT restores. It also remembers the block's own exception: at a break, that one
    travels, and the resume function's prologue raises and catches it again, so that CPython
    handles it and saves the right one before it (resume.Slot.HANDLING)."""

    def __init__(self, previous: Value | None, handled: Value) -> None:
        self.previous = previous
        self.handled = handled

    def describe(self) -> str:
        return "the exception handled before an `except` block"

    def contained(self) -> list[Value]:
        return [self.handled]


def rebuild_exception(
    cls: type[BaseException],
    args: tuple,
    fields: dict[str, Any],
    attrs: dict[str, Any],
    cause: BaseException | None,
    context: BaseException | None,
    suppress_context: bool,
) -> BaseException:
    """Run-time half of reconstructing an exception made during capture (its __init__ is not
    run again: what the traced one did is `args`, `fields` and `attrs`)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    for name, value in fields.items():
        setattr(exc, name, value)
    exc.__dict__.update(attrs)
    exc.__cause__ = cause
    exc.__context__ = context
    exc.__suppress_context__ = suppress_context
    return exc


def construct_exception(
    tx: Translator, cls: type, args: list[Value], kwargs: dict[str, Value]
) -> ExceptionValue:
    """`cls(*args, **kwargs)` for an exception class: BaseException.__new__ keeps the
    arguments as `args`, then `__init__` runs (inlined when written in Python)."""
    _check_modelled(cls)
    exc = ExceptionValue(cls, list(args))
    init = python_override(cls, "__init__")
    if isinstance(init, types.FunctionType):
        UserFunctionValue(init).call(tx, [exc, *args], kwargs)
    else:
        exc.init_builtin(list(args), kwargs)
    return exc


def raise_in_trace(tx: Translator, cls: type, args: list[Value], detail: str) -> NoReturn:
    """`raise cls(*args)` from ember's model of a builtin (`next()`, `generator.send`): to
    a handler of the traced code, or else a break where CPython raises it."""
    if tx.handled_in_trace():
        raise TracedRaise(construct_exception(tx, cls, args, {}))
    raise Unsupported(BreakReason.EXCEPTION_RAISED, detail)


def python_error(tx: Translator, error: BaseException, exact: bool = True) -> ExceptionValue:
    """The Value of an exception Python raised while the trace computed the user's
    operation on constants (`{}["k"]`, `1 / 0`): its class and constant arguments. Not
    `exact` when it only surfaced in ember's model of an operation (a LookupError or
    ValueError from a handler): leaving the function, CPython raises its own instead."""
    exc = ExceptionValue(type(error), [ConstantValue(a) for a in error.args])
    for name in exc.fields:
        exc.fields[name] = ConstantValue(getattr(error, name, None))
    if not exact:
        _mark_synthesized(tx, exc)
    return exc


def _mark_synthesized(tx: Translator, exc: ExceptionValue) -> None:
    root = tx
    while root.parent is not None:
        root = root.parent
    exc.synthesized_at = root.steps_before_current()


def from_missing_attribute(tx: Translator, missing: MissingAttribute) -> ExceptionValue:
    """The AttributeError of a missing attribute, in ember's wording (see `python_error`)."""
    detail = missing.detail.removeprefix("AttributeError: ")
    exc = ExceptionValue(AttributeError, [ConstantValue(detail)])
    _mark_synthesized(tx, exc)
    return exc


def leaving_generator(exc: ExceptionValue) -> ExceptionValue:
    """PEP 479: a StopIteration that reaches the end of a generator's frame leaves it as
    RuntimeError("generator raised StopIteration") caused by it (3.11's interpreter does this
    as the exception leaves the frame; 3.12+ compile it as the frame's outermost handler,
    CALL_INTRINSIC_1 INTRINSIC_STOPITERATION_ERROR). Other exceptions pass unchanged."""
    if not issubclass(exc.cls, StopIteration):
        return exc
    error = ExceptionValue(RuntimeError, [ConstantValue("generator raised StopIteration")])
    error.cause = error.context = exc
    error.suppress_context = True
    error.synthesized_at = exc.synthesized_at
    return error


def raised_type(value: Value) -> type | None:
    """The class of an exception being raised, or None when `value` is not one."""
    if isinstance(value, ExceptionValue):
        return value.cls
    try:
        kind = value.python_type()
    except Unsupported:
        return None
    return kind if issubclass(kind, BaseException) else None
