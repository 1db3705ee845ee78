"""Calling nn.Modules during capture (forward hooks and pre-hooks traced inline, as
`Module._call_impl` runs them) and nn.Modules made during capture.

A module reached from the frame (`ModuleValue`) is guarded by its type and by what the trace
reads of it, not by its identity: its parameters and buffers are graph inputs read at each
call, so the blocks of a model share one graph (each block compiled on its own, FSDP2's
recipe, as under torch.compile). A module the traced code makes (`nn.CrossEntropyLoss()` in
a forward, `layers[1:]` of a Sequential) is a new object on every eager call, so guarding
its identity would fail on every call: T5 and BERT training recompiled until the limit. Such
a `BornModuleValue` carries the recipe that makes it (its class and constant arguments, or
the container and the slice) and is rebuilt from it only if it escapes the graph. Its
children, for a slice, are the parent's children with their own guarded sources. A module
made with buffers, or of a class whose `__init__` is not torch's (it may print, count,
append), has its constructor traced instead (values/built_modules.py); one made with
parameters is refused (a break, as under Dynamo): eager draws new leaf tensors on every call.
"""

from __future__ import annotations

import operator
import types
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules import module as nn_module

from ember.capture.guards import GuardKind
from ember.capture.sources import AttrSource, ForeignGlobalSource
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.built_modules import (
    BuiltModuleValue,
    build_module,
    no_global_hooks,
    runs_user_code,
)
from ember.capture.values.containers import DictValue, SequenceValue, TupleValue
from ember.capture.values.functions import BoundMethodValue, UserFunctionValue
from ember.capture.values.objects import ModuleValue, _class_attribute
from ember.distributed import data_parallel_call
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator

_MODULE_HOOKS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)
_GLOBAL_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called",
)


def has_forward_hooks(m: torch.nn.Module) -> bool:
    return bool(
        m._forward_hooks
        or m._forward_pre_hooks
        or nn_module._global_forward_hooks
        or nn_module._global_forward_pre_hooks
    )


def has_hooks(m: torch.nn.Module) -> bool:
    """Whether calling `m` runs more than its forward (`Module._call_impl`'s own test)."""
    return has_forward_hooks(m) or _has_backward_hooks(m)


def _has_backward_hooks(m: torch.nn.Module) -> bool:
    return bool(
        m._backward_hooks
        or m._backward_pre_hooks
        or nn_module._global_backward_hooks
        or nn_module._global_backward_pre_hooks
    )


def call_module(tx: Translator, value: ModuleValue, args: list[Value], kwargs: dict) -> Value:
    """`module(*args, **kwargs)`: forward pre-hooks, forward and forward hooks, in the
    order and with the argument rules of `Module._call_impl`."""
    m = value.module
    if (why := data_parallel_call(m)) is not None:
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"{value.describe()} is {why}: it runs in Python",
            hint="ember.compile the outer wrapper: what each wrapper wraps is compiled",
        )
    if _has_backward_hooks(m):
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"{value.describe()} has backward hooks",
            hint="backward hooks wrap the module's inputs and outputs at run time; call the "
            "module outside the compiled region, or register hooks on tensors instead",
        )
    call = type(m).__call__
    if call is not nn_module.Module.__call__ and isinstance(call, types.FunctionType):
        # a subclass's own __call__ (which usually calls super().__call__) runs as written
        return BoundMethodValue(UserFunctionValue(call), value).call(tx, args, kwargs)
    forward = value.getattr(tx, "forward")
    if not has_forward_hooks(m) and not _hooks_changed_in_trace(tx, m):
        if value.source is not None:
            tx.ctx.guards.add(GuardKind.NO_HOOKS, value.source, type(m))
        else:  # made in the trace (no hooks of its own): global hooks would run too
            no_global_hooks(tx)
        return forward.call(tx, args, kwargs)
    hooks = _hook_tables(tx, value)
    with_kwargs = hooks["_forward_pre_hooks_with_kwargs"]
    for hook_id, hook in _entries(hooks, "_forward_pre_hooks"):
        if hook_id in with_kwargs:
            result = hook.call(tx, [value, TupleValue(list(args)), _as_dict(kwargs)], {})
            if not _is_none(result):
                pair = result.iterate(tx) if isinstance(result, TupleValue) else []
                if len(pair) != 2:
                    raise Unsupported(
                        BreakReason.EXCEPTION_RAISED,
                        "RuntimeError: forward pre-hook must return None or a tuple of "
                        "(new_args, new_kwargs)",
                    )
                args, kwargs = pair[0].iterate(tx), _keywords(tx, pair[1])
        else:
            result = hook.call(tx, [value, TupleValue(list(args))], {})
            if not _is_none(result):
                args = result.iterate(tx) if isinstance(result, TupleValue) else [result]
    output = forward.call(tx, args, kwargs)
    post_kwargs = hooks["_forward_hooks_with_kwargs"] | hooks["_global_forward_hooks_with_kwargs"]
    for hook_id, hook in _entries(hooks, "_forward_hooks"):
        call_args = [value, TupleValue(list(args))]
        if hook_id in post_kwargs:
            call_args.append(_as_dict(kwargs))
        result = hook.call(tx, [*call_args, output], {})
        if not _is_none(result):
            output = result
    return output


