"""Turn real Python objects into symbolic values (Dynamo's VariableBuilder).

`wrap(obj, source)` is for objects reached from the frame: it installs the guard each kind of
value needs and deduplicates mutable objects by identity, so that every alias of a list, dict,
module or user object is the same Value. `wrap_const(obj)` is for objects the trace made or
folded itself: no source, no guard.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import itertools
import os
import random
import sys
import types
import weakref
from typing import TYPE_CHECKING, Any

import torch

from ember import torch_compat
from ember.capture.guards import GuardKind
from ember.capture.sources import (
    AttrSource,
    ConstSource,
    ItemSource,
    IterationSource,
    IteratorStateSource,
    ReduceArgsSource,
    Source,
    iterator_state,
)
from ember.capture.values.base import ConstantValue, Value, from_class_statement
from ember.capture.values.callables import getter_value
from ember.capture.values.compiler import is_allowed_in_graph, register_dynamo_functions
from ember.capture.values.containers import DictValue, ListValue, TupleValue, hashes_by_identity
from ember.capture.values.exceptions import ExceptionValue
from ember.capture.values.functions import (
    BoundMethodValue,
    BuiltinValue,
    PartialValue,
    TorchFunctionValue,
    UserFunctionValue,
)
from ember.capture.values.list_objects import is_list_object, wrap_list_object
from ember.capture.values.objects import (
    GradModeValue,
    ModuleValue,
    PyModuleValue,
    UserObjectValue,
)
from ember.capture.values.sets import SetValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import CaptureContext

_CONSTANT_TYPES = (
    int,
    float,
    bool,
    str,
    bytes,
    complex,
    type(None),
    type(Ellipsis),
    type(NotImplemented),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    range,
    torch.Size,
    types.CodeType,
    *((sys.modules["numpy"].generic, sys.modules["numpy"].dtype) if "numpy" in sys.modules else ()),
)

_SINGLETON_TYPES = (enum.Enum, dataclasses.Field)
_PLAIN_ITEM_TYPES = (int, float, str, bool, type(None))
"""Immutable in practice and compared by identity: enum members, a dataclass's fields."""

_KEY_TYPES = (str, int, float, type(None), type, types.FunctionType, enum.Enum, torch.nn.Module)
"""Keys of an outside dict that ember can stand for: constants compared by value (in the key
guard) and objects compared by identity (the guard holds them)."""


def _slotted(cls: type) -> bool:
    """A class written in Python whose instances keep their attributes in `__slots__`."""
    return from_class_statement(cls) and any("__slots__" in vars(k) for k in cls.__mro__)


def _is_torch_function(fn: Any) -> bool:
    module = getattr(fn, "__module__", None) or ""
    if isinstance(
        fn,
        (
            types.BuiltinFunctionType,
            types.MethodDescriptorType,
            types.WrapperDescriptorType,
            torch_compat.FunctionBase,
        ),
    ):
        return (
            module.startswith("torch")
            or getattr(fn, "__self__", None) in torch_compat.TORCH_C_NAMESPACES
            or isinstance(getattr(fn, "__objclass__", None), type)
            and issubclass(fn.__objclass__, torch_compat.TensorBase)
        )
    if isinstance(fn, torch_compat.OpOverloadPacket | torch_compat.OpOverload):
        return True
    return module in ("torch.nn.functional", "torch.functional", "torch._refs") or (
        module.startswith("torch.") and module.split(".")[1] in ("fft", "linalg", "special")
    )


