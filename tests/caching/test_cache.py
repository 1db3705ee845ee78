"""Kernel and graph caches: fresh processes skip lowering and g++; corrupt entries rebuild."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from ember import config
from ember.aot.program import trace_inference
from ember.backend import compile_aten
from ember.backend.codegen import cache
from ember.backend.compile import stats
from tests.caching.procs import last_line, start

SCRIPT = """
import json, torch
import ember.backend
from ember.backend.compile import stats
def f(x):
    return torch.softmax(x * 3, -1) + x.mean()
x = torch.arange(48.0).reshape(6, 8) / 10
out = torch.compile(f, backend=ember.backend, dynamic=False)(x)
torch.testing.assert_close(out, f(x))
print(json.dumps(dict(stats)))
"""


def _run(cache: Path) -> subprocess.Popen:
    return start(SCRIPT, cache)


def _result(p: subprocess.Popen) -> dict:
    return json.loads(last_line(p))


def test_fresh_processes_share_the_cache(tmp_path):
    # two cold processes at once: concurrent writers must not corrupt each other
    first = [_result(p) for p in [_run(tmp_path), _run(tmp_path)]]
    assert all(r.get("generated", 0) + r.get("graph_cache_hits", 0) == 1 for r in first)
    assert any(r.get("generated") == 1 for r in first)
    sos = sorted(tmp_path.rglob("*.so"))
    stamp = [so.stat().st_mtime_ns for so in sos]
    warm = _result(_run(tmp_path))
    assert warm.get("graph_cache_hits") == 1 and "generated" not in warm
    assert [so.stat().st_mtime_ns for so in sos] == stamp  # g++ did not run again
    assert not list(tmp_path.rglob("*.tmp"))


def _compiled(x):
    def f(x):
        return torch.tanh(x) * 2 - x.sum(-1, keepdim=True)

    gm = trace_inference(torch.fx.symbolic_trace(f), [x]).gm
    return compile_aten(gm, [x])(x)[0], f(x)


def test_corrupt_or_truncated_entries_are_rebuilt(tmp_path):
    x = torch.randn(5, 7)
    with config.patch(cache_dir=str(tmp_path)):
        got, want = _compiled(x)
        torch.testing.assert_close(got, want)
        (graph,) = tmp_path.rglob("graphs/*/*.json")
        (so,) = tmp_path.rglob("kernels/*/*.so")
        # truncated entries (written beside and renamed: the loaded library stays mapped)
        for path in (graph, so):
            tmp = path.with_name("broken")
            tmp.write_bytes(path.read_bytes()[: 1000 if path == so else 50])
            os.replace(tmp, path)
        before = stats["generated"]
        got, want = _compiled(x)
        torch.testing.assert_close(got, want)
        assert stats["generated"] == before + 1
        hits = stats["graph_cache_hits"]
        got, _ = _compiled(x)  # the rebuilt entries are valid again
        assert stats["graph_cache_hits"] == hits + 1
        assert json.loads(graph.read_bytes().partition(b"\n")[2])["format"] == cache.FORMAT


def test_the_default_dtype_is_part_of_the_key(tmp_path):
    """`torch.ones(2)` in a graph makes the default dtype's tensor: a library built under
    float32 must not serve the same graph under float64 (it read float64 data as float32)."""
    import ember

    def f(x):
        return torch.ones(2) + x

    x = torch.ones(2, dtype=torch.float64)
    with config.patch(cache_dir=str(tmp_path)):
        compiled = ember.compile(f)
        try:
            for dtype in (torch.float32, torch.float64, torch.float32):
                torch.set_default_dtype(dtype)
                got, want = compiled(x), f(x)
                assert got.dtype == want.dtype and torch.equal(got, want), (dtype, got, want)
        finally:
            torch.set_default_dtype(torch.float32)
