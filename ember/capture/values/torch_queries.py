"""torch's questions about its state and about values, answered while capturing: grad and
inference mode (pinned by their guards), autocast (from the modes the trace is under: the
process's own autocast is off while capturing), the default dtype, whether a value is a
(floating point) tensor, its element count, how lists of tensors group by device and dtype.

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
from ember.capture.values.containers import DictValue, ListValue, TupleValue
from ember.capture.values.inference_mode import traced_inference_mode
from ember.capture.values.tensor import TensorValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator


@handles(torch.is_grad_enabled)
def _is_grad_enabled(tx, args, kwargs):
    return ConstantValue(torch.is_grad_enabled())  # pinned by the GRAD_MODE guard


@handles(torch.is_inference_mode_enabled)
def _is_inference_mode_enabled(tx, args, kwargs):
    traced = traced_inference_mode(tx.ctx.out)
    if traced is not None:  # inside a traced `with torch.inference_mode(...)`
        return ConstantValue(traced)
    mode = torch_compat.callers_inference_mode()
    tx.ctx.guards.add(GuardKind.INFERENCE_MODE, None, mode)
    return ConstantValue(mode)


def _autocast_mode(tx: Translator, args: list[Value], kwargs: dict) -> tuple[str, object]:
    """The device type asked about (CUDA when none is named, as torch answers) and the
    innermost autocast mode of the trace for it (None when there is none)."""
    given = args[0] if args else kwargs.get("device_type")
    device = "cuda" if given is None else given.as_constant()
    modes = [m for m in tx.ctx.autocast if m.device_type == device]
    return device, (modes[-1] if modes else None)


@handles(torch.is_autocast_enabled)
def _is_autocast_enabled(tx, args, kwargs):
    _, mode = _autocast_mode(tx, args, kwargs)
    return ConstantValue(mode is not None and mode.enabled)


@handles(torch.get_autocast_dtype)
def _get_autocast_dtype(tx, args, kwargs):
    device, mode = _autocast_mode(tx, args, kwargs)
    return ConstantValue(torch.get_autocast_dtype(device) if mode is None else mode.dtype)


@handles(torch_compat.group_tensors_by_device_and_dtype)
def _group_by_device_and_dtype(tx: Translator, args: list[Value], kwargs: dict) -> Value:
    """`{(device, dtype): ([[tensors of list 0], [those of list 1], ...], [indices])}`, grouped
    by the first list's tensors. Torch's own grouping runs on empty stand-ins of the same
    device and dtype, so the groups come in its order; the tensors are the trace's own (the
    call on the examples handed meta tensors to the code after a break)."""
    lists = [entry.items for entry in args[0].items]
    flag = args[1] if len(args) > 1 else kwargs.get("with_indices", ConstantValue(False))
    if not all(isinstance(v, TensorValue) or v.is_constant() for row in lists for v in row):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "grouping tensors of unknown kinds")
    stand_ins = [
        [
            torch.empty(0, device=v.device, dtype=v.example.dtype)
            if isinstance(v, TensorValue)
            else v.as_constant()
            for v in row
        ]
        for row in lists
    ]
    traced = {id(s): v for row, values in zip(stand_ins, lists) for s, v in zip(row, values)}
    grouped = torch_compat.group_tensors_by_device_and_dtype(stand_ins, flag.as_constant())

    def back(t: torch.Tensor | None) -> Value:
        return ConstantValue(None) if t is None else traced[id(t)]

    return DictValue(
        {
            key: TupleValue(
                [
                    ListValue([ListValue([back(t) for t in row]) for row in rows]),
                    ListValue([ConstantValue(i) for i in indices]),
                ]
            )
            for key, (rows, indices) in grouped.items()
        }
    )


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
