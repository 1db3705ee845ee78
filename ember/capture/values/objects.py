"""Objects during capture: nn.Modules, user objects (including dataclasses), classes, cells,
Python modules, grad-mode context managers and `super()`.

Attribute reads consult the side-effect ledger first (a write earlier in the trace wins), then
the real object: instance attributes are wrapped with an attribute source (so they are guarded
and reloadable), class functions become methods bound to the symbolic object and are inlined,
properties have their getter inlined.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import types
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.guards import GuardKind
from ember.capture.sources import (
    AttrSource,
    ConstSource,
    ItemSource,
    ModuleEntrySource,
    Source,
    attr_source,
)
from ember.capture.values.base import ConstantValue, MissingAttribute, Value
from ember.capture.values.containers import DictValue
from ember.capture.values.functions import BoundMethodValue, UserFunctionValue
from ember.capture.values.reachability import note_cycle
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


_MODULE_GETATTR = torch.nn.Module.__getattr__
"""Module's own fallback finds only parameters, buffers and submodules, which the module's
value looks up itself; a subclass's override is inlined like any class's."""


def _class_attribute(tx: Translator, owner: Value, cls: type, name: str, source) -> Value:
    """`owner.name` resolved on the class: methods bind, properties run, constants wrap."""
    if name == "__class__":  # the owner's type is pinned by its TYPE_MATCH / ID_MATCH guard
        return tx.ctx.builder.wrap_const(cls)
    from ember.capture.values.classes import pending_class_attribute

    pending = pending_class_attribute(tx, cls, name)
    if pending is not None:  # the trace wrote this class attribute
        return pending
    for klass in cls.__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            break
    else:
        fallback = getattr(cls, "__getattr__", None)
        if isinstance(fallback, types.FunctionType) and fallback is not _MODULE_GETATTR:
            return UserFunctionValue(fallback).call(tx, [owner, ConstantValue(name)], {})
        raise MissingAttribute(f"{cls.__name__!r} object has no attribute {name!r}", cls)
    if isinstance(attr, types.FunctionType):
        pin_class_attribute(tx, cls, name, attr)
        return BoundMethodValue(_function_value(attr), owner)
    if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType):
        pin_class_attribute(tx, cls, name, attr)
        return UserFunctionValue(attr.fget).call(tx, [owner], {})
    if isinstance(attr, staticmethod):
        pin_class_attribute(tx, cls, name, attr.__func__)
        return tx.ctx.builder.wrap_const(attr.__func__)
    if isinstance(attr, classmethod):
        pin_class_attribute(tx, klass, name, attr, in_dict=True)
        return BoundMethodValue(UserFunctionValue(attr.__func__), tx.ctx.builder.wrap_const(cls))
    if hasattr(attr, "__get__") and not isinstance(attr, (type, types.BuiltinFunctionType)):
        if isinstance(attr, (types.WrapperDescriptorType, types.MethodDescriptorType)):
            return BuiltinMethodValue(attr, owner)
        if isinstance(attr, functools._lru_cache_wrapper):  # binds like the function it wraps
            return BoundMethodValue(_descriptor_value(tx, klass, name), owner)
        getter = python_override(type(attr), "__get__")
        if getter is not None:  # a descriptor written in Python: its __get__ is inlined
            descriptor = _descriptor_value(tx, klass, name)
            owner_class = tx.ctx.builder.wrap_const(cls)
            return UserFunctionValue(getter).call(tx, [descriptor, owner, owner_class], {})
        raise Unsupported(
            BreakReason.UNSUPPORTED_ATTRIBUTE,
            f"descriptor {name!r} of {cls.__name__} ({type(attr).__name__})",
        )
    if source is None:  # an object made during capture: guard the class attribute instead
        source = ConstSource(cls, cls.__qualname__)
    return tx.ctx.builder.wrap(attr, AttrSource(source, name))


def pin_class_attribute(
    tx: Translator, cls: type, name: str, attr: Any, in_dict: bool = False
) -> None:
    """Guard that the method, property or staticmethod the trace ran is still what `cls`
    has for `name` (replaced on the class, or on a class of its MRO, it changes what the code
    does): `cls.name` by identity; a classmethod (a new bound method on each read) by its
    entry in the class dict that holds it."""
    owner = ConstSource(cls, cls.__qualname__)
    source = ItemSource(AttrSource(owner, "__dict__"), name) if in_dict else AttrSource(owner, name)
    tx.ctx.guards.add(GuardKind.CLASS_MEMBER, source, attr)


def _instance_lookup(
    tx: Translator, owner: Value, cls: type, name: str, source, deleted: bool = False
) -> Value:
    """The class part of an existing object's attribute lookup (its instance tables had no
    `name`). Where it finds nothing, the guards keep that so, as dict lookups (an
    ABSENT_ATTR guard) that a later `hasattr` or `except AttributeError` relies on.
    `deleted`: the trace deleted the instance attribute (which the object has at entry,
    guarded), so the instance dict is not consulted."""
    from ember.capture.guards import GuardKind

    try:  # (after a deletion, the instance's attribute of this name is not the class's)
        found = _class_attribute(tx, owner, cls, name, None if deleted else source)
    except MissingAttribute as exc:
        if exc.missing_on is cls and not exc.guarded and source is not None:
            expected = (name, cls, False) if deleted else (name, cls)
            tx.ctx.guards.add(GuardKind.ABSENT_ATTR, source, expected)
            exc.guarded = True
        raise
    real = tx.ctx.builder.real_object(owner)
    if deleted:
        return found
    if source is not None and hasattr(real, "__dict__") and not _is_data_descriptor(cls, name):
        # an instance attribute of that name would come first (`block.forward = ...`, or
        # another object of the class, which the type guard alone lets through)
        instance_dict = attr_source(source, "__dict__", cls)
        tx.ctx.guards.add(GuardKind.DICT_CONTAINS, instance_dict, (name, False))
    return found


def _instance_item(tx: Translator, m: torch.nn.Module, source, name: str):
    """The source of a module's plain attribute: an item of its instance dict (an attribute
    read on an nn.Module takes CPython's slow path, for classes with `__getattr__`; a conv
    net's guard reads hundreds), where no class of the MRO has the name or a
    `__getattribute__` (an INSTANCE_ATTR guard keeps that so, once per class); otherwise
    the attribute itself."""
    if source is None:
        return None
    cls = type(m)
    if any(n in k.__dict__ for k in cls.__mro__[:-1] for n in (name, "__getattribute__")):
        return AttrSource(source, name)
    tx.ctx.guards.add(GuardKind.INSTANCE_ATTR, source, (name, cls))
    return ItemSource(AttrSource(source, "__dict__"), name)


def _property_deleter(cls: type, name: str) -> types.FunctionType | None:
    """The Python `fdel` of a property `name` of `cls` (the first class of the MRO that
    defines the name decides)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if isinstance(attr, property) and isinstance(attr.fdel, types.FunctionType):
                return attr.fdel
            return None
    return None


