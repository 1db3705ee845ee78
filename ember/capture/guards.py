"""Guards: the assumptions a capture relied on, compiled into one Python check function.

The guard function takes the same parameters as the user's function (same defaults), so the
cache can call `guard(*args, **kwargs)` without binding arguments itself. Its source is kept on
the cache entry (`EMBER_LOGS=guards` prints it); on a miss, `first_failure` names the check that
failed (for `EMBER_LOGS=recompiles` and the recompile-limit warning).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import operator
import re
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ember import torch_compat
from ember.capture.shapes import symbolic_tensor_conditions
from ember.capture.sources import (
    AttrSource,
    GuardScope,
    LocalSource,
    ModuleEntrySource,
    Source,
    attr_source,
)


class GuardKind(enum.Enum):
    TENSOR_MATCH = "tensor type, dtype, device, shape, stride and requires_grad"
    EQUALS_MATCH = "type and value of a baked constant"
    ID_MATCH = "identity of a function, module or class the trace relied on"
    TYPE_MATCH = "exact type of an object whose attributes the trace read"
    CLASS_MEMBER = "the method, property or staticmethod a class has for a name the trace ran"
    LENGTH_MATCH = "length of a container the trace iterated or indexed"
    DICT_KEYS = "keys (in order) of a dict the trace read"
    NONE_MATCH = "value is None"
    SAME_OBJECT = "two sources hold the same tensor"
    DISTINCT_OBJECTS = "two sources hold different objects (an `is` the trace answered False)"
    GRAD_MODE = "torch.is_grad_enabled()"
    INFERENCE_MODE = "torch.is_inference_mode_enabled(), where the trace asked for it"
    NO_HOOKS = "module has no forward or backward hooks"
    MISSING_ATTR = "an attribute the trace found missing (hasattr, getattr default) stays so"
    ABSENT_ATTR = (
        "an instance lookup that found nothing still does: the name is in no class dict of"
        " the MRO, not in the instance dict (nor nn.Module's tables), and no __getattr__"
    )
    DICT_CONTAINS = "a key the trace looked up in a dict is still present (or still absent)"
    SYMBOLIC_TENSOR = "tensor type, dtype, device, static sizes, strides of symbolic sizes"
    SIZE_RELATION = "a relation between size symbols the trace relied on (s0 >= 2, s0 == s1)"
    INT_SYMBOL = "an int argument that is a size symbol is still an int"
    CONSTANT_TUPLE = "a module's tuple of plain constants (a stride) is the same tuple, or equal"
    INSTANCE_ATTR = (
        "an attribute read as an instance dict item is what the default lookup finds: the"
        " exact type, and no class of its MRO has the name or a __getattribute__"
    )


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Guard:
    kind: GuardKind
    source: Source | None
    expected: Any = None

    def key(self) -> tuple:
        return (self.kind, self.source, _hashable(self.expected))

    def conditions(self, scope: GuardScope) -> list[str]:
        """Python boolean expressions, all of which must hold."""
        return _CONDITIONS[self.kind](self, scope)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return id(value)


def tensor_match(*tensors: torch.Tensor) -> Any:
    """A C++ check that tensors match `tensors` as TENSOR_MATCH guards' conditions say (and,
    stricter, in their dispatch keys: a conjugate or negative view, a tensor subclass's
    keys): `tensor_match(a, b).check(x, y)` checks x against a and y against b, in one
    call."""
    # it keeps this thread's dispatch keys from its construction: the caller's, not those
    # of the capture, which runs outside the caller's inference mode and autocast
    with torch_compat.in_callers_modes():
        return torch_compat.TensorMatch(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )


def _is_argument(source: Source) -> bool:
    """A value passed in the call (`x`, `kwargs['ids']`, `xs[0]`) rather than reached
    through an object's attributes (a module's parameters): what changes between calls."""
    while not isinstance(source, LocalSource):
        if isinstance(source, (AttrSource, ModuleEntrySource)):
            return False
        source = getattr(source, "base", None)
        if source is None:
            return False
    return True


def _tensor_conditions(g: Guard, scope: GuardScope) -> list[str]:
    """The tensor's type, dtype, device, layout and requires_grad; with size symbols (a
    SYMBOLIC_TENSOR guard) the layout is its static sizes and strides as expressions."""
    e = g.source.expr(scope)
    if g.kind is GuardKind.SYMBOLIC_TENSOR:
        t, example, symbols = g.expected
        layout = symbolic_tensor_conditions(e, example, t, scope, dict(symbols))
    else:
        t = g.expected
        layout = [f"{e}.shape == {tuple(t.shape)!r}", f"{e}.stride() == {tuple(t.stride())!r}"]
    return [
        f"type({e}) is {scope.const(type(t), 'T')}",
        f"{e}.dtype is {scope.const(t.dtype, 'dtype')}",
        f"{e}.device == {scope.const(t.device, 'dev')}",
        *layout,
        f"{e}.requires_grad is {t.requires_grad}",
    ]


def _equals_conditions(g: Guard, scope: GuardScope) -> list[str]:
    e = g.source.expr(scope)
    value = g.expected
    if isinstance(value, torch.dtype) or type(value) in (bool, type(None)):  # singletons
        return [f"{e} is {scope.const(value)}"] if value is not None else [f"{e} is None"]
    same_type = f"type({e}) is {scope.const(type(value), 'T')}"
    if isinstance(value, float) and value != value:
        return [same_type, f"{e} != {e}"]  # NaN: equal to nothing, itself included
    if type(value) in (int, str) or type(value) is float and math.isfinite(value):
        return [same_type, f"{e} == {value!r}"]  # readable where repr is Python
    return [same_type, f"{e} == {scope.const(value)}"]  # inf, torch.Size, complex, ...


def _constant_tuple(g: Guard, scope: GuardScope) -> list[str]:
    """One condition for a whole tuple: the very object the module held at capture (a
    tuple is immutable: the same object has the same items), else an equal tuple with
    items of the same types (`2 == 2.0`). A conv net's strides, paddings and kernel sizes
    cost one `is` each per call instead of a length and a type and value per item."""
    e = g.source.expr(scope)
    value = g.expected
    held = scope.const(value, "tup")
    types = scope.const(tuple(map(type, value)), "types")
    return [
        f"{e} is {held} or (type({e}) is tuple and {e} == {held}"
        f" and tuple(map(type, {e})) == {types})"
    ]


def _dict_keys(g: Guard, scope: GuardScope) -> list[str]:
    e = g.source.expr(scope)
    keys = g.expected[1]
    if all(type(k) in (str, int) for k in keys):
        expected = repr(keys)
    else:  # classes, functions, modules: compared by identity, held by the guard
        expected = scope.const(list(keys), "keys")
    checks = [f"type({e}) is {scope.const(g.expected[0], 'T')}"]
    if any(isinstance(k, torch.Tensor) for k in keys):
        # tensor keys (an optimizer's state): `==` between two tensors is elementwise, and
        # a one-element tensor's truth is its value; identity is what the dict compares
        same = scope.const(operator.is_, "is")
        return [*checks, f"len({e}) == {len(keys)}", f"all(map({same}, {e}, {expected}))"]
    return [*checks, f"list({e}) == {expected}"]


def _identity_condition(expr: str, value: Any, scope: GuardScope) -> str:
    """`expr is value`, by address for objects the cache entry can outlive only weakly (a
    module, a function): the guard must not keep a dropped model alive."""
    address = scope.identity(value)
    if address is None:
        return f"{expr} is {scope.const(value)}"
    return f"___id({expr}) == {address}"


def _absent_conditions(g: Guard, scope: GuardScope) -> list[str]:
    """What the default lookup of `name` consults, as dict lookups: cheaper than a
    `hasattr` that raises inside, through `Module.__getattr__` or a Python
    `__getattribute__`, on every call."""
    name, cls, *instance = g.expected  # (name, cls, False): the instance dict not consulted
    e = g.source.expr(scope)
    conditions = [f"type({e}) is {scope.const(cls, 'T')}"]
    module = issubclass(cls, torch.nn.Module)
    for klass in cls.__mro__[:-1]:  # object's dict cannot change
        names = [name]
        if not (module and issubclass(torch.nn.Module, klass)):
            names.append("__getattr__")  # nn.Module's is modelled: its tables below
        mapping = scope.class_dict(klass)  # a live view of the class's dict
        conditions.extend(f"{n!r} not in {mapping}" for n in names)
    if cls.__dictoffset__ and instance != [False]:
        instance_dict = attr_source(g.source, "__dict__", cls).expr(scope)
        conditions.append(f"{name!r} not in {instance_dict}")
    if module:
        for table in ("_parameters", "_buffers", "_modules"):
            conditions.append(f"{name!r} not in {AttrSource(g.source, table).expr(scope)}")
    return conditions


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _instance_attr(g: Guard, scope: GuardScope) -> list[str]:
    """The class checks are the same string for every instance of a class: deduplicated,
    a conv net's 50 convolutions check them once."""
    name, cls = g.expected
    return _default_lookup(g.source.expr(scope), cls, (name,), scope)


