"""ember's CPU backend: `torch.compile(model, backend=ember.backend)`.

The package itself is callable (torch.compile's backend protocol); calling it is
`compile_graph(gm, example_inputs)`: ember's AOT layer traces the torch-level graph to a
functional aten graph and hands it to `compile_aten` (see compile.py for the pipeline).

Importing the package imports the whole compiler (the AOT tracer, the lowering with sympy,
code generation), as importing `torch._inductor.compile_fx` does for Inductor: selecting the
backend (`ember.compile(model)` resolves it at once) is where a process pays for its code,
not the first call of the compiled model. `import ember` alone stays light (capture only).
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from ember.aot import aot_compile
from ember.backend.codegen import build
from ember.backend.compile import compile_aten

__all__ = ["compile_aten", "compile_graph"]


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    mode: str | None = None,
    options: dict | None = None,
) -> Callable[..., Any]:
    """The backend: torch-level fx graph -> callable, via ember's AOT tracer. `mode` is
    torch.compile's (torch.compile passes `mode=` and `options=` as keyword arguments to
    a backend other than Inductor; `ember.compile` binds its own); every aten graph of the
    call (forward, backward) is compiled in it. No `options` key is known."""
    if options:
        known = "none (ember's settings are ember.config fields, set with EMBER_* variables)"
        raise ValueError(f"unknown options {sorted(options)} for ember's backend; known: {known}")
    build.begin()  # how idle the machine is while this compiles: g++'s parallelism
    compile_aten_: Any = compile_aten
    if mode not in (None, "default"):
        compile_aten_ = functools.partial(compile_aten, mode=mode)
        compile_aten_.channels_last_training = compile_aten.channels_last_training
    return aot_compile(gm, example_inputs, compile_aten_)


class _CallableModule(types.ModuleType):
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        return compile_graph(gm, example_inputs, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