def _inlined_text(tx: Translator, obj: Value, cls: type, kind: Any, spec: str) -> Value | None:
    """The class's `__str__`/`__repr__`/`__format__` written in Python, inlined on `obj`,
    object's defaults chained as CPython's (`__format__` without a spec is `str()`,
    `__str__` is `repr()`); None where object's own repr (an address) or C answers."""
    name = _TEXT_METHODS[kind]
    owner = next(k for k in cls.__mro__ if name in k.__dict__)
    if owner is object:
        if kind is format and not spec:
            return _inlined_text(tx, obj, cls, str, "")
        return _inlined_text(tx, obj, cls, repr, "") if kind is str else None
    if not isinstance(owner.__dict__[name], types.FunctionType):
        return None
    method = _class_attribute(tx, obj, cls, name, obj.source)
    return method.call(tx, [ConstantValue(spec)] if kind is format else [], {})


def _refuse_after_whole_dict_read(owner: Value, name: str) -> None:
    """An attribute write after the trace read the object's whole `__dict__` (see
    InstanceDictValue.whole, which sets `dict_read`): the read value would be stale."""
    if getattr(owner, "dict_read", False):
        raise Unsupported(
            BreakReason.SIDE_EFFECT,
            f"setting {name!r} on {owner.describe()} after the trace read its whole __dict__",
        )


