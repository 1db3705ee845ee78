"""Kernel plans (shared by the C++ and Triton printers) on their own, and the Triton path's
logs, on-disk module cache and placement choices."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import ember
import ember.backend
from ember import config
from ember.backend import compile as backend_compile
from ember.backend.codegen import triton_runtime
from ember.backend.codegen.plan import Form, identity, plan_kernel, plan_str
from ember.backend.ir.nodes import DType, ReductionType
from ember.backend.lowering.graph import lower
from ember.backend.scheduler.dependencies import eliminate_dead
from ember.backend.scheduler.fusion import schedule
from tests.backend.test_ir import aten_graph
from tests.triton.helpers import check


def plans(fn, *inputs):
    g = eliminate_dead(lower(aten_graph(fn, *inputs), list(inputs)))
    buffers = g.buffer_map()
    return [plan_kernel(k, buffers) for k in schedule(g).kernels()]


def test_plan_forms_and_parameters():
    (rows,) = plans(lambda x: torch.softmax(x, -1), torch.randn(4, 8))
    assert rows.form == Form.ROWS and rows.params == ["in0", rows.writes[0]]
    (cols,) = plans(lambda x: x.sum(0), torch.randn(64, 48))
    assert cols.form == Form.COLUMNS
    (flat,) = plans(lambda x: x.exp() + 1, torch.randn(4, 8))
    assert flat.form == Form.POINTWISE and flat.segments is None and not flat.prefetch


def test_plan_cuts_a_concatenation_and_prefetches_long_rows():
    (cat,) = plans(lambda a, b: torch.cat([a, b * 2], 1) + 1, torch.randn(4, 3), torch.randn(4, 5))
    assert [(s.lo, s.hi) for s in cat.segments] == [(0, 3), (3, 8)]
    assert "segments=[0,3)/1 [3,8)/1" in plan_str(cat)
    (ln,) = plans(lambda x: F.layer_norm(x, (1024,)), torch.randn(512, 1024))
    assert ln.prefetch and ln.prefetch[0][0] == "in0"  # 2 MiB of rows: fetched ahead


def test_reduction_identities():
    assert identity(ReductionType.MAX, DType.F32) == -float("inf")
    assert identity(ReductionType.MIN, DType.I32) == 2**31 - 1
    assert identity(ReductionType.PROD, DType.BOOL) is True
    assert identity(ReductionType.SUM, DType.I64) == 0


def test_logs_show_triton_source_and_plans(caplog):
    ember.set_logs("kernels", "schedule")
    with caplog.at_level(logging.DEBUG, logger="ember"):
        check(lambda x: torch.softmax(x, -1), torch.randn(3, 10))
    err = caplog.text
    assert "@jit\ndef kernel0(" in err and "tl.reduce(" in err
    assert "plans:\nkernel0: rows(" in err


def test_modules_are_cached_on_disk_and_reloaded():
    x = torch.randn(5, 6)
    arts = check(lambda x: x.sigmoid() * 3, x)
    path = triton_runtime.module_path(arts[0].cpp, triton_runtime.device_tag(torch.device("cpu")))
    assert path.is_relative_to(Path(config.current().cache_dir) / "triton")
    assert path.read_text() == arts[0].cpp
    hits = backend_compile.stats["graph_cache_hits"]
    torch._dynamo.reset()
    check(lambda x: x.sigmoid() * 3, x)  # the same graph: cache hit, same module file
    assert backend_compile.stats["graph_cache_hits"] == hits + 1
    # the key holds Triton's version and the device: another device, another file
    assert "interpreter" == triton_runtime.device_tag(torch.device("cpu"))


def test_cpu_graphs_use_cpp_unless_interpreting():
    assert backend_compile.language_for(torch.device("cpu")) == "triton"
    with config.patch(triton_interpret=False):
        assert backend_compile.language_for(torch.device("cpu")) == "c++"
    assert backend_compile.language_for(torch.device("meta")) is None


def test_graph_on_two_devices_is_not_compiled():
    x = torch.randn(3)
    gm = aten_graph(lambda x: x * 2, x)
    where = backend_compile.placement(gm, [x, torch.randn(2, device="meta")])
    assert isinstance(where, str) and "several devices" in where


@pytest.mark.parametrize("interpret", [True, False])
def test_same_answers_from_both_printers(interpret):
    x, w = torch.randn(6, 20), torch.randn(20)

    def f(x, w):
        return F.layer_norm(x, (20,), w) * torch.sigmoid(x), x.amax(0)

    with config.patch(triton_interpret=interpret):
        torch._dynamo.reset()
        got = torch.compile(f, backend=ember.backend, dynamic=False)(x, w)
    for a, b in zip(got, f(x, w)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_an_unusable_cache_directory_still_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with config.patch(cache_dir=str(blocker / "cache")):
        check(lambda x: x.cos() + 2, torch.randn(3, 4))