def _default_lookup(e: str, cls: type, names: tuple[str, ...], scope: GuardScope) -> list[str]:
    """`e` is exactly a `cls`, and no class of its MRO (object's dict cannot change) has
    one of `names` or a `__getattribute__`: reading them from the instance dict is what
    the default attribute lookup would find."""
    return [
        f"type({e}) is {scope.const(cls, 'T')}",
        *(
            f"{n!r} not in {scope.class_dict(k)}"
            for k in cls.__mro__[:-1]
            for n in (*names, "__getattribute__")
        ),
    ]


def _no_hooks(g: Guard, scope: GuardScope) -> list[str]:
    """The module's four hook tables are empty (and the global ones). Where the guard knows
    the module's class (`expected`), the tables are read as items of the instance dict: an
    attribute read on an nn.Module goes through CPython's slow path for classes defining
    `__getattr__` (~2x a dict item; a MobileNetV2 call checks 200 modules). That read is
    the default lookup's answer while no class of the MRO has the table's name nor a
    `__getattribute__`: checked too, once per class (shared by all its instances)."""
    e = g.source.expr(scope)
    cls = g.expected
    tables = [f"{e}.{name}" for name in _HOOK_TABLES]
    conditions: list[str] = []
    if isinstance(cls, type) and cls.__dictoffset__:
        names = (*_HOOK_TABLES, "__getattribute__")
        if not any(n in k.__dict__ for k in cls.__mro__[:-1] for n in names):
            conditions = _default_lookup(e, cls, _HOOK_TABLES, scope)
            instance_dict = AttrSource(g.source, "__dict__").expr(scope)
            tables = [f"{instance_dict}[{name!r}]" for name in _HOOK_TABLES]
    return [
        *conditions,
        f"not ({' or '.join(tables)})",
        "not (___hooks._global_forward_hooks or ___hooks._global_forward_pre_hooks"
        " or ___hooks._global_backward_hooks or ___hooks._global_backward_pre_hooks)",
    ]