def _descriptor_value(tx: Translator, klass: type, name: str) -> Value:
    """The descriptor object in `klass.__dict__` (guarded: the class may get another)."""
    source = ItemSource(AttrSource(ConstSource(klass, klass.__qualname__), "__dict__"), name)
    return tx.ctx.builder.wrap(klass.__dict__[name], source)


def _function_value(fn: types.FunctionType) -> Value:
    """A method's function: inlined, unless ember models it directly (a method whose code
    the trace cannot follow, such as one that catches KeyError)."""
    from ember.capture.values.builtins import BUILTINS
    from ember.capture.values.functions import BuiltinValue

    return BuiltinValue(fn) if fn in BUILTINS else UserFunctionValue(fn)


def python_override(cls: type, name: str) -> types.FunctionType | None:
    """The Python function that `cls` (or a Python base before any builtin one) defines for
    `name`; None when the first definition in the MRO is a builtin's (`object.__setattr__`,
    `dict.__getitem__`), i.e. the default behaviour applies."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            return attr if isinstance(attr, types.FunctionType) else None
    return None


class BuiltinMethodValue(Value):
    """A C-level method of a user object's base class (`object.__init__`, `object.__setattr__`
    reached through super(), `dict.get` of a dict subclass): the default behaviour, which
    the owner implements itself (`generic_setattr`, `builtin_method`)."""

    def __init__(self, descriptor: Any, owner: Value) -> None:
        self.descriptor = descriptor
        self.owner = owner

    def describe(self) -> str:
        return f"builtin method {self.descriptor.__qualname__}"

    def reconstruct(self, em: Emitter) -> None:
        """After a break (the method loaded, its call the unsupported instruction): the
        descriptor bound to the rebuilt owner, `descriptor.__get__(owner)`, which is the
        method the trace found even where `owner.name` would now find an override."""
        if not hasattr(self.descriptor, "__get__"):
            return super().reconstruct(em)
        em.cg.load_const(self.descriptor.__get__, push_null=True)
        em.reconstruct(self.owner)
        em.cg.call(1)

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        d, owner = self.descriptor, self.owner
        if d is object.__init__ and not args and not kwargs:
            return ConstantValue(None)
        if d is object.__setattr__ and len(args) == 2:
            store = getattr(owner, "generic_setattr", owner.setattr)
            store(tx, args[0].as_constant(), args[1])
            return ConstantValue(None)
        if d is object.__getattribute__ and isinstance(owner, UserObjectValue) and len(args) == 1:
            return owner.generic_getattr(tx, args[0].as_constant())
        builtin = getattr(owner, "builtin_method", None)
        if builtin is not None:
            return builtin(tx, d, args, kwargs)
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"builtin method {d!r}")


class ModuleValue(Value):
    """An nn.Module reached from the frame; its forward is inlined. Guarded by type (see
    values/modules.py): every read of it adds its own guard."""

    def __init__(self, module: torch.nn.Module, source) -> None:
        self.module = module
        self.source = source

    def describe(self) -> str:
        return f"module {type(self.module).__name__}"

    def python_type(self) -> type:
        return type(self.module)

    def truth(self, tx: Translator) -> bool:
        return True

    def getattr(self, tx: Translator, name: str) -> Value:
        pending = tx.ctx.effects.load_attr(self, name)
        if pending is not None:
            return pending
        m, builder, src = self.module, tx.ctx.builder, self.source
        if name == "__dict__" and src is not None:
            from ember.capture.values.mappings import InstanceDictValue

            return InstanceDictValue(self, AttrSource(src, "__dict__"))
        for table in ("_parameters", "_buffers", "_modules"):
            entries = m.__dict__.get(table, {})
            modelled = builder.existing(entries)
            if isinstance(modelled, DictValue):
                # the trace reads or writes the table itself (torch.func.functional_call
                # swaps tensors into `_parameters`): what it holds now is in its value
                item = modelled.items.get(name)
                if item is not None:
                    return item
                continue
            if name in entries:
                return builder.wrap(entries[name], ModuleEntrySource(src, table, name, f".{name}"))
        if name in m.__dict__ and not _is_data_descriptor(type(m), name):
            return builder.wrap_module_attribute(m.__dict__[name], _instance_item(tx, m, src, name))
        return _instance_lookup(tx, self, type(m), name, src)

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        _refuse_after_whole_dict_read(self, name)
        tx.ctx.effects.store_attr(self, name, value)

    def text(self, tx: Translator, kind: Any, spec: str = "") -> Value | None:
        """`repr(module)`, `str(module)`, `format(module, spec)`: nn.Module's `__repr__`
        (or the class's own) inlined, as for other objects (see UserObjectValue.text)."""
        return _inlined_text(tx, self, type(self.module), kind, spec)

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        from ember.capture.values.modules import call_module

        return call_module(tx, self, args, kwargs)

    def _children(self, tx: Translator) -> list[tuple[Any, torch.nn.Module]]:
        """The items of a container module; the trace now depends on which there are."""
        from ember.capture.guards import GuardKind

        m = self.module
        if self.source is not None and isinstance(m, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            tx.ctx.guards.add(GuardKind.DICT_KEYS, self.source, (type(m), list(m.keys())))
        elif self.source is not None:
            tx.ctx.guards.add(GuardKind.LENGTH_MATCH, self.source, (type(m), len(m)))
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)):
            return list(enumerate(m))
        if isinstance(m, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return list(m.items())
        raise Unsupported(BreakReason.DYNAMIC_CONTROL_FLOW, f"iterating {self.describe()}")

    def iterate(self, tx: Translator) -> list[Value]:
        if isinstance(self.module, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return [ConstantValue(k) for k, _ in self._children(tx)]
        return [tx.ctx.builder.wrap(c, self._child_source(k)) for k, c in self._children(tx)]

    def length(self, tx: Translator) -> int:
        return len(self._children(tx))

    def getitem(self, tx: Translator, key: Value) -> Value:
        k = key.as_constant()
        if isinstance(k, slice) and isinstance(self.module, _SLICEABLE):
            from ember.capture.values.modules import slice_container

            children = self._children(tx)[k]
            wrapped = [tx.ctx.builder.wrap(c, self._child_source(i)) for i, c in children]
            return slice_container(self, k, wrapped)
        children = dict(self._children(tx))
        if isinstance(k, int) and k < 0:
            k += len(children)
        if k not in children:
            raise Unsupported(BreakReason.UNSUPPORTED_OPERATOR, f"{self.describe()}[{k!r}]")
        return tx.ctx.builder.wrap(children[k], self._child_source(k))

    def _child_source(self, key: Any) -> Source:
        """Children of module containers are read from `_modules` (ModuleList's __getitem__
        is Python code that would run on every guard check and call)."""
        m = self.module
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
            return ModuleEntrySource(self.source, "_modules", list(m._modules)[key], f"[{key}]")
        if isinstance(m, torch.nn.ModuleDict):
            return ModuleEntrySource(self.source, "_modules", key, f"[{key!r}]")
        return ItemSource(self.source, key)

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        return self.getattr(tx, name).call(tx, args, kwargs)


_SLICEABLE = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ParameterList)


_TEXT_METHODS = {str: "__str__", repr: "__repr__", format: "__format__"}


class UserObjectValue(Value):
    """An instance of a Python class: existing (with a source) or created during capture."""

    made_class: Value | None = None
    """The value of its class where the trace made the class (values/made_classes.py)."""

    def __init__(self, cls: type, source=None, obj: Any = None) -> None:
        self.cls = cls
        self.source = source
        self.obj = obj
        self.attrs: dict[str, Value] = {}  # attributes of an object created during capture

    @property
    def is_new(self) -> bool:
        return self.source is None

    def describe(self) -> str:
        return f"{self.cls.__name__} object"

    def python_type(self) -> type:
        return self.cls

    def truth(self, tx: Translator) -> bool:
        if "__bool__" in dir(self.cls) or "__len__" in dir(self.cls):
            method = "__bool__" if "__bool__" in dir(self.cls) else "__len__"
            return self.getattr(tx, method).call(tx, [], {}).truth(tx)
        return True

    def getattr(self, tx: Translator, name: str) -> Value:
        """`obj.name`: a class that defines `__getattribute__` in Python (transformers'
        configs map attribute aliases so) has it inlined; others get the default lookup."""
        override = python_override(self.cls, "__getattribute__")
        if override is not None:
            return UserFunctionValue(override).call(tx, [self, ConstantValue(name)], {})
        return self.generic_getattr(tx, name)

    def generic_getattr(self, tx: Translator, name: str) -> Value:
        """`object.__getattribute__`: data descriptors of the class, the instance dict (or
        the ledger), then the class (methods bind, properties run, `__getattr__` last)."""
        if name == "__dict__":
            return self._instance_dict(tx)
        if self.is_new:
            if name in self.attrs:
                return self.attrs[name]
            if _is_slot(self.cls, name):
                raise MissingAttribute(f"{self.describe()} has no attribute {name!r} (unset slot)")
            return _class_attribute(tx, self, self.cls, name, None)
        pending = tx.ctx.effects.load_attr(self, name)
        if pending is not None:
            return pending
        if tx.ctx.effects.is_deleted(self, name):
            return _instance_lookup(tx, self, self.cls, name, self.source, deleted=True)
        instance_dict = getattr(self.obj, "__dict__", {})
        if name in instance_dict and not _is_data_descriptor(self.cls, name):
            source = attr_source(self.source, name, self.cls)
            return tx.ctx.builder.wrap(instance_dict[name], source)
        if _is_slot(self.cls, name):  # `__slots__` storage: set, or still unset
            if hasattr(self.obj, name):
                return tx.ctx.builder.wrap(getattr(self.obj, name), AttrSource(self.source, name))
            tx.ctx.guards.add(GuardKind.MISSING_ATTR, self.source, name)
            raise MissingAttribute(f"{self.describe()} has no attribute {name!r} (an unset slot)")
        found = _instance_lookup(tx, self, self.cls, name, self.source)
        if name == "_init_group" and issubclass(self.cls, torch.optim.Optimizer):
            from ember.capture.values.optimizers import init_group_method

            return init_group_method(self, self.cls, found)
        return found

    def _instance_dict(self, tx: Translator) -> Value:
        """`obj.__dict__`. For an object made during capture, a dict that shares its storage
        with the attributes (writes through it are attribute writes). For one from outside,
        a view that reads entries as attribute reads do (see InstanceDictValue)."""
        from ember.capture.values.containers import DictValue
        from ember.capture.values.mappings import InstanceDictValue

        if self.is_new:
            view = DictValue({})
            view.items = self.attrs
            return view
        return InstanceDictValue(self, attr_source(self.source, "__dict__", self.cls))

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        override = python_override(self.cls, "__setattr__")
        if override is not None:
            UserFunctionValue(override).call(tx, [self, ConstantValue(name), value], {})
            return
        self.generic_setattr(tx, name, value)

    def delattr(self, tx: Translator, name: str) -> None:
        """`del obj.name`: a property's deleter written in Python is inlined; an instance
        attribute of an object made during capture is dropped from its attributes; one of
        an outside object goes to the ledger (replayed as `del obj.name`), with a guard that
        the object has it at entry. A Python `__delattr__`, or other descriptors, are
        refused."""
        from ember.capture.guards import GuardKind

        deleter = _property_deleter(self.cls, name)
        if deleter is not None:
            UserFunctionValue(deleter).call(tx, [self], {})
            return
        if python_override(self.cls, "__delattr__") is not None or _is_data_descriptor(
            self.cls, name
        ):
            raise Unsupported(
                BreakReason.SIDE_EFFECT,
                f"deleting attribute {name!r} of {self.describe()} (a Python __delattr__ "
                "or a descriptor without a Python deleter)",
            )
        if self.is_new:
            if name not in self.attrs:
                raise MissingAttribute(f"{self.describe()} has no attribute {name!r}")
            tx.ctx.effects.touch(self)
            del self.attrs[name]
            return
        if not hasattr(self.obj, "__dict__"):
            raise Unsupported(BreakReason.SIDE_EFFECT, f"deleting attribute {name!r}")
        _refuse_after_whole_dict_read(self, name)
        effects = tx.ctx.effects
        instance_dict = attr_source(self.source, "__dict__", self.cls)
        present = name in self.obj.__dict__
        deleted = effects.is_deleted(self, name)
        if not deleted:
            tx.ctx.guards.add(GuardKind.DICT_CONTAINS, instance_dict, (name, present))
        if effects.load_attr(self, name) is None and (deleted or not present):
            exc = MissingAttribute(f"{self.describe()} has no attribute {name!r}")
            exc.guarded = True
            raise exc
        if present or deleted:
            effects.delete_attr(self, name)
        else:  # an attribute only the trace set: the write is forgotten
            effects.drop_attr(self, name)

    def generic_setattr(self, tx: Translator, name: str, value: Value) -> None:
        """`object.__setattr__`: a property's setter is inlined, a slot of an object from
        outside and anything else not a data descriptor is a recorded write (replayed as
        `obj.name = value`; a slot of an object made in the trace is kept with its
        attributes); other data descriptors written in C are refused."""
        for klass in self.cls.__mro__:
            attr = klass.__dict__.get(name)
            if attr is None:
                continue
            if isinstance(attr, property) and isinstance(attr.fset, types.FunctionType):
                UserFunctionValue(attr.fset).call(tx, [self, value], {})
                return
            setter = python_override(type(attr), "__set__")
            if setter is not None:  # a data descriptor written in Python
                descriptor = _descriptor_value(tx, klass, name)
                UserFunctionValue(setter).call(tx, [descriptor, self, value], {})
                return
            if isinstance(attr, types.MemberDescriptorType):
                break  # a slot: replayed as `obj.name = value`, or kept with the attributes
            if hasattr(type(attr), "__set__"):
                raise Unsupported(
                    BreakReason.SIDE_EFFECT,
                    f"setting {name!r} on {self.describe()} goes through a "
                    f"{type(attr).__name__} descriptor",
                )
            break
        if self.is_new:
            tx.ctx.effects.touch(self)
            note_cycle(tx, self, [value])
            self.attrs[name] = value
        else:
            _refuse_after_whole_dict_read(self, name)
            tx.ctx.effects.store_attr(self, name, value)

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        method = self.type_method(tx, "__call__")
        if method is None:
            return super().call(tx, args, kwargs)
        return method.call(tx, args, kwargs)

    def type_method(self, tx: Translator, name: str) -> Value | None:
        """A special method, looked up on the type as CPython does (instance attributes do
        not count); None when the class has none (the operation raises TypeError in Python,
        and the base class refuses it)."""
        if not any(name in klass.__dict__ for klass in self.cls.__mro__):
            return None
        return _class_attribute(tx, self, self.cls, name, self.source)

    def text(self, tx: Translator, kind: Any, spec: str = "") -> Value | None:
        """`str(obj)`, `repr(obj)` or `format(obj, spec)` (f-strings) where the class writes
        the method in Python: the method inlined, object's defaults chained as CPython's
        (`__format__` without a spec is `str()`, `__str__` is `repr()`). None where it
        cannot be (object's own repr holds an address; a method written in C)."""
        return _inlined_text(tx, self, self.cls, kind, spec)

    # the container protocol, for classes that implement it in Python (MutableMapping kin)
    def getitem(self, tx: Translator, key: Value) -> Value:
        method = self.type_method(tx, "__getitem__")
        if method is None:
            return super().getitem(tx, key)
        return method.call(tx, [key], {})

    def setitem(self, tx: Translator, key: Value, value: Value) -> None:
        method = self.type_method(tx, "__setitem__")
        if method is None:
            return super().setitem(tx, key, value)
        method.call(tx, [key, value], {})

    def delitem(self, tx: Translator, key: Value) -> None:
        method = self.type_method(tx, "__delitem__")
        if method is None:
            return super().delitem(tx, key)
        method.call(tx, [key], {})

    def length(self, tx: Translator) -> int:
        method = self.type_method(tx, "__len__")
        if method is None:
            return super().length(tx)
        return method.call(tx, [], {}).as_constant()

    def iterate(self, tx: Translator) -> list[Value]:
        from ember.capture.values.containers import iterator_over

        if python_override(self.cls, "__iter__") is collections.abc.Sequence.__iter__:
            # the Sequence mixin steps self[i] until IndexError, which by the ABC's contract
            # is at len(self): read that many items, no exception to trace (transformers'
            # per-layer config view, iterated by every causal LM's cache setup)
            n = self.length(tx)
            return [self.getitem(tx, ConstantValue(i)) for i in range(n)]
        iterator = self.iterator(tx)
        if iterator is None:
            return super().iterate(tx)
        return iterator_over(tx, iterator).iterate(tx)

    def iterator(self, tx: Translator) -> Value | None:
        """`iter(self)` through its class's Python `__iter__` (None without one). An object
        that is its own iterator is stepped through its `__next__` when pulled
        (ObjectIterator), never ahead: the loop's body may change what `__next__` reads."""
        from ember.capture.values.iterators import ObjectIterator

        if python_override(self.cls, "__iter__") is collections.abc.Sequence.__iter__:
            return None
        method = self.type_method(tx, "__iter__")
        if method is None:
            if isinstance(python_override(self.cls, "__getitem__"), types.FunctionType):
                return ObjectIterator(self, by_index=True)  # the old sequence protocol
            return None
        iterator = method.call(tx, [], {})
        if iterator is not self:
            return iterator
        if not isinstance(python_override(self.cls, "__next__"), types.FunctionType):
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"iterating over {self.describe()}")
        return ObjectIterator(self)

    def children(self) -> list[Value]:
        return list(self.attrs.values())

    def reconstruct(self, em: Emitter) -> None:
        if not self.is_new:
            return super().reconstruct(em)
        em.cg.load_const(rebuild_object, push_null=True)
        if self.made_class is not None:  # a class made in the trace: made again
            em.reconstruct(self.made_class)
        else:
            em.cg.load_const(self.cls)
        em.attribute_map(self.attrs)
        em.cg.call(2)