class ValueBuilder:
    def __init__(self, ctx: CaptureContext) -> None:
        self.ctx = ctx
        self._by_id: dict[int, Value] = {}
        self._classes: dict[type, Value] = {}
        self._real: dict[int, tuple[Value, Any]] = {}
        self._module_attributes: set[Source] = set()

    def wrap(self, value: Any, source: Source) -> Value:
        """A guarded symbolic value for an object reached through `source`."""
        cached = self._by_id.get(id(value))
        if cached is not None:
            if cached.source is not None and cached.source != source:
                self.ctx.guards.add(GuardKind.SAME_OBJECT, source, cached.source)
            return cached
        result = self._wrap(value, source)
        if not isinstance(result, ConstantValue):
            self._by_id[id(value)] = result
        self._real[id(result)] = (result, value)
        return result

    def _early(self, value: Any, result: Value) -> Any:
        """`result`, the value of `value`, known before its items are wrapped: a container
        that holds itself (`lst.append(lst)`, alive at a break) then finds itself, and the
        item's guard is that it *is* the container (SAME_OBJECT)."""
        self._by_id[id(value)] = result
        self._real[id(result)] = (result, value)
        return result

    def tracked(self, value: Any) -> Value | None:
        """The symbolic value the trace already holds for this object, if any."""
        return self._by_id.get(id(value))

    def wrap_module_attribute(self, value: Any, source: Source) -> Value:
        """`module.name` of a plain attribute (see `_configures_a_module`)."""
        self._module_attributes.add(source)
        return self.wrap(value, source)

    def _configures_a_module(self, source: Source) -> bool:
        """An int inside a container attribute of a module (`conv.stride[0]`, a padding
        list) stays a constant under automatic and `dynamic=True` shapes, as Dynamo keeps the
        ints of modules: blocks of a class that differ in a stride or a padding are
        different programs, not one program over a varying size (and the kernels' geometry
        would turn symbolic). An int attribute itself (a counter, `self.calls += 1`) may
        become a symbol."""
        base = getattr(source, "base", None)
        while base is not None:
            if base in self._module_attributes:
                return True
            base = getattr(base, "base", None)
        return False

    def _plain_module_tuple(self, value: Any, source: Source) -> bool:
        """A plain tuple of ints, floats, strs, bools or Nones held by a module's attribute
        (a stride, a kernel size): its items stay constants (`_configures_a_module`), and
        one CONSTANT_TUPLE guard checks them all."""
        return (
            type(value) is tuple
            and all(type(v) in _PLAIN_ITEM_TYPES for v in value)
            and self._configures_a_module(ItemSource(source, 0))
        )

    def outside_values(self) -> list[Value]:
        """The values this capture made of outside objects (each reached through a source)."""
        return [value for value, _ in self._real.values() if value.source is not None]

    def existing(self, obj: Any) -> Value | None:
        """The value this capture already made of the outside object `obj`, if any."""
        return self._by_id.get(id(obj))

    def real_object(self, value: Value) -> Any | None:
        """The object a value reached through a source stands for (None for one made by
        the trace)."""
        entry = self._real.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else None

    def _int(self, value: int, source: Source) -> Value:
        """An int argument: a size symbol when it is dynamic, else a guarded constant. An
        int read again through the same source (`self.calls` twice) is the same symbol."""
        shapes = self.ctx.shapes
        symbol = shapes.int_symbols.get(source)
        if symbol is not None:
            return ConstantValue(symbol, source)
        if self._configures_a_module(source):
            self.ctx.guards.add(GuardKind.EQUALS_MATCH, source, value)
            return ConstantValue(value, source)
        shapes.observe(source, value)
        symbol = shapes.int_example(source, value)
        if type(symbol) is int:
            self.ctx.guards.add(GuardKind.EQUALS_MATCH, source, value)
        else:
            self.ctx.guards.add(GuardKind.INT_SYMBOL, source)
            self.ctx.out.symbol_input(source, symbol, value)
        return ConstantValue(symbol, source)

    def _wrap(self, value: Any, source: Source) -> Value:
        guards = self.ctx.guards
        if isinstance(value, torch.Tensor):
            return self.ctx.out.graph_input(source, value)
        if type(value) is int:
            return self._int(value, source)
        if isinstance(value, _CONSTANT_TYPES):
            guards.add(GuardKind.EQUALS_MATCH, source, value)
            return ConstantValue(value, source)
        if isinstance(value, _SINGLETON_TYPES):  # members are unique: the identity says all
            guards.add(GuardKind.ID_MATCH, source, value)
            return ConstantValue(value, source)
        if self._plain_module_tuple(value, source):
            guards.add(GuardKind.CONSTANT_TUPLE, source, value)
            items = [ConstantValue(v, ItemSource(source, i)) for i, v in enumerate(value)]
            return TupleValue(items, source)
        if isinstance(value, tuple):
            guards.add(GuardKind.LENGTH_MATCH, source, (type(value), len(value)))
            items = [self.wrap(v, ItemSource(source, i)) for i, v in enumerate(value)]
            struct = type(value) if type(value) is not tuple else None
            return TupleValue(items, source, struct_type=struct)
        if type(value) is list:
            guards.add(GuardKind.LENGTH_MATCH, source, (list, len(value)))
            result = self._early(value, ListValue([], source))  # it may hold itself
            result.items = [self.wrap(v, ItemSource(source, i)) for i, v in enumerate(value)]
            return result
        if isinstance(value, list) and is_list_object(type(value)):
            return wrap_list_object(self, value, source)
        if isinstance(value, dict | types.MappingProxyType):
            result = self._wrap_dict(value, source)
            if result is not None:
                return result
        if type(value) is collections.deque:
            from ember.capture.values.collection_types import DequeValue

            guards.add(GuardKind.LENGTH_MATCH, source, (collections.deque, len(value)))
            guards.add(GuardKind.EQUALS_MATCH, AttrSource(source, "maxlen"), value.maxlen)
            items = [self.wrap(v, ItemSource(source, i)) for i, v in enumerate(value)]
            return DequeValue(items, value.maxlen, source)
        if type(value) in _SEQUENCE_ITERATORS:
            return self._wrap_iterator(value, source)
        if type(value) in _LAZY_ITERATORS:
            result = self._wrap_lazy_iterator(value, source)
            if result is not None:
                return result
        if value is os.environ:
            return self._wrap_environ(source)
        if isinstance(value, torch.nn.Module):
            guards.add(GuardKind.TYPE_MATCH, source, type(value))
            return ModuleValue(value, source)
        if type(value) is weakref.ReferenceType:
            guards.add(GuardKind.TYPE_MATCH, source, weakref.ReferenceType)
            return WeakRefValue(value, source)
        if type(value) in (set, frozenset) and all(isinstance(v, _CONSTANT_TYPES) for v in value):
            # members and their order (a copy of a set need not iterate as the set does)
            guards.add(GuardKind.EQUALS_MATCH, IterationSource(source), list(value))
            result = SetValue(source=source, frozen=type(value) is frozenset)
            result.members = value  # read only: the trace never changes a set from outside
            result.entries = {k: ConstantValue(k) for k in value}
            return result
        return self._wrap_callable_or_object(value, source)

    def _wrap_dict(self, value: dict, source: Source) -> Value | None:
        """A dict (or a builtin dict type such as OrderedDict) with keys the guard can
        compare: constants, or objects that hash by identity (modules, classes, functions),
        whose identities the key guard pins. Dict subclasses written in Python are objects
        with items (values/mappings.py)."""
        from ember.capture.values.containers import IdentityKey
        from ember.capture.values.mappings import storage_type, wrap_dict_object

        cls = type(value)
        if cls not in (dict, collections.OrderedDict) and storage_type(cls) is not None:
            return wrap_dict_object(self, value, source)
        keys: dict[Any, Any] = {}
        for k in value:
            if isinstance(k, _KEY_TYPES) and not isinstance(k, torch.nn.Module):
                keys[k] = k
            elif isinstance(k, torch.nn.Module) or hashes_by_identity(type(k)):
                # compared by identity (the key guard holds them): modules, typing forms
                keys[k] = IdentityKey(self.wrap(k, ConstSource(k, f"key {type(k).__name__}")))
            else:
                return None
        self.ctx.guards.add(GuardKind.DICT_KEYS, source, (cls, list(value)))
        if cls in (dict, collections.OrderedDict):  # it may hold itself
            result = self._early(value, DictValue({}, source, dict_type=cls))
            result.items = {keys[k]: self.wrap(v, ItemSource(source, k)) for k, v in value.items()}
            return result
        items = {keys[k]: self.wrap(v, ItemSource(source, k)) for k, v in value.items()}
        if cls is collections.defaultdict:
            from ember.capture.values.collection_types import DefaultDictValue

            factory = self.wrap(value.default_factory, AttrSource(source, "default_factory"))
            return DefaultDictValue(items, factory, source)
        result = DictValue(items, source, dict_type=cls)
        result.read_only = cls is types.MappingProxyType
        return result

    def _wrap_iterator(self, value: Any, source: Source) -> Value:
        """A list or tuple iterator (an argument, or one break code handed to a resume
        function): its sequence and index, read without pulling it, are guarded; the items
        left are the sequence's from the index on."""
        from ember.capture.values.containers import OutsideIterator

        self.ctx.guards.add(GuardKind.TYPE_MATCH, source, type(value))
        sequence, index = iterator_state(value)
        self.ctx.guards.add(GuardKind.EQUALS_MATCH, IteratorStateSource(source, 1), index)
        if index < 0:
            return OutsideIterator([], source, 0, type(value))
        seq = self.wrap(sequence, IteratorStateSource(source, 0))
        result = OutsideIterator(seq.items, source, index, type(value))
        if isinstance(seq, ListValue):
            result.of_list = seq
        return result

    def _wrap_lazy_iterator(self, value: Any, source: Source) -> Value | None:
        """A map, filter or zip object (an argument; one break code made again lazily for a
        resume function): modelled over what it was made from (its `__reduce__`), so the
        trace pulls it as CPython would, calling the function at each pull. Only over
        iterators the trace can move and the ledger can put back (list and tuple
        iterators, or such objects over them); None otherwise."""
        from ember.capture.values.containers import IteratorValue
        from ember.capture.values.iterators import (
            FilterIterator,
            MapIterator,
            OutsideEnumerate,
            ZipIterator,
        )

        reduced = value.__reduce__()
        if len(reduced) != 2:  # zip(strict=True) keeps its flag in the state
            return None
        self.ctx.guards.add(GuardKind.TYPE_MATCH, source, type(value))
        parts = self.wrap(reduced[1], ReduceArgsSource(source)).items
        kind = type(value)
        if kind is enumerate:  # (iterator, count)
            if not isinstance(parts[0], IteratorValue) or not parts[1].is_constant():
                return None
            return OutsideEnumerate(parts[0], parts[1].as_constant(), source)
        iterators = parts if kind is zip else parts[1:]
        if not all(isinstance(it, IteratorValue) for it in iterators):
            return None
        if kind is zip:
            return ZipIterator(iterators)
        if kind is map:
            return MapIterator(parts[0], iterators)
        fn = None if parts[0].is_constant() and parts[0].as_constant() is None else parts[0]
        return FilterIterator(fn, iterators[0], keep_if=kind is filter)

    def _wrap_environ(self, source: Source) -> Value:
        """os.environ as a dict of its entries: its Mapping methods (`get`, `in`) catch the
        KeyError of a missing variable, which traced code cannot, and libraries read it in
        forward (transformers' attention). One guard compares its raw table (`_data`, a plain
        dict: a C-level comparison instead of a guard per variable), so setting or changing
        a variable recompiles; writes replay on os.environ after the graph."""
        from ember.capture.values.containers import DictValue

        env = os.environ
        self.ctx.guards.add(GuardKind.EQUALS_MATCH, AttrSource(source, "_data"), dict(env._data))
        items = {k: ConstantValue(v) for k, v in env.items()}
        return DictValue(items, source, dict_type=dict)

    def _wrap_callable_or_object(self, value: Any, source: Source) -> Value:
        guards = self.ctx.guards
        original = getattr(value, "_ember_original", None)
        if isinstance(value, types.FunctionType) and isinstance(original, types.FunctionType):
            # a function compiled with ember, called from compiled code: inline its original
            guards.add(GuardKind.ID_MATCH, source, value)
            return self.wrap(original, AttrSource(source, "_ember_original"))
        special = self._special(value)
        if isinstance(special, UserFunctionValue) and source.is_local() and _made_by_a_call(value):
            return self._by_code(special, source)
        if special is not None:
            guards.add(GuardKind.ID_MATCH, source, value)
            if special.source is None:  # closures and reloads of it are reached through it
                special.source = source
            return special
        if isinstance(value, types.MethodType) and value.__self__ is GLOBAL_RANDOM:
            guards.add(GuardKind.ID_MATCH, AttrSource(source, "__func__"), value.__func__)
            return GlobalRandomMethod(value, source)
        if isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType):
            owner = self.wrap(value.__self__, AttrSource(source, "__self__"))
            func_source = AttrSource(source, "__func__")
            guards.add(GuardKind.ID_MATCH, func_source, value.__func__)  # which method it is
            return BoundMethodValue(UserFunctionValue(value.__func__, func_source), owner, source)
        if isinstance(value, functools.partial):
            guards.add(GuardKind.TYPE_MATCH, source, type(value))
            guards.add(GuardKind.LENGTH_MATCH, AttrSource(source, "args"), (tuple, len(value.args)))
            guards.add(
                GuardKind.DICT_KEYS, AttrSource(source, "keywords"), (dict, list(value.keywords))
            )
            fn = self.wrap(value.func, AttrSource(source, "func"))
            args = [
                self.wrap(a, ItemSource(AttrSource(source, "args"), i))
                for i, a in enumerate(value.args)
            ]
            kwargs = {
                k: self.wrap(v, ItemSource(AttrSource(source, "keywords"), k))
                for k, v in value.keywords.items()
            }
            return PartialValue(fn, args, kwargs, source, value)
        if isinstance(value, functools._lru_cache_wrapper) and hasattr(value, "__wrapped__"):
            # lru_cache / cache: the wrapped function is inlined (as Dynamo does); the cache
            # itself is skipped, which only a function with side effects could tell (one
            # without `__wrapped__` is lru_cache's own, before update_wrapper: an object)
            guards.add(GuardKind.ID_MATCH, source, value)
            function = self.wrap(value.__wrapped__, AttrSource(source, "__wrapped__"))
            if isinstance(function, UserFunctionValue):
                function.cached_by = source
            return function
        getter = getter_value(value)
        if getter is not None:
            guards.add(GuardKind.ID_MATCH, source, value)
            return getter
        if isinstance(value, BaseException):  # a handler's exception, caught at a break
            guards.add(GuardKind.TYPE_MATCH, source, type(value))
            return ExceptionValue(type(value), [], source, value)
        if (hasattr(value, "__dict__") or _slotted(type(value))) and not isinstance(value, type):
            guards.add(GuardKind.TYPE_MATCH, source, type(value))
            return UserObjectValue(type(value), source, value)
        guards.add(GuardKind.TYPE_MATCH, source, type(value))
        return OpaqueValue(type(value), source)

    def _by_code(self, function: UserFunctionValue, source: Source) -> Value:
        """A local function or closure: guarded by its code and globals, as Dynamo guards
        closures, not by its identity. Its maker makes a new one on each call (a function
        rebuilt at a graph break and handed to the resume function is new on every call),
        and what inlining relies on besides the code is read through the source and guarded
        there: cell contents, defaults, keyword defaults, names, `__dict__` entries."""
        fn = function.fn
        guards = self.ctx.guards
        guards.add(GuardKind.TYPE_MATCH, source, types.FunctionType)
        guards.add(GuardKind.ID_MATCH, AttrSource(source, "__code__"), fn.__code__)
        guards.add(GuardKind.ID_MATCH, AttrSource(source, "__globals__"), fn.__globals__)
        function.source = source
        function.by_code = True
        return function

    def _special(self, value: Any) -> Value | None:
        """Values identified by what they are: functions, classes, Python modules."""
        if isinstance(value, types.FunctionType):
            from ember.capture.values.builtins import BUILTINS

            register_dynamo_functions(BUILTINS)
            if value in BUILTINS:  # Python functions modelled directly (dataclasses.fields)
                return BuiltinValue(value)
            from ember.capture.values.functorch import TransformInternals

            if TransformInternals.covers(value):
                return TransformInternals(value)
        if callable(value) and is_allowed_in_graph(value):
            return TorchFunctionValue(value)
        if isinstance(value, types.FunctionType) and not _is_torch_function(value):
            return UserFunctionValue(value)
        if _is_torch_function(value):
            return TorchFunctionValue(value)
        if (
            isinstance(
                value,
                (
                    types.BuiltinFunctionType,
                    types.MethodWrapperType,
                    types.BuiltinMethodType,
                    types.WrapperDescriptorType,
                    types.MethodDescriptorType,
                    functools.partial.__class__,
                ),
            )
            and callable(value)
            and not isinstance(value, type)
        ):
            return BuiltinValue(value)
        from ember.capture.values.builtins import is_numpy_ufunc

        if is_numpy_ufunc(value):  # called on constants, folded (values/builtins.py is_pure)
            return BuiltinValue(value)
        if any(value is c for c in (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)):
            return GradModeClassValue(value)
        if value is torch.inference_mode:
            from ember.capture.values.inference_mode import InferenceModeClassValue

            return InferenceModeClassValue()
        if isinstance(value, type):
            from ember.capture.values.builtins import BUILTINS

            if value in BUILTINS:
                return BuiltinValue(value)
            return self.class_value(value)
        if isinstance(value, types.ModuleType):
            return PyModuleValue(value)
        return None

    def class_value(self, cls: type) -> Value:
        """The one value of `cls` in this capture (class attribute writes are kept on it)."""
        from ember.capture.values.classes import ClassValue

        value = self._classes.get(cls)
        if value is None:
            value = self._classes[cls] = ClassValue(cls)
        return value

    def adopt_class(self, value: Value) -> None:
        """A class the trace made (values/made_classes.py) is its own value from now on."""
        self._classes[value.as_constant()] = value

    def wrap_const(self, value: Any) -> Value:
        """A value the trace produced itself (folded results, defaults, module attributes)."""
        if isinstance(value, _CONSTANT_TYPES + _SINGLETON_TYPES):
            return ConstantValue(value)
        if isinstance(value, torch.Tensor):
            return self.wrap(value, ConstSource(value, f"constant tensor {id(value):#x}"))
        special = self._special(value)
        if special is not None:
            special.source = ConstSource(value, getattr(value, "__qualname__", repr(value)))
            return special
        if isinstance(value, tuple) and type(value) is tuple:
            return TupleValue([self.wrap_const(v) for v in value])
        if isinstance(value, frozenset):
            return ConstantValue(value)
        return self.wrap(value, ConstSource(value, f"{type(value).__name__} {id(value):#x}"))