def _hooks_changed_in_trace(tx: Translator, m: torch.nn.Module) -> bool:
    """Whether the trace registered or removed forward hooks (of `m` or global ones): the
    real tables are as they were before the trace then, and only the traced ones tell."""
    tables = [getattr(m, name) for name in _MODULE_HOOKS]
    tables += [getattr(nn_module, name) for name in _GLOBAL_HOOKS]
    tracked = [tx.ctx.builder.tracked(table) for table in tables]
    return any(v is not None and tx.ctx.effects.is_mutated(v) for v in tracked)


def _hook_tables(tx: Translator, value: ModuleValue) -> dict[str, Any]:
    """The module's and the global hook dicts: hooks as guarded values (their keys and the
    hooks' identities are guarded), the marker dicts as sets of hook ids."""
    builder = tx.ctx.builder
    tables: dict[str, Any] = {}
    for name in _MODULE_HOOKS:
        table = getattr(value.module, name)
        source = AttrSource(value.source, name) if value.source is not None else None
        tables[name] = _wrap_table(builder, table, source)
    for name in _GLOBAL_HOOKS:
        source = ForeignGlobalSource(nn_module.__dict__, name)
        tables[name] = _wrap_table(builder, getattr(nn_module, name), source)
    return tables


def _wrap_table(builder: Any, table: dict, source: Any) -> Any:
    if source is None:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "hooks on a module made in the trace")
    wrapped = builder.wrap(table, source)
    return {key for key in wrapped.items} if _is_marker(wrapped) else wrapped


def _is_marker(table: Value) -> bool:
    """`_forward_hooks_with_kwargs` and kin map hook ids to True (or are sets); an empty
    table holds no hooks either way. Read from the trace's value: hooks registered in the
    trace are in it only."""
    items = getattr(table, "items", None)
    if not isinstance(items, dict):
        return True
    return all(v.is_constant() and v.as_constant() is True for v in items.values())


def _entries(tables: dict[str, Any], name: str) -> list[tuple[int, Value]]:
    """Global hooks first, then the module's, as `_call_impl` runs them."""
    entries = []
    for table in (tables[f"_global{name}"], tables[name]):
        if not isinstance(table, set):
            entries.extend(table.items.items())
    return entries


def _as_dict(kwargs: dict[str, Value]) -> Value:
    from ember.capture.values.containers import DictValue

    return DictValue(dict(kwargs))


def _keywords(tx: Translator, value: Value) -> dict[str, Value]:
    from ember.capture.values.containers import DictValue

    if not isinstance(value, DictValue):
        raise Unsupported(BreakReason.UNSUPPORTED_OBJECT, f"keywords as {value.describe()}")
    return {str(k): v for k, v in value.items.items()}