def rebuild_object(cls: type, attrs: dict[str, Any]) -> Any:
    """Run-time half of reconstructing an object made during capture (no __init__ rerun:
    the captured __init__'s effects are exactly `attrs`)."""
    return fill_object(empty_object(cls), attrs)


def empty_object(cls: type) -> Any:
    """An instance of `cls` without its `__init__` (nor a Python `__new__`, which ran in
    the trace already: its effects are the attributes)."""
    from ember.capture.values.classes import plain_new

    if cls.__new__ is not object.__new__ and plain_new(cls):
        return object.__new__(cls)
    return cls.__new__(cls)


def fill_object(obj: Any, attrs: dict[str, Any]) -> Any:
    cls = type(obj)
    for name, value in attrs.items():
        if _is_slot(cls, name):  # `__slots__` storage, outside the instance dict
            object.__setattr__(obj, name, value)
        else:
            obj.__dict__[name] = value
    return obj


class PyModuleValue(Value):
    """A Python module (`torch`, `F`, `math`, a user module): attribute reads are resolved
    at trace time; functions of non-torch modules get an identity guard."""

    def __init__(self, module: types.ModuleType, source=None) -> None:
        self.module = module
        self.source = source

    def describe(self) -> str:
        return f"module {self.module.__name__}"

    def reconstruct(self, em: Emitter) -> None:
        em.cg.load_const(self.module)

    def python_type(self) -> type:
        return types.ModuleType

    def getattr(self, tx: Translator, name: str) -> Value:
        pending = tx.ctx.effects.load_attr(self, name)
        if pending is not None:
            return pending
        try:
            attr = getattr(self.module, name)
        except AttributeError as exc:
            raise MissingAttribute(f"module {self.module.__name__} has no {name!r}") from exc
        if self.module.__name__.split(".")[0] in ("torch", "math", "operator", "functools"):
            if self.source is None:
                return tx.ctx.builder.wrap_const(attr)
            source = AttrSource(self.source, name)
            if isinstance(attr, types.ModuleType):
                return PyModuleValue(attr, source)
            if callable(attr) and not isinstance(attr, type):
                # a library's function may be patched after the capture (F.scaled_dot_product_
                # attention swapped for another kernel): its identity is guarded, as Dynamo's
                tx.ctx.guards.add(GuardKind.ID_MATCH, source, attr)
            return tx.ctx.builder.wrap_const(attr)
        if self.source is not None:
            return tx.ctx.builder.wrap(attr, AttrSource(self.source, name))
        return tx.ctx.builder.wrap_const(attr)

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        """`module.attr = v` on a user's module goes into the ledger (like a global)."""
        if self.source is None or self.module.__name__.split(".")[0] in ("torch", "math"):
            return super().setattr(tx, name, value)
        tx.ctx.effects.store_attr(self, name, value)