_CONDITIONS: dict[GuardKind, Callable[[Guard, GuardScope], list[str]]] = {
    GuardKind.TENSOR_MATCH: _tensor_conditions,
    GuardKind.EQUALS_MATCH: _equals_conditions,
    GuardKind.ID_MATCH: lambda g, s: [_identity_condition(g.source.expr(s), g.expected, s)],
    GuardKind.TYPE_MATCH: lambda g, s: [f"type({g.source.expr(s)}) is {s.const(g.expected, 'T')}"],
    # held by the guard (as its class holds it): `is` costs less than `___id(...) == N`
    GuardKind.CLASS_MEMBER: lambda g, s: [f"{g.source.expr(s)} is {s.const(g.expected, 'm')}"],
    GuardKind.LENGTH_MATCH: lambda g, s: [
        f"type({g.source.expr(s)}) is {s.const(g.expected[0], 'T')}",
        f"len({g.source.expr(s)}) == {g.expected[1]}",
    ],
    GuardKind.DICT_KEYS: _dict_keys,
    GuardKind.NONE_MATCH: lambda g, s: [f"{g.source.expr(s)} is None"],
    GuardKind.SAME_OBJECT: lambda g, s: [f"{g.source.expr(s)} is {g.expected.expr(s)}"],
    GuardKind.DISTINCT_OBJECTS: lambda g, s: [f"{g.source.expr(s)} is not {g.expected.expr(s)}"],
    GuardKind.GRAD_MODE: lambda g, s: [f"___torch.is_grad_enabled() is {g.expected}"],
    GuardKind.INFERENCE_MODE: lambda g, s: [
        f"___torch.is_inference_mode_enabled() is {g.expected}"
    ],
    GuardKind.NO_HOOKS: _no_hooks,
    GuardKind.MISSING_ATTR: lambda g, s: [f"not hasattr({g.source.expr(s)}, {g.expected!r})"],
    GuardKind.ABSENT_ATTR: _absent_conditions,
    GuardKind.DICT_CONTAINS: lambda g, s: [
        f"({g.expected[0]!r} in {g.source.expr(s)}) is {g.expected[1]}"
    ],
    GuardKind.SYMBOLIC_TENSOR: _tensor_conditions,
    GuardKind.SIZE_RELATION: lambda g, s: [g.expected.condition(s)],
    GuardKind.INT_SYMBOL: lambda g, s: [f"type({g.source.expr(s)}) is int"],
    GuardKind.CONSTANT_TUPLE: _constant_tuple,
    GuardKind.INSTANCE_ATTR: _instance_attr,
}


