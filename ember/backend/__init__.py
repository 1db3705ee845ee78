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

import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from ember.aot import aot_compile
from ember.backend.compile import compile_aten

__all__ = ["compile_aten", "compile_graph"]


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The backend: torch-level fx graph -> callable, via ember's AOT tracer."""
    return aot_compile(gm, example_inputs, compile_aten)


class _CallableModule(types.ModuleType):
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        return compile_graph(gm, example_inputs)


sys.modules[__name__].__class__ = _CallableModule