@dataclasses.dataclass(frozen=True, slots=True)
class WeakRefCallSource(Source):
    """`ref()`: the object a weak reference points to (nn.RNN keeps its weights so)."""

    base: Source

    def name(self) -> str:
        return f"{self.base.name()}()"

    def expr(self, scope: Any) -> str:
        return f"{self.base.expr(scope)}()"

    def emit(self, cg: Any) -> None:
        with cg.callee():
            self.base.emit(cg)
        cg.call(0)


class WeakRefValue(Value):
    """A weakref.ref: reached from the frame (calling it reads its referent, guarded) or made
    during capture (`weakref.ref(w)`, rebuilt by calling weakref.ref again after the graph)."""

    def __init__(
        self,
        ref: weakref.ReferenceType | None,
        source: Source | None,
        referent: Value | None = None,
    ) -> None:
        self.ref = ref
        self.source = source
        self.referent = referent

    def python_type(self) -> type:
        return weakref.ReferenceType

    def call(self, tx, args, kwargs) -> Value:
        if self.referent is not None:
            return self.referent
        return tx.ctx.builder.wrap(self.ref(), WeakRefCallSource(self.source))

    def reconstruct(self, em: Any) -> None:
        if self.source is not None:
            return super().reconstruct(em)
        em.cg.load_const(weakref.ref, push_null=True)
        em.reconstruct(self.referent)
        em.cg.call(1)


