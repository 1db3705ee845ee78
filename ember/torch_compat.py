"""The private PyTorch surface ember relies on, resolved in one place against the torch
versions it was tested with.

ember reaches below torch's public API where nothing public does the job: the C++ grad-mode
switch it records into graphs, the autocast and functorch state its guards read, oneDNN's
linear kernel, the fused-attention kernel choice, the C namespaces of torch's functions, the
Python dispatcher for symbolic sizes, and a stand-in for `torch._dynamo` while tracing (see
`without_dynamo`). Each is resolved here once, at `import ember`: a torch release that moves
one fails at import with the name it lacks and the versions tested, instead of deep inside a
user's compile, and supporting a new release means editing this module.

Attributes that every torch since 1.x has kept on tensors, modules and ops (`_version`,
`_is_view`, `_parameters`, `_buffers`, the hook dicts, `OpOverload._schema`) are used where
they are needed; the suite runs against every version in TESTED (`.ci/run`), which is what
keeps them honest.
"""

from __future__ import annotations

import functools
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

import torch

TESTED = ("2.13.0", "2.14.1")
"""The torch releases the suite runs against; pyproject admits exactly this range."""

T = TypeVar("T")


def _release(text: str) -> tuple[int, ...]:
    """(2, 14, 1) from '2.14.1+cpu' or '2.15.0a0+git...'."""
    numbers = text.split("+")[0].split(".")[:3]
    return tuple(int("".join(c for c in n if c.isdigit()) or 0) for n in numbers)


def check_version(version: str = torch.__version__) -> None:
    """Refuse a torch older than the tested range; warn once for a newer one."""
    release = _release(version)
    if release < _release(TESTED[0]):
        raise ImportError(f"ember needs torch {TESTED[0]} or newer (found {version})")
    if release[:2] > _release(TESTED[-1])[:2]:
        warnings.warn(
            f"ember was tested with torch {', '.join(TESTED)}; torch {version} is newer: "
            "compiled results are still checked by guards, but private torch APIs may have "
            "moved (see ember/torch_compat.py)",
            stacklevel=2,
        )


def _resolve(path: str) -> Any:
    """`torch.<path>`, or an ImportError that names it and the tested versions."""
    value: Any = torch
    for part in path.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ImportError(
                f"ember needs torch.{path}, which torch {torch.__version__} does not have "
                f"(tested: {', '.join(TESTED)})"
            ) from None
    return value


check_version()

set_grad_enabled: Callable[[bool], None] = _resolve("_C._set_grad_enabled")
"""The switch `torch.no_grad()` and friends call; graphs record it as a node."""
set_version_counters: Callable[..., None] = _resolve("_C._autograd._unsafe_set_version_counter")
"""Sets tensors' version counters: a mutated input copied back once ends at the version eager's
own in-place ops would have left it at (one per op, none through `.data`)."""
never_compiled_wrapper_file: str = _resolve("_compile").__file__
"""Where `torch._disable_dynamo` defines the wrapper of functions torch never compiles
(`Optimizer.zero_grad`): the wrapper copies the function's name and module."""
is_any_autocast_enabled: Callable[[], bool] = _resolve("_C._is_any_autocast_enabled")
group_tensors_by_device_and_dtype: Callable[..., dict] = _resolve(
    "_C._group_tensors_by_device_and_dtype"
)
"""How foreach users (clip_grad_norm_, optimizers) split lists of tensors by device and dtype."""
functorch_transforms_active: Callable[[], bool] = _resolve("_C._are_functorch_transforms_active")
fused_sdp_choice: Callable[..., int] = _resolve("_fused_sdp_choice")
scaled_dot_product_attention: Callable[..., Any] = _resolve("_C._nn.scaled_dot_product_attention")
OpOverload: type = _resolve("_ops.OpOverload")
OpOverloadPacket: type = _resolve("_ops.OpOverloadPacket")
FunctionBase: type = _resolve("_C._FunctionBase")
TensorBase: type = _resolve("_C.TensorBase")
is_compiling_flag: Callable[[], bool] = _resolve("_utils.is_compiling")
select_conv_backend: Callable[..., Any] = _resolve("_C._select_conv_backend")
"""The convolution kernel eager picks for given tensors and parameters..."""
conv_memory_format: Callable[..., Any] = _resolve("_C._conv_determine_backend_memory_format")
"""...and the memory format that kernel gives its result (channels-last or not)."""
TensorMatch: type = _resolve("_C._dynamo.guards.TensorGuards")
"""A C++ check of tensors' Python type, dispatch keys, dtype, device, sizes, strides and
requires_grad (what Dynamo's tensor guards run): ember's guards call it per tensor, cheaper
than the same checks as Python attribute reads."""
reinterpret_tensor: Callable[..., torch.Tensor] = _resolve("_C._dynamo.guards._reinterpret_tensor")
"""A tensor over another's storage with given sizes and strides, at an offset *added to the
other's own storage offset*, made in C++ without the dispatcher or a view's autograd record:
half the cost of `torch.as_strided` (whose offset is absolute)."""
empty_strided_cpu: Callable[..., torch.Tensor] = _resolve("_C._dynamo.guards._empty_strided_cpu")
"""`empty_strided_cpu(size, stride, dtype)`: an uninitialized CPU tensor made in C++
without the Python argument parser or the dispatcher (1.2 us against `torch.empty`'s 3.3
for a 4-d size): what generated wrappers allocate their buffers with, as Inductor's do."""
storage_address: Callable[[torch.Tensor], int] = _resolve("_C._storage_address")
"""The address of a tensor's StorageImpl: tensors sharing one have the same (a C call, no
storage object made, unlike `t.untyped_storage()`)."""
_storage_use_count: Callable[[int], int] = _resolve("_C._storage_Use_Count")
disabled_torch_function: Callable[..., Any] = _resolve("_C._disabled_torch_function_impl")
"""A tensor subclass's `__torch_function__` that skips the subclass at the Python level, so
only its `__torch_dispatch__` sees ops (capture/autocast.py's probe; nn.Parameter's, whose
op results are plain tensors)."""
torch_function_mode_enabled: Callable[[], bool] = _resolve("_C._is_torch_function_mode_enabled")
has_torch_function: Callable[..., bool] = _resolve("_C._has_torch_function")
has_torch_function_unary: Callable[..., bool] = _resolve("_C._has_torch_function_unary")
has_torch_function_variadic: Callable[..., bool] = _resolve("_C._has_torch_function_variadic")
"""The checks torch's Python functions make before handing a call to __torch_function__."""
set_conj: Callable[[torch.Tensor, bool], None] = _resolve("_C._set_conj")
set_neg: Callable[[torch.Tensor, bool], None] = _resolve("_C._set_neg")
"""Set a tensor's lazy conjugate / negative bit in place (meta examples of such views)."""


