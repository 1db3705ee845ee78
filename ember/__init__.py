"""ember: torch.compile written again in Python.

import ember
fast = ember.compile(model)          # same arguments as torch.compile
ember.explain(fn)(*args)             # graphs, guards and graph breaks
"""

from ember import torch_compat  # noqa: F401, I001  (checks the torch version first)
from ember import config
from ember.api import compile, reset, stats
from ember.capture.values.compiler import (
    allow_in_graph,
    assume_constant_result,
    disable,
    graph_break,
    is_compiling,
)
from ember.errors import BackendCompilerFailed, BreakReason, Unsupported
from ember.explain import explain
from ember.logs import set_logs

__version__ = "0.1.0"

__all__ = [
    "BackendCompilerFailed",
    "BreakReason",
    "Unsupported",
    "allow_in_graph",
    "assume_constant_result",
    "compile",
    "config",
    "disable",
    "explain",
    "graph_break",
    "is_compiling",
    "reset",
    "set_logs",
    "stats",
]
