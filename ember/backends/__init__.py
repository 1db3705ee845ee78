"""The backend registry: names to compilers that follow torch.compile's backend protocol.

A backend is `callable(gm: torch.fx.GraphModule, example_inputs: list) -> callable`. Entries
are loaded on first use so that `import ember` does not import Inductor or ember's codegen.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

Backend = Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]]

# name -> "module:attribute", resolved lazily
_LAZY: dict[str, str] = {
    "eager": "ember.backends:eager",
    "aot_eager": "ember.aot:aot_eager",
    "ember": "ember.backend:compile_graph",
    "inductor": "ember.higher_order:for_inductor",
}
_loaded: dict[str, Backend] = {}


def eager(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Run the captured graph as torch code: tests capture without any code generation."""
    return gm.forward


def register_backend(name: str) -> Callable[[Backend], Backend]:
    """Decorator: make a compiler reachable as `ember.compile(..., backend=name)`."""

    def register(fn: Backend) -> Backend:
        _loaded[name] = fn
        return fn

    return register


def lookup(backend: str | Backend) -> Backend:
    """The compiler for a name or a callable; an unknown name lists the known ones."""
    if callable(backend):
        return backend
    if backend in _loaded:
        return _loaded[backend]
    if backend not in _LAZY:
        known = ", ".join(sorted(set(_LAZY) | set(_loaded)))
        raise ValueError(f"unknown backend {backend!r}; known backends: {known}")
    module_name, attr = _LAZY[backend].split(":")
    fn = getattr(importlib.import_module(module_name), attr)
    _loaded[backend] = fn
    return fn


def backend_name(backend: str | Backend) -> str:
    """A readable name for logs and errors."""
    if isinstance(backend, str):
        return backend
    return getattr(backend, "__name__", type(backend).__name__)


def list_backends() -> list[str]:
    return sorted(set(_LAZY) | set(_loaded))
