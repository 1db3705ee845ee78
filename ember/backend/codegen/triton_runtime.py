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

import functools
import hashlib
import importlib.util
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


def module_path(source: str, device: torch.device) -> Path:
    key = hashlib.sha256(f"{source}\n{version()}\n{device_tag(device)}".encode()).hexdigest()
    return Path(config.current().cache_dir) / "triton" / key[:2] / f"ember_{key}.py"


_loaded: dict[tuple[Path, bool], Any] = {}


def load(source: str, names: list[str], device: torch.device) -> dict[str, Any]:
    """The module's kernels by name, ready to launch as `kernel[grid](*args, **blocks)`."""
    path = module_path(source, device)
    interpret = device.type == "cpu"
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
    return {name: getattr(module, name) for name in names}
