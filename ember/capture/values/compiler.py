"""The compiler-control API that libraries written for torch.compile call, honoured with
Dynamo's meaning, and ember's own names for it.

- `graph_break()` (ember's, `torch._dynamo.graph_break`): the graph ends at the call, which
  runs in Python (it does nothing), and capture resumes after it.
- `disable` (`ember.disable`, `torch._dynamo.disable`, `torch.compiler.disable`, as decorator
  or call): the function runs in plain Python; a compiled caller breaks around the call.
- `is_compiling()` (ember's, `torch.compiler.is_compiling`, `is_dynamo_compiling`,
  `torch._dynamo.is_compiling`): True while capturing, False in code run eagerly.
- `allow_in_graph(fn)`: calls of fn become one graph node (fn runs on meta tensors for its
  result's metadata, and for real when the graph runs), never inlined.
- `assume_constant_result(fn)`: fn is called while capturing, on constant arguments, and its
  result baked into the graph without a guard.

Dynamo's functions are recognised by identity once `torch._dynamo` is loaded (by the user:
ember never imports it, which costs seconds); its markers are read from the function
objects themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ember import torch_compat
from ember.capture.values.base import ConstantValue, Value
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


def graph_break() -> None:
    """End the graph here when compiled (capture resumes after the call); nothing eagerly."""


def is_compiling() -> bool:
    """True while ember (or torch.compile) captures the calling code; False when it runs
    eagerly."""
    return False


def disable(fn: Callable[..., Any] | None = None, recursive: bool = True) -> Any:
    """Mark a function never to be captured: compiled callers break around its calls and
    it runs in plain Python (with everything it calls)."""
    if fn is None:
        return lambda f: disable(f, recursive)
    fn._ember_disabled = True
    return fn


PYTHON_ONLY_MODULES = frozenset(
    [
        "logging",
        "torch.autograd",
        "torch.autograd.profiler",
        "torch.overrides",
        "torch.random",
        "torch.cuda.random",
    ]
)
"""Modules whose functions are never captured (torch.compile skips them too): calls break,
and the functions run in plain Python at the break (logging's handlers do I/O, and its
loggers cache levels through exceptions; `torch.autograd.grad`/`backward` run the autograd
engine; torch.overrides pops and pushes the thread's torch function modes, and so does the
profiler's `record_function`, which every optimizer step enters; `torch.manual_seed` and
the other seed and generator-state functions set the process's generators, and queue CUDA
seeding with a formatted stack: traced, they broke dozens of times inside traceback)."""


CLASS_BUILDERS = frozenset(
    [dataclasses.dataclass, dataclasses.make_dataclass, dataclasses._process_class]
)
"""Functions that build or rewrite a class (dataclasses' decorator with or without
arguments): they run in plain Python at a break, as under torch.compile. Traced, they made
dozens of breaks (exec, slot writes, class attribute writes) for one class statement."""


AUTOCAST_MODULES = frozenset(
    ["torch.amp.autocast_mode", "torch.cpu.amp.autocast_mode", "torch.cuda.amp.autocast_mode"]
)
"""Where torch.autocast and its per-device subclasses are defined: their `__enter__` and
`__exit__` called as methods (a `with` block resumed after a break holds the bound
`__exit__`) set autocast's process state, which CPython must do."""


_INFERENCE = ("inference_mode.__enter__", "inference_mode.__exit__")
"""A real `torch.inference_mode()` block's methods (one break code entered, at a break inside
a traced block): they set the thread's inference mode, which CPython must do."""


def runs_in_python(fn: Any) -> str | None:
    """Why calls of `fn` break and run in plain Python, or None when ember captures them."""
    if is_disabled(fn):
        return "is marked disable: it runs in Python"
    module = getattr(fn, "__module__", None)
    if module in PYTHON_ONLY_MODULES:
        return f"of {module} runs in Python"
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_filename == torch_compat.never_compiled_wrapper_file:
        return "is one torch never compiles (torch._disable_dynamo): it runs in Python"
    if any(fn is builder for builder in CLASS_BUILDERS):
        return "builds a class: it runs in Python"
    if module in AUTOCAST_MODULES and fn.__name__ in ("__enter__", "__exit__"):
        return "sets autocast's state: it runs in Python"
    if module == "torch.autograd.grad_mode" and getattr(fn, "__qualname__", "") in _INFERENCE:
        return "sets inference mode: it runs in Python"
    if code is not None and _of_singledispatch(code):
        return "is functools.singledispatch's: it runs in Python"
    return None