def storage_use_count(t: torch.Tensor) -> int:
    """How many references hold a tensor's storage (tensors viewing it, storage objects):
    CUDA graph replays check it before overwriting an output (backend/cudagraphs.py)."""
    return _storage_use_count(t.untyped_storage()._cdata)


TORCH_C_NAMESPACES: tuple[Any, ...] = tuple(
    _resolve(f"_C.{name}") for name in ("_nn", "_VariableFunctions", "_linalg", "_fft", "_special")
)
"""Where torch.* functions are defined in C: a function from one of them is a torch op."""


def python_dispatcher() -> Any:
    """A context in which ops on symbolic sizes run their Python meta kernels."""
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


def shape_env(**options: Any) -> Any:
    """A torch `ShapeEnv` for a capture with size symbols. torch labels each symbol and guard
    with the user's frame (`ShapeEnv._get_stack_summary`), found by skipping the files of a
    list it builds by importing torch.export and parts of Dynamo and Inductor (0.7 s on the
    first dynamic capture of a process, more than the capture) and by walking the stack on
    every guard. ember labels its guards with the user's file:line itself, so its ShapeEnv
    gives torch's labels no location. (The constructor still imports torch._dynamo, through
    torch.fx.experimental.validator: no option of ShapeEnv avoids that.)"""
    return _quiet_shape_env()(**options)


@functools.cache
def _quiet_shape_env() -> type:
    from torch._guards import SLoc
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    class QuietShapeEnv(ShapeEnv):
        def _get_stack_summary(
            self, is_debug: bool = False, framework_loc: str | None = None
        ) -> tuple[Any, str]:
            return SLoc(framework_loc, None), ""

    return QuietShapeEnv


def tag_activation_checkpoint() -> Any:
    """PyTorch's checkpoint higher-order op (what Inductor knows), imported when needed."""
    from torch._higher_order_ops.wrap import tag_activation_checkpoint

    return tag_activation_checkpoint


def onednn_linear() -> Any:
    """oneDNN's `linear(x, W, b)` op, or None where this build has no oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return None
    packet = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    return None if packet is None else packet.default


# -- tracing without importing torch._dynamo --------------------------------------------------
#
# PyTorch's Python meta kernels are wrapped in `torch._disable_dynamo`, whose first call imports
# torch._dynamo only to mark the kernel "do not trace"; that import costs seconds here, more than
# all of ember's compile. While ember traces, a stand-in module answers `disable(fn)` with `fn`
# and records anything else asked of it; when the trace fails after such a request,
# `without_dynamo` imports the real module and runs the trace again. The failure is recognized by
# what the stand-in recorded, never by the error's text (Python turns a failed
# `from torch._dynamo import x` into a plain ImportError of its own wording).


class _StandIn(types.ModuleType):
    """`torch._dynamo` while ember traces: `disable(fn)` is `fn`; other names are recorded
    in `missing` and raise AttributeError."""

    def __init__(self) -> None:
        super().__init__("torch._dynamo", "ember: stands in while tracing")
        self.missing: list[str] = []

    @staticmethod
    def disable(
        fn: Any = None, recursive: bool = True, reason: str | None = None, wrapping: bool = True
    ) -> Any:
        """torch._dynamo.disable's signature; called without `fn`, it is a decorator."""
        return fn if fn is not None else (lambda f: f)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name != "__path__":  # probes: __spec__, __wrapped__ ...
            raise AttributeError(name)
        self.missing.append(name)  # __path__: an import of a torch._dynamo submodule
        raise AttributeError(f"torch._dynamo.{name} (ember traces without torch._dynamo)")