def _is_none(value: Value) -> bool:
    return value.is_constant() and value.as_constant() is None


class BornModuleValue(ModuleValue):
    """An nn.Module made during capture: the real object built at capture stands for what
    each call makes anew. It has no parameters or buffers, so nothing about it can differ
    from call to call but what the recipe's constants fix."""

    def __init__(
        self, module: torch.nn.Module, recipe: tuple[Any, list[Value], dict[str, Value]]
    ) -> None:
        super().__init__(module, None)
        self.recipe = recipe
        """(callable, arguments, keywords) that make the module again at run time."""
        self.children: dict[str, Value] = {}
        """Key -> the child's value (for a slice: reached through the parent's source)."""
        self.attrs: dict[str, Value] = {}
        self._table: DictValue | None = None
        """`_modules` as the trace reads and writes it (add_module, append, insert): the
        children themselves, so what the trace adds is what the container then holds."""
        self._made_with: list[tuple[str, int]] = []

    def describe(self) -> str:
        return f"module {type(self.module).__name__} made in the trace"

    def _modules_table(self) -> DictValue:
        if self._table is None:
            self._table = DictValue({})
            self._table.items = self.children
            self._made_with = self._layout()
        return self._table

    def _layout(self) -> list[tuple[str, int]]:
        return [(key, id(child)) for key, child in self.children.items()]

    def getattr(self, tx: Translator, name: str) -> Value:
        if name in self.attrs:
            return self.attrs[name]
        if name == "_modules" and not isinstance(self.module, torch.nn.ParameterList):
            return self._modules_table()
        if name in self.children:
            return self.children[name]
        m = self.module
        for table in (m.__dict__, m._parameters, m._buffers):  # the tables hold only None
            if name in table:
                return tx.ctx.builder.wrap_const(table[name])
        return _class_attribute(tx, self, type(m), name, None)

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        tx.ctx.effects.touch(self)
        if isinstance(value, ModuleValue) or (name in self.children and _is_none(value)):
            self._modules_table()  # as Module.__setattr__: a submodule goes to `_modules`
            self.children[name] = value
            self.attrs.pop(name, None)
            return
        self.attrs[name] = value

    def setitem(self, tx: Translator, key: Value, value: Value) -> None:
        self._container_method(tx, "__setitem__", [key, value])

    def delitem(self, tx: Translator, key: Value) -> None:
        self._container_method(tx, "__delitem__", [key])

    def _container_method(self, tx: Translator, name: str, args: list[Value]) -> None:
        """`layers[i] = m`, `del blocks[k]`: the container class's own method, inlined (it
        writes `_modules`)."""
        method = getattr(type(self.module), name, None)
        if not isinstance(method, types.FunctionType):
            raise Unsupported(BreakReason.SIDE_EFFECT, f"{name} on {self.describe()}")
        UserFunctionValue(method).call(tx, [self, *args], {})

    def iterate(self, tx: Translator) -> list[Value]:
        if isinstance(self.module, torch.nn.ModuleDict):
            return [ConstantValue(k) for k in self.children]
        return list(self.children.values())

    def length(self, tx: Translator) -> int:
        return len(self.children)

    def getitem(self, tx: Translator, key: Value) -> Value:
        k = key.as_constant()
        if isinstance(k, slice):
            return slice_container(self, k, list(self.children.values())[k])
        if isinstance(k, int):
            k = list(self.children)[k]
        return self.children[k]

    def reconstruct(self, em: Emitter) -> None:
        if self.attrs or (self._table is not None and self._layout() != self._made_with):
            raise Unsupported(
                BreakReason.UNSUPPORTED_OBJECT,
                f"{self.describe()}, changed by the trace, cannot be made again after the graph",
            )
        fn, args, kwargs = self.recipe
        em.cg.load_const(fn, push_null=True)
        for arg in [*args, *kwargs.values()]:
            em.reconstruct(arg)
        em.cg.call(len(args) + len(kwargs), tuple(kwargs))


