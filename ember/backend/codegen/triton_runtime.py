"""Loading generated Triton modules: on a GPU through Triton's compiler, on CPU tensors
through Triton's interpreter (EMBER_TRITON_INTERPRET=1).

A module's source is written once to the cache directory, keyed by its text, the Triton
version and the device (its compute capability, or "interpreter"), and imported from there:
Triton reads a kernel's source from its file, and a warm process finds the file (and
Triton's own cache, the compiled binaries) without generating anything. The `jit` the
module's kernels are decorated with is bound at import: Triton's compiler or its
interpreter.
"""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ember import config, logs
from ember.backend.codegen.build import atomic_write, private_dir


@functools.cache
def version() -> str | None:
    """The installed Triton's version, None when Triton cannot be imported."""
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def device_tag(device: torch.device) -> str:
    """What compiled code depends on besides its source: the GPU's compute capability."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)}-sm{major}{minor}"
    return "interpreter"


def _bindings(interpret: bool) -> dict[str, Any]:
    """The names a generated module takes from its loader: `jit` and `libdevice`."""
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return {"jit": InterpretedFunction, "libdevice": _InterpretedLibdevice()}
    import triton
    from triton.language.extra import libdevice

    return {"jit": triton.jit, "libdevice": libdevice}


class _InterpretedLibdevice:
    """The libdevice functions generated kernels call, for Triton's interpreter (which has
    no extern calls): each one is the torch function on the tile's numpy data."""

    _UNARY = {
        "tanh": torch.tanh,
        "erf": torch.erf,
        "expm1": torch.expm1,
        "log1p": torch.log1p,
        "trunc": torch.trunc,
        "rint": torch.round,  # half to even, as rint
        "erfc": torch.erfc,
    }
    _BINARY = {"pow": torch.pow, "atan2": torch.atan2}

    def __getattr__(self, name: str) -> Any:
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        def wrap(data, like):
            handle = TensorHandle(data.numpy(), like.handle.dtype.scalar)
            return tl.core.tensor(handle, like.type)

        if name in self._UNARY:
            fn = self._UNARY[name]
            return lambda x: wrap(fn(torch.from_numpy(x.handle.data)), x)
        fn = self._BINARY[name]

        def binary(a, b):
            a, b = tl.broadcast(a, b)
            return wrap(fn(torch.from_numpy(a.handle.data), torch.from_numpy(b.handle.data)), a)

        return binary


def module_path(source: str, tag: str) -> Path:
    key = hashlib.sha256(f"{source}\n{version()}\n{tag}".encode()).hexdigest()
    return Path(config.current().cache_dir) / "triton" / key[:2] / f"ember_{key}.py"


_loaded: dict[tuple[Path, bool], Any] = {}


def _module(source: str, tag: str, interpret: bool) -> Any:
    path = module_path(source, tag)
    module = _loaded.get((path, interpret))
    if module is None:
        try:
            if not path.exists() or path.read_text() != source:
                atomic_write(path, source.encode())
        except OSError as e:  # an unusable cache directory costs only the cache
            logs.log("kernels", "Triton module cache not writable (%s); writing privately", e)
            path = private_dir() / path.name
            atomic_write(path, source.encode())
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        vars(module).update(_bindings(interpret))
        spec.loader.exec_module(module)
        _loaded[(path, interpret)] = module
    return module


def load(
    source: str, names: list[str], device: torch.device, autotune: bool = False
) -> dict[str, Any]:
    """The module's kernels by name, ready to launch as `kernel[grid](*args, **blocks)`;
    with `autotune` (mode="max-autotune"), each launched with the fastest configuration of
    its tuning space (codegen/autotune.py)."""
    module = _module(source, device_tag(device), interpret=device.type == "cpu")
    kernels = {name: getattr(module, name) for name in names}
    if _recording is not None:
        kernels = {name: _Recorded(source, name, k, _recording) for name, k in kernels.items()}
    if autotune:
        from ember.backend.codegen import autotune as tuner

        kernels = tuner.tune(kernels, module, source, device)
    return kernels