@contextmanager
def _stand_in() -> Iterator[_StandIn | None]:
    if "torch._dynamo" in sys.modules:  # the real one is loaded: its `disable` is there
        yield None
        return
    module = _StandIn()
    sys.modules["torch._dynamo"] = module
    torch._dynamo = module  # type: ignore[attr-defined]
    try:
        yield module
    finally:
        if sys.modules.get("torch._dynamo") is module:
            del sys.modules["torch._dynamo"]
        if torch.__dict__.get("_dynamo") is module:
            del torch._dynamo


def without_dynamo(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` with the stand-in torch._dynamo; again with the real one if it
    failed after asking the stand-in for more than it has. `fn` must be safe to repeat (a
    trace that starts afresh)."""
    with _stand_in() as module:
        try:
            return fn(*args, **kwargs)
        except Exception:
            if module is None or not module.missing:
                raise
    import torch._dynamo  # noqa: F401  (the traced code asked for it)

    return fn(*args, **kwargs)


def records_autograd() -> bool:
    """Whether ops now record autograd: grad mode on, outside inference mode (under which
    even enable_grad records nothing, and saving an inference tensor is an error)."""
    return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


enter_inference_mode = torch.autograd.grad_mode._enter_inference_mode
exit_inference_mode = torch.autograd.grad_mode._exit_inference_mode
"""What a `torch.inference_mode()` block does when entered and left (torch.autograd.grad_mode):
the graph nodes of such a block inside traced code."""


def enters_inference_mode(gm: torch.nn.Module) -> bool:
    """Whether a captured graph holds a `torch.inference_mode()` block of its own."""
    graph = getattr(gm, "graph", None)
    return graph is not None and any(
        n.op == "call_function" and n.target is enter_inference_mode for n in graph.nodes
    )


_callers_inference_mode = False


def callers_inference_mode() -> bool:
    """Whether the compiled function's caller runs under torch.inference_mode (what the
    traced code sees from `torch.is_inference_mode_enabled()`)."""
    return _callers_inference_mode


@contextmanager
def capturing_outside_inference_mode() -> Iterator[None]:
    """A capture (and its compile) called under torch.inference_mode runs outside it, with
    the caller's grad mode: meta examples and traced results must be ordinary tensors,
    which have version counters (how the capture finds in-place writes) where inference
    tensors have none. The compiled code itself runs in the caller's mode."""
    global _callers_inference_mode
    if not torch.is_inference_mode_enabled():
        yield
        return
    grad = torch.is_grad_enabled()
    _callers_inference_mode = True
    try:
        with torch.inference_mode(False), torch.set_grad_enabled(grad):
            yield
    finally:
        _callers_inference_mode = False


AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")
"""The device types whose autocast state a capture reads and its guards check."""


def autocast_state() -> tuple[tuple[str, torch.dtype, bool], ...]:
    """(device type, dtype, cache enabled) for each device type autocast is on for."""
    if not is_any_autocast_enabled():
        return ()
    cache = torch.is_autocast_cache_enabled()
    return tuple(
        (device, torch.get_autocast_dtype(device), cache)
        for device in AUTOCAST_DEVICES
        if torch.is_autocast_enabled(device)
    )


_callers_autocast: tuple[tuple[str, torch.dtype, bool], ...] = ()


def callers_autocast() -> tuple[tuple[str, torch.dtype, bool], ...]:
    """The autocast state of the compiled function's caller (`autocast_state()`'s form)."""
    return _callers_autocast


@contextmanager
def capturing_outside_autocast() -> Iterator[None]:
    """A capture (and its compile) called under torch.autocast runs with autocast off: the
    capture applies the caller's autocast to each op itself, as explicit casts in the graph
    (capture/autocast.py), and the backend's own work (timing a GEMM on real tensors) must
    not be recast. The compiled code itself runs under the caller's autocast."""
    global _callers_autocast
    state = autocast_state()
    if not state:
        yield
        return
    _callers_autocast = state
    try:
        switch_autocast(callers_autocast_devices(), False)
        yield
    finally:
        switch_autocast(callers_autocast_devices(), True)
        _callers_autocast = ()


def callers_autocast_devices() -> list[str]:
    """The device types the caller's autocast is on for."""
    return [device for device, _, _ in _callers_autocast]


def switch_autocast(devices: list[str], enabled: bool) -> None:
    """Autocast switched on or off for each of these device types."""
    for device in devices:
        torch.set_autocast_enabled(device, enabled)


@contextmanager
def in_callers_modes() -> Iterator[None]:
    """The caller's inference mode and autocast back on, inside a capture that runs outside
    them: for what keeps this thread's dispatch keys from its making (a TensorGuards check)."""
    with torch.inference_mode() if _callers_inference_mode else nullcontext():
        devices = callers_autocast_devices()
        switch_autocast(devices, True)
        try:
            yield
        finally:
            switch_autocast(devices, False)