class CellValue(Value):
    """A cell made in the frame (a local captured by a nested function or lambda)."""

    def __init__(self, contents: Value | None = None) -> None:
        self.contents = contents

    def describe(self) -> str:
        return "a closure variable"

    def load(self, tx: Translator) -> Value:
        if self.contents is None:
            raise Unsupported(BreakReason.EXCEPTION_RAISED, "free variable read before assignment")
        return self.contents

    def store(self, tx: Translator, value: Value) -> None:
        tx.ctx.effects.touch(self)
        self.contents = value


class GradModeValue(Value):
    """`torch.no_grad()`, `torch.enable_grad()`, `torch.set_grad_enabled(mode)`."""

    def __init__(self, enabled: bool, restore_to: bool | None = None) -> None:
        self.enabled = enabled
        self.restore_to = restore_to
        self.saved: list[bool] = []

    def describe(self) -> str:
        return f"grad mode context (enabled={self.enabled})"

    def enter(self, tx: Translator) -> Value:
        outside = torch.is_grad_enabled() if self.restore_to is None else self.restore_to
        tx.set_grad_enabled(self.enabled)  # may refuse (inside inference mode): then unentered
        self.saved.append(outside)
        return ConstantValue(None)

    def exit(self, tx: Translator) -> Value:
        tx.set_grad_enabled(self.saved.pop())
        return ConstantValue(None)

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """`torch.no_grad()(fn)`: the decorator, on a function of the trace."""
        from ember.capture.values.grad_decorated import GradModeDecoratedValue, decorates

        if self.restore_to is None and not self.saved and len(args) == 1 and not kwargs:
            if decorates(args[0]):
                return GradModeDecoratedValue(self.enabled, args[0])
        return super().call(tx, args, kwargs)

    def reconstruct(self, em: Emitter) -> None:
        """A context not entered (one a break hands on: `torch.no_grad()(fn)` decorating a
        local function); an entered one is the `with` block's, which break code restores."""
        if self.saved:
            return super().reconstruct(em)
        em.cg.load_const(grad_mode_context, push_null=True)
        em.cg.load_const(self.enabled)
        em.cg.load_const(self.restore_to)
        em.cg.call(2)


def grad_mode_context(enabled: bool, restore_to: bool | None) -> Any:
    """Run-time half of rebuilding a grad-mode context, without the side effect of
    set_grad_enabled's constructor (it sets the mode when called; its `prev` is the mode
    it found then)."""
    if restore_to is None:
        return torch.enable_grad() if enabled else torch.no_grad()
    context = torch.set_grad_enabled.__new__(torch.set_grad_enabled)
    context.prev, context.mode = restore_to, enabled
    return context


def _is_slot(cls: type, name: str) -> bool:
    """`name` is a `__slots__` member of a class written in Python (read through its
    member descriptor, guarded like an instance attribute)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return isinstance(klass.__dict__[name], types.MemberDescriptorType)
    return False


def _is_data_descriptor(cls: type, name: str) -> bool:
    """A class attribute that takes precedence over the instance dict (a property)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return hasattr(type(klass.__dict__[name]), "__set__")
    return False


def is_dataclass_instance(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)