def _no_aliasing(guards: GuardSet, scope: GuardScope) -> list[str]:
    """The graph treats distinct tensor inputs as distinct memory (a functionalizing backend
    reorders their reads and writes), so a call that passes one tensor through two sources
    must not reuse the entry. Tensors that were one object at capture have one input and a
    SAME_OBJECT guard instead."""
    tensors = (GuardKind.TENSOR_MATCH, GuardKind.SYMBOLIC_TENSOR)
    exprs = [g.source.expr(scope) for g in guards if g.kind in tensors]
    if len(exprs) < 2:
        return []
    return [f"len({{{', '.join(f'id({e})' for e in exprs)}}}) == {len(exprs)}"]


class GuardSet:
    """Guards collected during one capture, deduplicated, in the order they were added."""

    def __init__(self) -> None:
        self._guards: dict[tuple, Guard] = {}

    def add(self, kind: GuardKind, source: Source | None, expected: Any = None) -> None:
        guard = Guard(kind, source, expected)
        self._guards.setdefault(guard.key(), guard)

    def discard_source(self, source: Source) -> None:
        """Forget the guards on an input that turned out unused."""
        for key in [k for k, g in self._guards.items() if g.source == source]:
            del self._guards[key]

    def __iter__(self):
        return iter(self._guards.values())

    def __len__(self) -> int:
        return len(self._guards)


