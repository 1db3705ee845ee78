"""A function decorated in the trace with a grad-mode context (`torch.no_grad()(fn)`, or
`@torch.enable_grad()` / `@torch.inference_mode(mode)` on a local function). A call runs
the function inside the mode as a `with` block in user code would, through the same
machinery (so a break or an exception inside restores the mode as there); if the decorated
function escapes the trace, CPython decorates the function again, which makes what eager
made."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.values.base import Value
from ember.capture.values.functions import NestedFunctionValue, UserFunctionValue

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


def _run_in(context: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """What torch's decorator does on each call (traced, never run by CPython itself)."""
    with context:
        return fn(*args, **kwargs)


def decorate(enabled: bool, fn: Any, inference: bool = False) -> Any:
    """Run-time half of rebuilding the decorated function: torch's own decorator."""
    if inference:
        return torch.inference_mode(enabled)(fn)
    return (torch.enable_grad() if enabled else torch.no_grad())(fn)


_WRAPPED_OTHERWISE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def decorates(fn: Value) -> bool:
    """Whether the decorator's plain-function path applies (generator functions and classes
    are wrapped otherwise)."""
    if isinstance(fn, UserFunctionValue):
        code = fn.fn.__code__
    elif isinstance(fn, NestedFunctionValue):
        code = fn.code
    else:
        return False
    return not code.co_flags & _WRAPPED_OTHERWISE


class GradModeDecoratedValue(Value):
    def __init__(self, enabled: bool, fn: Value, inference: bool = False) -> None:
        self.enabled = enabled
        self.fn = fn
        self.inference = inference
        """Decorated with `torch.inference_mode(enabled)` (else with a grad mode)."""

    def describe(self) -> str:
        return f"{self.fn.describe()} decorated with a grad mode"

    def python_type(self) -> type:
        return type(_run_in)

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        from ember.capture.values.inference_mode import InferenceModeValue
        from ember.capture.values.objects import GradModeValue

        context = (
            InferenceModeValue(self.enabled) if self.inference else GradModeValue(self.enabled)
        )
        return UserFunctionValue(_run_in).call(tx, [context, self.fn, *args], kwargs)

    def getattr(self, tx: Translator, name: str) -> Value:
        if name == "__wrapped__":
            return self.fn
        if name in ("__name__", "__qualname__", "__doc__", "__module__"):  # functools.wraps
            return self.fn.getattr(tx, name)
        return super().getattr(tx, name)

    def contained(self) -> list[Value]:
        return [self.fn]

    def reconstruct(self, em: Emitter) -> None:
        em.cg.load_const(decorate, push_null=True)
        em.cg.load_const(self.enabled)
        em.reconstruct(self.fn)
        em.cg.load_const(self.inference)
        em.cg.call(3)
