"""Differential checks against eager through `torch.compile(fn, backend=ember.backend)`."""

from __future__ import annotations

import re
from typing import Any

import torch

import ember.backend
from ember.backend.compile import record, stats


def compile_ember(fn: Any) -> Any:
    return torch.compile(fn, backend=ember.backend, dynamic=False)


def _close(a: Any, b: Any, **tol: Any) -> None:
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y, **tol)
        return
    torch.testing.assert_close(a, b, equal_nan=True, **tol)


@torch.no_grad()
def check(fn: Any, *inputs: Any, **tol: Any) -> list:
    """Compile `fn` (inference), compare to eager twice, return the compiled artifacts.

    Fails if the backend fell back to running the whole graph as aten ops.
    """
    expected = fn(*inputs)
    before = stats["graph_fallbacks"]
    compiled = compile_ember(fn)
    with record() as arts:
        got = compiled(*inputs)
    _close(got, expected, **tol)
    _close(compiled(*inputs), expected, **tol)
    assert stats["graph_fallbacks"] == before, "the graph ran as aten ops (see EMBER_LOGS=kernels)"
    return arts


def kernel_count(art: Any) -> int:
    return len(re.findall(r'^extern "C" void kernel', art.cpp, re.M))


def extern_ops(art: Any) -> list[str]:
    return re.findall(r"^_op\d+ = (.*)$", art.wrapper, re.M)