@dataclasses.dataclass(slots=True)
class GuardFunction:
    check: Callable[..., bool]
    source_text: str
    conditions: list[str]
    """The checks, in order, with the sources' readable names substituted."""
    statements: list[tuple[str, str]]
    """("let", assignment) or ("check", condition), as the check function runs them."""
    scope: dict[str, Any]
    signature: str
    expansions: dict[str, list[str]]
    """A check done by one C++ call (a tensor's match) -> the Python conditions it stands
    for, which reports and listings show."""
    held_by_identity: list[weakref.ref] = dataclasses.field(default_factory=list)

    def identities(self) -> list[Any]:
        """The live objects the checks compare by address."""
        return [obj for obj in (ref() for ref in self.held_by_identity) if obj is not None]

    def spelled_out(self) -> list[tuple[str, str]]:
        """The statements with each C++ check replaced by the conditions it stands for."""
        return [
            (kind, c)
            for kind, text in self.statements
            for c in (self.expansions.get(text, [text]) if kind == "check" else [text])
        ]

    def first_failure(self, *args: Any, **kwargs: Any) -> str:
        """The first condition that does not hold for these arguments, readably."""
        # the failing condition's index, made readable alone: rewriting every condition's
        # names first was a third of a large model's recompile report
        statements = self.spelled_out()
        body = [
            text if kind == "let" else f"if not ({text}): return {i}"
            for i, (kind, text) in enumerate(statements)
        ]
        explain = _compile(self.signature, body, self.scope, self.check, report=True)
        try:
            failed = explain(*args, **kwargs)
        except Exception as exc:  # reading a source raised: report that
            return f"guard evaluation raised {type(exc).__name__}: {exc}"
        return "(all guards hold)" if failed is None else self._readable(statements[failed][1])

    def _readable(self, text: str) -> str:
        names = self.scope.get("___readable", {})
        return re.sub(r"___v\d+", lambda m: names.get(m.group(0), m.group(0)), text)


def parameter_list(code: types.CodeType) -> str:
    """`a, b, /, c, *args, d, **kwargs` for a code object's signature (no defaults)."""
    names = code.co_varnames
    pos = code.co_argcount
    posonly = code.co_posonlyargcount
    kwonly = code.co_kwonlyargcount
    parts = list(names[:pos])
    if posonly:
        parts.insert(posonly, "/")
    i = pos + kwonly
    if code.co_flags & inspect.CO_VARARGS:
        parts.append("*" + names[i])
        i += 1
    elif kwonly:
        parts.append("*")
    parts.extend(names[pos : pos + kwonly])
    if code.co_flags & inspect.CO_VARKEYWORDS:
        parts.append("**" + names[i])
    return ", ".join(parts)


def _compile(
    signature: str,
    body: list[str],
    scope: dict[str, Any],
    like: Callable[..., Any],
    report: bool = False,
) -> Callable[..., Any]:
    """Compile guard statements into a function with `like`'s signature and defaults. The
    check returns False when a statement raises; the report variant lets it propagate."""
    failure = "        raise" if report else "        return False"
    done = "    return None" if report else "    return True"
    lines = ["    try:", *(f"        {line}" for line in body), "    except Exception:", failure]
    text = f"def ___guard({signature}):\n" + "\n".join(lines + [done]) + "\n"
    namespace: dict[str, Any] = dict(scope)
    exec(compile(text, "<ember guard>", "exec"), namespace)
    fn = namespace["___guard"]
    fn.__defaults__ = like.__defaults__
    fn.__kwdefaults__ = like.__kwdefaults__
    fn.__qualname__ = like.__qualname__  # a call that does not fit says `f() takes ...`
    fn.__ember_source__ = text
    return fn


def _check_body(statements: list[tuple[str, str]]) -> list[str]:
    """The check function's statements: each run of conditions between two assignments is one
    `if not (a and b and ...)`. Same order and short-circuit as one `if` per condition, but
    fewer statements for `compile` to parse (most of guard building for a large model)."""
    body: list[str] = []
    run: list[str] = []
    for kind, text in [*statements, ("end", "")]:
        if kind == "check":
            run.append(text)
            continue
        if run:
            body.append(f"if not ({' and '.join(f'({c})' for c in run)}): return False")
            run = []
        if text:
            body.append(text)
    return body