def _of_singledispatch(code: Any) -> bool:
    """functools.singledispatch itself, a dispatcher's `register` and its `dispatch` (the
    lookup of the implementation, through a WeakKeyDictionary cache): break code could not
    make a dispatcher of the trace again (its attributes refer back to it), so CPython makes
    it, registers on it and looks implementations up; the dispatcher's call, and the
    implementation it calls, are traced (a dispatcher made outside: as before, one break)."""
    name = getattr(code, "co_qualname", code.co_name)
    return code.co_filename == functools.__file__ and name in _SINGLEDISPATCH


_SINGLEDISPATCH = tuple(
    f"singledispatch{inner}" for inner in ("", ".<locals>.register", ".<locals>.dispatch")
)


def allow_in_graph(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Put calls of `fn` into the graph as they are, without looking inside (fn must take
    and return tensors and have no side effects)."""
    fn._ember_allow_in_graph = True
    return fn


def assume_constant_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Treat what `fn` returns as a constant: it is called once while capturing and its
    result is baked in, unguarded (the caller promises it never changes)."""
    fn._ember_constant_result = True
    return fn


def is_disabled(fn: Any) -> bool:
    return bool(getattr(fn, "_ember_disabled", False) or getattr(fn, "_torchdynamo_disable", False))


def is_constant_result(fn: Any) -> bool:
    return bool(
        getattr(fn, "_ember_constant_result", False)
        or getattr(fn, "_dynamo_marked_constant", False)
    )


def is_allowed_in_graph(fn: Any) -> bool:
    if getattr(fn, "_ember_allow_in_graph", False):
        return True
    rules = sys.modules.get("torch._dynamo.trace_rules")
    allowed = getattr(rules, "_allowed_callable_ids", None)
    return allowed is not None and id(fn) in allowed


def _forced_break(tx, args, kwargs) -> Value:
    raise Unsupported(BreakReason.FORCED, "graph_break() called")


def _compiling(tx, args, kwargs) -> Value:
    return ConstantValue(True)


class DisabledValue(Value):
    """A function wrapped by `disable(...)` inside the traced code: calling it breaks the
    graph and runs it in Python."""

    def __init__(self, fn: Value) -> None:
        self.fn = fn

    def describe(self) -> str:
        return f"disabled {self.fn.describe()}"

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL, f"{self.fn.describe()} is disabled: it runs in Python"
        )

    def reconstruct(self, em: Emitter) -> None:
        em.reconstruct(self.fn)  # the plain function: CPython runs it, nothing compiled


def _disable_call(tx, args, kwargs) -> Value:
    if not args or kwargs.get("fn") is not None:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "disable() as a decorator factory here")
    return DisabledValue(args[0])


def _dynamo_functions() -> dict[Any, Callable[..., Value]]:
    """Dynamo's functions, by identity, once the user has imported torch._dynamo."""
    decorators = sys.modules.get("torch._dynamo.decorators")
    found: dict[Any, Callable[..., Value]] = {}
    if decorators is None:
        return found
    for name, handler in (
        ("graph_break", _forced_break),
        ("is_compiling", _compiling),
        ("disable", _disable_call),
    ):
        fn = getattr(decorators, name, None)
        if fn is not None:
            found[fn] = handler
    external = sys.modules.get("torch._dynamo.external_utils")
    if external is not None and hasattr(external, "is_compiling"):
        found[external.is_compiling] = _compiling
    return found


_registered = False


def register_dynamo_functions(table: dict[Any, Callable[..., Value]]) -> None:
    """Add Dynamo's functions to the builtins table the first time they exist."""
    global _registered
    if _registered or "torch._dynamo.decorators" not in sys.modules:
        return
    table.update(_dynamo_functions())
    _registered = True


def register(table: dict[Any, Callable[..., Value]]) -> None:
    import torch

    table[graph_break] = _forced_break
    table[is_compiling] = _compiling
    table[disable] = _disable_call
    table[torch.compiler.disable] = _disable_call