# ------------------------------------------------------------ compiling for a GPU ahead


@dataclasses.dataclass(frozen=True)
class Launch:
    """What Triton's compiler needs of one launch besides the source: the type of each
    argument (`*fp32` a pointer, `i64` an int) and the block sizes (constexprs)."""

    source: str
    kernel: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, int], ...]
    options: tuple[tuple[str, int], ...] = ()  # num_warps / num_stages, when given


_LAUNCH_OPTIONS = ("num_warps", "num_stages")


_recording: list[Launch] | None = None

_POINTEE = {
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
}


def _arg_type(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _POINTEE[value.dtype]
    if isinstance(value, bool | int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"a Triton kernel argument of type {type(value).__name__}")


class _Recorded:
    """A kernel that notes each launch's argument types, then launches it."""

    def __init__(self, source: str, name: str, kernel: Any, log: list[Launch]) -> None:
        self.source, self.name, self.kernel, self.log = source, name, kernel, log

    def __getitem__(self, grid: Any) -> Any:
        launcher = self.kernel[grid]

        def launch(*args: Any, **blocks: int) -> Any:
            params = list(inspect.signature(self.kernel.fn).parameters)
            signature = tuple((p, _arg_type(a)) for p, a in zip(params, args, strict=False))
            consts = tuple((k, v) for k, v in blocks.items() if k not in _LAUNCH_OPTIONS)
            options = tuple((k, v) for k, v in blocks.items() if k in _LAUNCH_OPTIONS)
            self.log.append(Launch(self.source, self.name, signature, consts, options))
            return launcher(*args, **blocks)

        return launch


@contextlib.contextmanager
def record_launches() -> Iterator[list[Launch]]:
    """Note every launch of kernels loaded inside the block (under the interpreter or on a
    GPU), for compile_ahead."""
    global _recording
    outer, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = outer


@contextlib.contextmanager
def _ast_parses_serialized() -> Iterator[None]:
    """CPython 3.11 before 3.11.8 keeps the recursion depth of `ast.parse`'s tree building
    in state shared by all threads: a thread switch in the middle of one parse (a GC
    finalizer running Python code) and a parse in another thread fail with "AST constructor
    recursion depth mismatch" (seen in CI, reproduced with threads making cyclic garbage).
    Triton's front end parses every kernel and each `triton.language` function it calls, so
    while the pool below compiles, `ast.parse` takes a lock (parsing is short; code
    generation and ptxas still run in parallel)."""
    parse, lock = ast.parse, threading.RLock()

    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return parse(*args, **kwargs)

    ast.parse = locked
    try:
        yield
    finally:
        ast.parse = parse


def compile_ahead(launches: list[Launch], capability: int = 90, workers: int = 4) -> list[Any]:
    """Each distinct launch compiled by Triton's own compiler for a CUDA device of this
    compute capability, down to the cubin (ptxas ships with Triton), in a thread pool. No
    GPU is needed: on a CPU machine this is how the generated kernels are shown to compile
    for the GPU, beyond what the interpreter accepts."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", capability, 32)
    distinct = list(dict.fromkeys(launches))
    modules = {
        launch.source: _module(launch.source, f"sm{capability}", False) for launch in distinct
    }

    def build(launch: Launch) -> Any:
        module = modules[launch.source]
        signature = dict(launch.signature) | {name: "constexpr" for name, _ in launch.constexprs}
        src = ASTSource(
            fn=getattr(module, launch.kernel),
            signature=signature,
            constexprs=dict(launch.constexprs),
        )
        return triton.compile(src, target=target, options=dict(launch.options))

    workers = max(1, min(workers, len(distinct)))
    with _ast_parses_serialized(), concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(build, distinct))