def slice_container(parent: ModuleValue, window: slice, children: list[Value]) -> BornModuleValue:
    """`layers[1:]` of a Sequential, ModuleList or ParameterList: a new container of the same
    class (as its `__getitem__` makes) holding the selected children (modules, or the very
    parameters), which keep their guarded sources."""
    born = BornModuleValue(
        parent.module[window], (operator.getitem, [parent, ConstantValue(window)], {})
    )
    m = born.module
    keys = m._parameters if isinstance(m, torch.nn.ParameterList) else m._modules
    born.children = dict(zip(keys, children))
    return born


def module_child(parent: torch.nn.Module, key: str) -> torch.nn.Module:
    """Run-time half of rebuilding a child that a module made in the trace made itself."""
    return parent._modules[key]


def _leaves(value: Value) -> list[Value]:
    """The values inside the lists, tuples and dicts of a constructor's arguments
    (`nn.ModuleList([nn.ReLU(), nn.Identity()])`, `nn.ModuleDict({...})`)."""
    if isinstance(value, SequenceValue) and not value.is_constant():
        return [leaf for item in value.items for leaf in _leaves(item)]
    if isinstance(value, DictValue) and not value.is_constant():
        if not all(isinstance(k, (str, int)) for k in value.items):
            return [value]
        return [leaf for item in value.items.values() for leaf in _leaves(item)]
    return [value]


def construct_module(tx: Translator, cls: type, args: list[Value], kwargs: dict) -> Value:
    """`cls(...)` for an nn.Module class in the traced code: a torch class is built now from
    constant arguments and modules made in the trace (a loss, an activation, a container of
    such); refused when it holds parameters (made at random on every eager call) or needs
    values known only at run time. A class of the user's, one holding buffers, or a
    container of modules whose constructor the trace ran, is built by tracing its
    constructor (values/built_modules.py)."""
    given = [leaf for a in [*args, *kwargs.values()] for leaf in _leaves(a)]
    if runs_user_code(cls) or any(isinstance(a, BuiltModuleValue) for a in given):
        return build_module(tx, cls, args, kwargs)
    if not all(isinstance(a, BornModuleValue) or a.is_constant() for a in given):
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"creating module {cls.__name__} inside the trace from values known only at run time",
        )

    def real(a: Value) -> Any:
        if isinstance(a, BornModuleValue):
            return a.module
        if isinstance(a, SequenceValue) and not a.is_constant():
            return a.python_type()(map(real, a.items))
        if isinstance(a, DictValue) and not a.is_constant():
            return {k: real(v) for k, v in a.items.items()}
        return a.as_constant()

    # the constructor runs now, while capturing, and may draw random numbers (initial
    # weights): the generators are put back, or the user's next draw would differ from eager
    cuda = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=cuda):
            module = cls(*map(real, args), **{k: real(v) for k, v in kwargs.items()})
    except Exception as exc:
        raise Unsupported(
            BreakReason.EXCEPTION_RAISED, f"{cls.__name__}(...) raised {type(exc).__name__}"
        ) from exc
    if any(True for _ in module.parameters()):
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"creating module {cls.__name__} with parameters or buffers inside the trace",
            hint="create the module in __init__ and reuse it",
        )
    if any(True for _ in module.buffers()):  # new tensors on every call: traced
        return build_module(tx, cls, args, kwargs)
    born = BornModuleValue(module, (cls, list(args), dict(kwargs)))
    passed = {id(a.module): a for a in given if isinstance(a, BornModuleValue)}
    for key, child in module._modules.items():
        if child is None:
            born.children[key] = ConstantValue(None)
        else:  # a module passed in keeps its value (its identity); others are made anew
            born.children[key] = passed.get(id(child)) or BornModuleValue(
                child, (module_child, [born, ConstantValue(key)], {})
            )
    return born
