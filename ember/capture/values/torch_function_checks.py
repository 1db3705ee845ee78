"""torch's `has_torch_function*` checks (torch.overrides), answered from the arguments'
types while capturing. Library functions written in Python (`nn.init.constant_`,
`F.linear`'s wrappers) ask them first and hand the call to `handle_torch_function` when one
is True: computed on the capture's own tensors they said True for plain tensors, and the
call then raised "no implementation found" at the break.

The C check: an argument counts when its type is neither Tensor nor Parameter exactly and
has a `__torch_function__` other than the disabled one; any enabled torch function mode
counts too (a mode is answered by CPython at a break)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.builtins import handles
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator


def _overrides(kind: type) -> bool:
    if kind in (torch.Tensor, torch.nn.Parameter):
        return False
    impl = getattr(kind, "__torch_function__", None)
    return impl is not None and impl is not torch._C._disabled_torch_function_impl


def _answer(values: list[Value]) -> ConstantValue:
    if torch._C._is_torch_function_mode_enabled():
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL, "has_torch_function under a torch function mode"
        )
    return ConstantValue(any(_overrides(v.python_type()) for v in values))


@handles(torch._C._has_torch_function)
def _has_torch_function(tx: Translator, args: list[Value], kwargs: dict) -> Value:
    return _answer(args[0].iterate(tx))


@handles(torch._C._has_torch_function_unary, torch._C._has_torch_function_variadic)
def _has_torch_function_of_arguments(tx: Translator, args: list[Value], kwargs: dict) -> Value:
    return _answer(args)
