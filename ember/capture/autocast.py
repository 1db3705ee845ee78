"""torch.autocast during capture: its casts made explicit nodes of the graph.

Under autocast, PyTorch casts the floating inputs of some ops before running them (matmul
and linear to the autocast dtype, softmax and the losses to float32, cat to the widest of its
inputs). Capture runs ops on meta tensors, which autocast ignores (it acts on tensors of its
own device type only), so the trace would see float32 where the run makes bfloat16. Instead,
each op met while autocast is on (the caller's, or a `with torch.autocast(...)` block in the
traced code) is first run on probe tensors: meta tensors that report the real device, so
autocast's dispatch keys see them. The casts autocast makes on the op's inputs are recorded
as `.to(dtype)` nodes before the op, which then runs on the cast inputs. The graph holds
plain ops, so aot and every backend compile it without knowing about autocast, and running
it under the caller's autocast again changes nothing (each input is already of the dtype
autocast would give it). An op whose result dtypes the explicit casts do not reproduce (a
policy that passes a dtype argument instead of casting) is refused: a graph break.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ember import torch_compat
from ember.capture.values.meta import call_target


@dataclasses.dataclass(frozen=True, slots=True)
class AutocastMode:
    """One `torch.autocast(device_type, dtype, enabled, cache_enabled)` in force."""

    device_type: str
    dtype: torch.dtype
    enabled: bool
    cache_enabled: bool


def callers_modes() -> tuple[AutocastMode, ...]:
    """The autocast in force for the compiled function's caller (none when it is off)."""
    return tuple(
        AutocastMode(device, dtype, True, cache)
        for device, dtype, cache in torch_compat.callers_autocast()
    )


def active(modes: Sequence[AutocastMode]) -> bool:
    return any(mode.enabled for mode in modes)


@contextlib.contextmanager
def _applied(modes: Sequence[AutocastMode]) -> Iterator[None]:
    """The process's autocast state set to `modes` (each over the ones before), then back."""
    devices = {mode.device_type for mode in modes}
    saved = [
        (d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in sorted(devices)
    ]
    saved_cache = torch.is_autocast_cache_enabled()
    try:
        for mode in modes:
            torch.set_autocast_enabled(mode.device_type, mode.enabled)
            torch.set_autocast_dtype(mode.device_type, mode.dtype)
            torch.set_autocast_cache_enabled(mode.cache_enabled)
        yield
    finally:
        for device, enabled, dtype in saved:
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(saved_cache)


class _Probe(torch.Tensor):
    """A meta tensor that reports a real device (so autocast's dispatch keys select it)
    and notes the casts applied to the op's inputs."""

    elem: torch.Tensor
    origin: int | None

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device, origin: int | None) -> _Probe:
        probe = torch.Tensor._make_subclass(
            cls, elem, False, dispatch_device=True, device_for_backend_keys=device
        )
        probe.elem, probe.real_device, probe.origin = elem, device, origin
        return probe

    casts: dict[int, torch.dtype] | None = None
    __torch_function__ = torch_compat.disabled_torch_function

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        kwargs = kwargs or {}
        first = args[0] if args else None
        if func is torch.ops.prim.device.default:
            return first.real_device
        if (
            func is torch.ops.aten._to_copy.default
            and isinstance(first, _Probe)
            and first.origin is not None
            and "dtype" in kwargs
            and _Probe.casts is not None
        ):
            _Probe.casts.setdefault(first.origin, kwargs["dtype"])
        device = next(
            (a.real_device for a in tree_leaves((args, kwargs)) if isinstance(a, _Probe)), None
        )
        unwrapped = tree_map(lambda a: a.elem if isinstance(a, _Probe) else a, (args, kwargs))
        out = func(*unwrapped[0], **unwrapped[1])
        return tree_map(
            lambda o: _Probe(o, device, None) if isinstance(o, torch.Tensor) else o, out
        )


def _run_probe(
    modes: Sequence[AutocastMode],
    kind: str,
    target: Any,
    args: list,
    kwargs: dict,
    devices: dict[int, torch.device],
) -> tuple[dict[int, torch.dtype], list[torch.dtype]]:
    """Run the op on probes of its meta inputs under `modes`: the casts made on each input
    (keyed by the input's id) and the dtypes of the tensors it returns."""

    def probe(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and id(value) in devices:
            return _Probe(value, devices[id(value)], id(value))
        return value

    casts: dict[int, torch.dtype] = {}
    _Probe.casts = casts
    try:
        with torch.no_grad(), _applied(modes):
            out = call_target(kind, target, tree_map(probe, args), tree_map(probe, kwargs))
    finally:
        _Probe.casts = None
    return casts, [t.dtype for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


class AutocastNotReproduced(Exception):
    """Explicit casts do not give the op's result dtypes under autocast."""


def input_casts(
    modes: Sequence[AutocastMode],
    kind: str,
    target: Any,
    args: list,
    kwargs: dict,
    devices: dict[int, torch.device],
) -> dict[int, torch.dtype]:
    """The dtype autocast casts each input to (keyed by the id of its meta example in
    `args`/`kwargs`; `devices` holds their real devices) before running `target`. Casts the
    op makes itself, without autocast, are not autocast's and are left to it."""
    casts, dtypes = _run_probe(modes, kind, target, args, kwargs, devices)
    own, plain = _run_probe((), kind, target, args, kwargs, devices)
    casts = {key: dtype for key, dtype in casts.items() if own.get(key) != dtype}
    if casts:
        moved: dict[int, torch.device] = {}

        def cast(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and id(value) in devices:
                device = devices[id(value)]
                if id(value) in casts:
                    value = value.to(casts[id(value)])
                moved[id(value)] = device
            return value

        cast_args, cast_kwargs = tree_map(cast, args), tree_map(cast, kwargs)
        _, plain = _run_probe((), kind, target, cast_args, cast_kwargs, moved)
    if plain != dtypes:
        raise AutocastNotReproduced(f"autocast gives {dtypes}, explicit casts {plain}")
    return casts


def without_callers_autocast(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """The compiled graph of a capture made under the caller's autocast, run with autocast
    off: its casts are explicit nodes, and an op the trace ran without autocast (inside a
    `torch.autocast(enabled=False)` block) must not be cast by the caller's at run time."""
    devices = torch_compat.callers_autocast_devices()
    if not devices:
        return compiled

    def call(*args: Any) -> Any:
        torch_compat.switch_autocast(devices, False)
        try:
            return compiled(*args)
        finally:
            torch_compat.switch_autocast(devices, True)

    call.__wrapped__ = compiled
    return call


def leave_autocast(manager: torch.amp.autocast_mode.autocast) -> None:
    """After the graph: leave an autocast block that CPython entered (at an earlier break)
    and the trace left."""
    manager.__exit__(None, None, None)
