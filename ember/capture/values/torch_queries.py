"""torch's questions about its state and about values, answered while capturing: grad and
inference mode (pinned by their guards), the default dtype, whether a value is a (floating
point) tensor, its element count.

The `has_torch_function*` checks (torch.overrides) are answered from the arguments' types.
Library functions written in Python (`nn.init.constant_`) ask them first and hand the call
to `handle_torch_function` when one is True: computed on the capture's own tensors they
said True for plain tensors, and the call then raised "no implementation found" at the
break.

The C check: an argument counts when its type is neither Tensor nor Parameter exactly and
has a `__torch_function__` other than the disabled one; any enabled torch function mode
counts too (a mode is answered by CPython at a break)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ember import torch_compat
from ember.capture.guards import GuardKind
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.builtins import handles
from ember.capture.values.tensor import TensorValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator


@handles(torch.is_grad_enabled)
def _is_grad_enabled(tx, args, kwargs):
    return ConstantValue(torch.is_grad_enabled())  # pinned by the GRAD_MODE guard


@handles(torch.is_inference_mode_enabled)
def _is_inference_mode_enabled(tx, args, kwargs):
    mode = torch_compat.callers_inference_mode()
    tx.ctx.guards.add(GuardKind.INFERENCE_MODE, None, mode)
    return ConstantValue(mode)


@handles(torch.is_tensor)
def _is_tensor(tx, args, kwargs):
    return ConstantValue(isinstance(args[0], TensorValue))


@handles(torch.is_floating_point)
def _is_floating_point(tx, args, kwargs):
    return ConstantValue(args[0].example.is_floating_point())


@handles(torch.numel)
def _numel(tx, args, kwargs):
    return ConstantValue(args[0].example.numel())


@handles(torch.get_default_dtype)
def _default_dtype(tx, args, kwargs):
    return ConstantValue(torch.get_default_dtype())


def _overrides(kind: type) -> bool:
    if kind in (torch.Tensor, torch.nn.Parameter):
        return False
    impl = getattr(kind, "__torch_function__", None)
    return impl is not None and impl is not torch_compat.disabled_torch_function


def _answer(values: list[Value]) -> ConstantValue:
    if torch_compat.torch_function_mode_enabled():
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL, "has_torch_function under a torch function mode"
        )
    return ConstantValue(any(_overrides(v.python_type()) for v in values))


@handles(torch_compat.has_torch_function)
def _has_torch_function(tx: Translator, args: list[Value], kwargs: dict) -> Value:
    return _answer(args[0].iterate(tx))


@handles(torch_compat.has_torch_function_unary, torch_compat.has_torch_function_variadic)
def _has_torch_function_of_arguments(tx: Translator, args: list[Value], kwargs: dict) -> Value:
    return _answer(args)
