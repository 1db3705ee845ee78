"""ember's settings: one frozen object, read from EMBER_* environment variables at import.

Code reads `config.current()`; tests and users change settings for a region with
`config.patch(recompile_limit=2)`. Nothing else holds mutable global settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "ember")


MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""torch.compile's `mode` values, which ember.compile and ember's backend accept."""
AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")
"""Modes that time each Triton kernel's launch configurations (backend/codegen/autotune.py)."""
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
"""Modes that record compiled graphs into CUDA graphs (backend/cudagraphs.py)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    recompile_limit: int = 8
    """Cache entries per code object before ember stops capturing it and runs it eagerly."""
    cache_dir: str = dataclasses.field(default_factory=_default_cache_dir)
    """Where the backend keeps compiled kernels and graphs (EMBER_CACHE_DIR)."""
    inline_depth: int = 32
    """How deep user functions are inlined before the capture gives up on a call."""
    verbose_errors: bool = False
    """Attach ember's internal traceback to Unsupported errors (EMBER_VERBOSE=1)."""
    cpu_isa: str = "native"
    """The CPU target of generated kernels (EMBER_CPU_ISA): native, avx512, avx2, sse2, or any
    g++ -march value; a lower target than the machine's tests that code path here."""
    strict: bool = False
    """Raise instead of running a graph as aten ops when the backend fails (EMBER_STRICT=1;
    the test suite sets it, so a silent fallback cannot pass a test)."""
    triton_interpret: bool = False
    """Compile CPU graphs with the Triton code generator and run them under Triton's
    interpreter (EMBER_TRITON_INTERPRET=1): the GPU code path, exercised on a CPU machine."""
    conv_layout: str = "auto"
    """The memory format of convolutions in NCHW graphs (EMBER_CONV_LAYOUT): auto (each
    convolution shape timed once in both, channels-last kept where faster), channels_last
    (wherever the backend can keep it), eager (eager's layout)."""
    background_build: bool = True
    """Return from a compile while g++ builds its kernels, waiting at the graph's first call
    (EMBER_BACKGROUND_BUILD=0: wait inside the compile, as compile-time benchmarks that
    time the backend call need)."""
    optimize_ddp: bool = True
    """Split graphs captured inside DDP's forward at its gradient buckets, so all-reduces
    overlap the backward (EMBER_OPTIMIZE_DDP=0: one graph, all-reduces after it)."""


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no")


CONV_LAYOUTS = ("auto", "channels_last", "eager")


def _conv_layout(value: str) -> str:
    if value not in CONV_LAYOUTS:
        raise ValueError(f"EMBER_CONV_LAYOUT={value!r}: expected one of {', '.join(CONV_LAYOUTS)}")
    return value


_ENV = {
    "recompile_limit": ("EMBER_RECOMPILE_LIMIT", int),
    "cache_dir": ("EMBER_CACHE_DIR", str),
    "inline_depth": ("EMBER_INLINE_DEPTH", int),
    "verbose_errors": ("EMBER_VERBOSE", _flag),
    "cpu_isa": ("EMBER_CPU_ISA", str),
    "strict": ("EMBER_STRICT", _flag),
    "optimize_ddp": ("EMBER_OPTIMIZE_DDP", _flag),
    "background_build": ("EMBER_BACKGROUND_BUILD", _flag),
    "triton_interpret": ("EMBER_TRITON_INTERPRET", _flag),
    "conv_layout": ("EMBER_CONV_LAYOUT", _conv_layout),
}


def _from_env() -> Config:
    values = {}
    for field, (var, parse) in _ENV.items():
        if var in os.environ:
            values[field] = parse(os.environ[var])
    return Config(**values)


_current = _from_env()


def current() -> Config:
    """The settings in force."""
    return _current


@contextlib.contextmanager
def patch(**changes: object) -> Iterator[Config]:
    """Use changed settings inside a `with` block (restored afterwards, even on error)."""
    global _current
    saved = _current
    _current = dataclasses.replace(saved, **changes)
    try:
        yield _current
    finally:
        _current = saved
