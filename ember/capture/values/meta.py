"""Running torch calls on meta tensors during capture.

Capture needs each op's result metadata (dtype, shape, strides, requires_grad) and PyTorch's
own errors, never data. Meta tensors give exactly that without FakeTensorMode, whose first use
imports all of torch._dynamo (seconds on this machine) and would make ember's first call as slow
as torch.compile's. The one thing a meta tensor forgets is its real device, so symbolic tensors
carry it separately and device arguments are redirected to meta while an op runs.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_map

_META = torch.device("meta")
_DEVICE_MOVES = frozenset(["cpu", "cuda", "xpu", "mps"])


def to_meta(real: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `real`'s dtype, shape, strides, offset and requires_grad."""
    storage = max(
        (real.storage_offset() + sum((s - 1) * st for s, st in zip(real.shape, real.stride())) + 1)
        if real.numel()
        else 0,
        0,
    )
    base = torch.empty(storage, dtype=real.dtype, device=_META)
    meta = base.as_strided(real.shape, real.stride(), real.storage_offset())
    if real.requires_grad:
        meta.requires_grad_(True)
    return meta


def _redirect(value: Any) -> Any:
    return _META if isinstance(value, torch.device) else value


def _device_arg(value: Any) -> torch.device | None:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str) and value.split(":")[0] in ("cpu", "cuda", "meta", "xpu", "mps"):
        return torch.device(value)
    return None


def _undisabled(fn: Any, recursive: bool = True, wrapping: bool = True) -> Any:
    return fn


@contextlib.contextmanager
def _without_dynamo_import() -> Iterator[None]:
    """PyTorch's Python meta kernels are wrapped in `torch._disable_dynamo`, which imports
    all of torch._dynamo on a kernel's first call only to mark it "not to be traced by Dynamo"
    (about a second here, more than ember's whole capture). While a meta kernel runs, a
    stand-in module answers that one call with the function itself. The stand-in is removed
    afterwards; a later real `import torch._dynamo` is unaffected. No-op once Dynamo is loaded."""
    if "torch._dynamo" in sys.modules:
        yield
        return
    stand_in = types.ModuleType("torch._dynamo", "ember: stands in while meta kernels run")
    stand_in.disable = _undisabled
    sys.modules["torch._dynamo"] = stand_in
    torch._dynamo = stand_in
    try:
        yield
    finally:
        if sys.modules.get("torch._dynamo") is stand_in:
            del sys.modules["torch._dynamo"]
        if torch.__dict__.get("_dynamo") is stand_in:
            del torch._dynamo


def run_on_meta(kind: str, target: Any, args: list, kwargs: dict) -> Any:
    """Call `target` (a function, or a method name for call_method) on meta examples."""
    try:
        with _without_dynamo_import():
            return _call(kind, target, args, kwargs)
    except (ImportError, AttributeError) as exc:
        if "_dynamo" not in str(exc):
            raise
    return _call(kind, target, args, kwargs)  # the kernel needed the real torch._dynamo


def _call(kind: str, target: Any, args: list, kwargs: dict) -> Any:
    args = tree_map(_redirect, list(args))
    kwargs = {
        k: _META if k == "device" and v is not None else _redirect(v) for k, v in kwargs.items()
    }
    with torch.device(_META):
        if kind != "call_method":
            return target(*args, **kwargs)
        if target in _DEVICE_MOVES:
            return args[0]
        if target == "to":
            args = [args[0], *(_META if _device_arg(a) else a for a in args[1:])]
        return getattr(args[0], target)(*args[1:], **kwargs)


def result_device(
    kind: str, target: Any, args: list, kwargs: dict, tensor_devices: list[torch.device]
) -> torch.device:
    """The real device an op's result lives on (what eager would report)."""
    if kind == "call_method" and target in _DEVICE_MOVES:
        index = args[1] if len(args) > 1 and isinstance(args[1], int) else None
        return torch.device(target, index) if target != "cpu" else torch.device("cpu")
    candidates = [kwargs.get("device")]
    if kind == "call_method" and target == "to":
        candidates += list(args[1:])
    for candidate in candidates:
        device = _device_arg(candidate)
        if device is not None:
            return device
    if tensor_devices:
        return tensor_devices[0]
    return torch.get_default_device()


def is_data_dependent_error(exc: BaseException) -> bool:
    """Meta kernels refuse ops whose output shape depends on values (nonzero, unique, ...)."""
    text = str(exc)
    return (
        isinstance(exc, NotImplementedError)
        and ("meta" in text.lower())
        or ("cannot be called on meta tensors" in text or "without output_size" in text)
    )