class OpaqueValue(Value):
    """An object ember cannot look into (a numpy array, a C extension's object, a
    `__slots__` class): it can be held, passed and returned as it is; anything done to it
    (an attribute, a call, a truth test) breaks the graph there and runs in Python."""

    def __init__(self, cls: type, source: Source) -> None:
        self.cls = cls
        self.source = source

    def describe(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__} object"

    def python_type(self) -> type:
        return self.cls  # pinned by the TYPE_MATCH guard

    def getattr(self, tx: Any, name: str) -> Value:
        method = getattr(self.cls, name, None)
        if _c_method(method) and self.cls.__dictoffset__ == 0 and self.source is not None:
            # a method of a C class whose objects have no instance dict: the class (pinned
            # by the type guard) decides it, so loading it is fine; calling it breaks
            return OpaqueMethodValue(self, name)
        raise Unsupported(
            BreakReason.UNSUPPORTED_OBJECT,
            f"attribute {name!r} of {self.describe()}, an object ember cannot look into",
        )


def _c_method(attr: Any) -> bool:
    return isinstance(attr, types.MethodDescriptorType | types.WrapperDescriptorType)


class OpaqueMethodValue(Value):
    """`obj.method` of an OpaqueValue: held until called, where the graph breaks and the
    call runs in Python (one break, at the call, as Dynamo takes it)."""

    def __init__(self, owner: OpaqueValue, name: str) -> None:
        self.owner = owner
        self.name = name
        self.source = AttrSource(owner.source, name)

    def describe(self) -> str:
        return f"{self.owner.cls.__qualname__}.{self.name} (a method of a C class)"


