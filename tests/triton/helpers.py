"""Differential checks of the Triton path against eager (see conftest.py)."""

from __future__ import annotations

import re
from typing import Any

import torch

import ember.backend
from ember.backend.compile import record, stats
from tests.backend.helpers import _close, extern_ops


@torch.no_grad()
def check(fn: Any, *inputs: Any, dynamic: bool = False, **tol: Any) -> list:
    """Compile `fn` through ember's backend with Triton kernels, compare to eager twice
    (the second call runs the cached kernels), return the compiled artifacts."""
    expected = fn(*inputs)
    before = stats["graph_fallbacks"]
    compiled = torch.compile(fn, backend=ember.backend, dynamic=dynamic)
    with record() as arts:
        got = compiled(*inputs)
    _close(got, expected, **tol)
    _close(compiled(*inputs), expected, **tol)
    assert stats["graph_fallbacks"] == before, "the graph ran as aten ops"
    assert arts and all(a.language == "triton" for a in arts), "not the Triton path"
    return arts


def kernel_count(art: Any) -> int:
    return len(re.findall(r"^def kernel\d+\(", art.cpp, re.M))


__all__ = ["check", "extern_ops", "kernel_count"]
