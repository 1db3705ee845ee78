"""nn.Modules whose constructor the trace runs (a class statement's module made in forward,
a module with buffers made there), as Dynamo runs them.

values/modules.py builds a module made in the trace for real while capturing, and stands it
for the one each call makes (`BornModuleValue`). That is sound only where the constructor is
torch's own and makes no tensors: a class written by the user may print, count or append to
a list in `__init__` (each call does so again eagerly; building it at capture did so once),
and a buffer (`self.register_buffer("b", torch.arange(4.0))`) is a new tensor on every call.

Here the constructor is traced like any class's: `Module.__init__`, `Module.__setattr__`,
`register_buffer` are torch's Python and run on a `BuiltModuleValue`, whose attributes model
the instance dict (`training`, `_parameters`, `_buffers`, `_modules`, the hook tables): the
buffers are values of the graph, made anew on each call, and the module's whole state is that
dict. Where the module outlives the graph (returned, stored, alive at a break) it is made
again from that dict (`rebuild_object`: `cls.__new__` and the instance dict, no `__init__`
rerun), which is the object eager builds. A parameter made in the constructor
(`nn.Parameter(...)`) breaks, as under Dynamo: a new leaf tensor that requires grad is not a
value a graph can make.
"""

from __future__ import annotations

import types
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from torch.nn.modules import module as nn_module

from ember.capture.guards import GuardKind
from ember.capture.sources import ForeignGlobalSource
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.containers import DictValue
from ember.capture.values.functions import UserFunctionValue
from ember.capture.values.objects import UserObjectValue
from ember.capture.values.sets import SetValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator

_TABLES = ("_parameters", "_buffers", "_modules")
"""Where `Module.__getattr__` looks, in its order."""

_HOOK_TABLES = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)


class BuiltModuleValue(UserObjectValue):
    """An nn.Module the trace constructed: its instance dict is `attrs`."""

    def describe(self) -> str:
        return f"module {self.cls.__name__} made in the trace"

    def generic_getattr(self, tx: Translator, name: str) -> Value:
        """`object.__getattribute__` (instance dict, then the class), then
        `Module.__getattr__`'s tables, then a class's own `__getattr__`."""
        if name in self.attrs or name == "__dict__":
            return super().generic_getattr(tx, name)
        if any(name in klass.__dict__ for klass in self.cls.__mro__):
            return super().generic_getattr(tx, name)
        for table in _TABLES:
            entries = self.attrs.get(table)
            if isinstance(entries, DictValue) and name in entries.items:
                return entries.items[name]
        return super().generic_getattr(tx, name)

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """`module(...)`: its forward, inlined; hooks the trace registered on it, or global
        ones, are not modelled here (a break)."""
        if type(self.cls).__call__ is not type.__call__ or (
            self.cls.__call__ is not nn_module.Module.__call__
        ):
            return super().call(tx, args, kwargs)
        hooked = [name for name in _HOOK_TABLES if _holds_entries(self.attrs.get(name))]
        if hooked or not no_global_hooks(tx):
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"calling {self.describe()} with hooks ({', '.join(hooked) or 'global'})",
            )
        return self.getattr(tx, "forward").call(tx, args, kwargs)


def _holds_entries(table: Value | None) -> bool:
    return isinstance(table, DictValue) and bool(table.items)


_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def no_global_hooks(tx: Translator) -> bool:
    """Whether no global module hooks are registered, guarded so: calling a module made in
    the trace (no source of its own to hang a NO_HOOKS guard on) runs only its forward."""
    for name in _GLOBAL_HOOKS:
        table = getattr(nn_module, name)
        if table:
            return False
        source = ForeignGlobalSource(nn_module.__dict__, name)
        tx.ctx.guards.add(GuardKind.LENGTH_MATCH, source, (type(table), 0))
    return True


def _is_module_init(fn: Any) -> bool:
    """`nn.Module.__init__`, or the wrapper Dynamo installs over it once it has compiled
    (torch/_dynamo/mutation_guard.py tags each new module; ember need not)."""
    if fn is _MODULE_INIT or fn is nn_module.Module.__dict__.get("__init__"):
        return True
    return getattr(fn, "__qualname__", "") == _DYNAMO_PATCHED_INIT


_DYNAMO_PATCHED_INIT = "install_generation_tagging_init.<locals>.patched_init"


_MODULE_INIT = nn_module.Module.__init__


def module_init(tx: Translator, fn: Any, args: list[Value], kwargs: dict) -> bool:
    """`nn.Module.__init__(self)` on a module the trace builds: the instance dict it makes,
    written here (its Python logs API usage through C). False where `fn` is not it."""
    if not args or not isinstance(args[0], BuiltModuleValue) or not _is_module_init(fn):
        return False
    module = args[0]
    if module.cls.call_super_init or len(args) > 1 or kwargs:
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"nn.Module.__init__ of {module.cls.__name__} with arguments or call_super_init",
        )
    tx.ctx.effects.touch(module)
    attrs = module.attrs
    attrs["training"] = ConstantValue(True)
    attrs["_parameters"] = DictValue({})
    attrs["_buffers"] = DictValue({})
    attrs["_non_persistent_buffers_set"] = SetValue()
    for name in _ORDERED_TABLES[:2]:
        attrs[name] = DictValue({}, dict_type=OrderedDict)
    attrs["_is_full_backward_hook"] = ConstantValue(None)
    for name in _ORDERED_TABLES[2:]:
        attrs[name] = DictValue({}, dict_type=OrderedDict)
    attrs["_modules"] = DictValue({})
    return True


_ORDERED_TABLES = (
    "_backward_pre_hooks",
    "_backward_hooks",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
"""The OrderedDicts `Module.__init__` sets, in its order (`_is_full_backward_hook` after the
first two)."""


def build_module(tx: Translator, cls: type, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """`cls(*args, **kwargs)` for an nn.Module class: `__new__` is object's, `__init__`
    traced on a new value."""
    init = cls.__init__
    if cls.__new__ is not object.__new__ or not isinstance(init, types.FunctionType):
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL, f"constructing module {cls.__name__} in the trace"
        )
    module = BuiltModuleValue(cls)
    UserFunctionValue(init).call(tx, [module, *args], kwargs)
    return module


def runs_user_code(cls: type) -> bool:
    """Whether constructing `cls` runs code outside torch (a class of the user's, or one of
    theirs in its MRO before nn.Module)."""
    for klass in cls.__mro__:
        if klass is nn_module.Module:
            return False
        if "__init__" in klass.__dict__ and not klass.__module__.startswith("torch."):
            return True
    return False