GLOBAL_RANDOM = random.random.__self__
"""The Random behind the `random` module's functions (`random.randint` is its bound method)."""


class GlobalRandomMethod(Value):
    """A method of the global Random written in Python (randint, uniform, choice, ...): a
    call breaks once, where CPython runs it (its draws and the state after them exactly
    eager's), instead of its Python being traced into a break at each C draw inside."""

    def __init__(self, method: types.MethodType, source: Source) -> None:
        self.name, self.source = method.__name__, source

    def python_type(self) -> type:
        return types.MethodType

    def describe(self) -> str:
        return f"random.{self.name} (a method of Python's global random.Random)"

    def call(self, tx: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"{self.describe()}: CPython draws")


class GradModeClassValue(Value):
    """torch.no_grad / enable_grad / set_grad_enabled as called in the trace."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls

    def describe(self) -> str:
        return self.cls.__name__

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.cls

    def call(self, tx, args, kwargs) -> Value:
        if self.cls is torch.no_grad:
            return GradModeValue(False)
        if self.cls is torch.enable_grad:
            return GradModeValue(True)
        mode = args[0].as_constant()
        previous = tx.grad_enabled()
        tx.set_grad_enabled(mode)  # set_grad_enabled acts when called, not on __enter__
        return GradModeValue(mode, restore_to=previous)


def _made_by_a_call(fn: types.FunctionType) -> bool:
    """A function defined inside another function (or a closure): one its maker makes
    anew on each call, so its identity says nothing about what it computes. (Only for
    arguments: one kept in a global or an attribute is usually made once, and a guard on
    its identity lets a break inside it resume in its own frame.)"""
    return bool(fn.__closure__) or "<locals>" in fn.__qualname__


_SEQUENCE_ITERATORS = (type(iter([])), type(iter(())))
_LAZY_ITERATORS = (map, filter, zip, itertools.filterfalse, enumerate)