def _scope_names(scope: GuardScope, fn: types.FunctionType) -> dict[str, Any]:
    names = dict(scope.names)
    names.update(___G=fn.__globals__, ___closure=fn.__closure__, ___torch=torch, ___id=id)
    names["___autocast"] = torch_compat.is_any_autocast_enabled
    names["___autocast_state"] = torch_compat.autocast_state
    names["___hooks"] = torch.nn.modules.module
    names["___readable"] = scope.readable
    return names


def build_reader(sources: list[Source], fn: types.FunctionType) -> Callable[..., list]:
    """A function with `fn`'s signature returning the values of `sources` for a call (what
    automatic dynamic compares with the sizes a capture saw)."""
    scope = GuardScope()
    exprs = [source.expr(scope) for source in sources]
    body = [*scope.take_assignments(), f"return [{', '.join(exprs)}]"]
    return _compile(parameter_list(fn.__code__), body, _scope_names(scope, fn), fn, report=True)


def build_guard_function(guards: GuardSet, fn: types.FunctionType) -> GuardFunction:
    """Compile all guards into one function with `fn`'s signature: each source is read once
    into a local, then every check runs in the order the guards were added."""
    scope = GuardScope()
    statements: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(conditions: list[str], fast: str | None = None) -> None:
        statements.extend(("let", a) for a in scope.take_assignments())
        fresh = [c for c in conditions if c not in seen]
        seen.update(fresh)
        if fast is not None and fresh:  # one C++ call checks them all; reports list them
            statements.append(("check", fast))
            expansions[fast] = fresh
            return
        statements.extend(("check", c) for c in fresh)

    def add_tensors(group: list[Guard]) -> None:
        """One C++ call checks every tensor of the group (one call per tensor costs ~0.1 us
        each: a model's parameters add up)."""
        if not group:
            return
        conditions = [c for g in group for c in g.conditions(scope)]
        check = scope.const(tensor_match(*(g.expected for g in group)), "tm")
        add(conditions, f"{check}.check({', '.join(g.source.expr(scope) for g in group)})")

    expansions: dict[str, list[str]] = {}
    origins: list[tuple[str, str]] = []  # size relations and where the trace made them
    tensors = [g for g in guards if g.kind is GuardKind.TENSOR_MATCH]
    # the arguments' tensors first: they are what changes from call to call
    add_tensors([g for g in tensors if _is_argument(g.source)])
    for guard in guards:
        if guard.kind is GuardKind.TENSOR_MATCH:
            continue
        conditions = guard.conditions(scope)
        add(conditions)
        if guard.kind is GuardKind.SIZE_RELATION:
            origins.extend((c, guard.expected.where) for c in conditions)
    add_tensors([g for g in tensors if not _is_argument(g.source)])
    add(_no_aliasing(guards, scope))
    # Factory calls without a dtype (torch.zeros(n)) were traced under this default.
    add([f"___torch.get_default_dtype() is {scope.const(torch.get_default_dtype())}"])
    # The caller's autocast decided the casts recorded in the graph: the entry is only valid
    # under the same autocast state (cheaply checked as "off" when it was off).
    autocast = torch_compat.callers_autocast()
    if autocast:
        add([f"___autocast_state() == {scope.const(autocast)}"])
    else:
        add(["___autocast() is False"])
    names = _scope_names(scope, fn)
    signature = parameter_list(fn.__code__)
    check = _compile(signature, _check_body(statements), names, fn)
    result = GuardFunction(
        check,
        check.__ember_source__,
        [],
        statements,
        names,
        signature,
        expansions,
        scope.held_by_identity,
    )
    result.conditions = [result._readable(t) for kind, t in result.spelled_out() if kind == "check"]
    result.source_text += "".join(  # what each C++ tensor check stands for, readably
        f"# {result._readable(fast)}: {' and '.join(result._readable(c) for c in conds)}\n"
        for fast, conds in expansions.items()
    )
    if origins:
        result.source_text += "".join(
            f"# {result._readable(c)}  <- {where}\n" for c, where in origins
        )
    return result
