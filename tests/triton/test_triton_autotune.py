"""Autotuning of the generated Triton kernels (`mode="max-autotune"`), under Triton's
interpreter: every configuration of a kernel's tuning space gives eager's results, the
choice is made once and kept on disk (a fresh load launches it without timing), and the
default mode does not tune. Timings are replaced by a fake clock where a test needs a
particular winner (the interpreter's times mean nothing); on a GPU the real path runs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import ember
import ember.backend
from ember import config
from ember.backend import compile as backend_compile
from ember.backend.codegen import autotune, triton_runtime
from tests.backend.helpers import _close

WORKLOADS = {
    "pointwise": (lambda x: torch.sigmoid(x * 2 + 1) - x.tanh(), [(4096,)]),
    "softmax rows": (lambda x: torch.softmax(x, -1), [(64, 128)]),
    "layer norm": (lambda x, w: F.layer_norm(x, (96,), w), [(16, 96), (96,)]),
    "looped rows": (lambda x: x.sum(-1) + x.amax(-1), [(4, 5000)]),
    "columns": (lambda x: x.sum(0), [(64, 48)]),
}


@pytest.fixture
def tuned(monkeypatch: pytest.MonkeyPatch) -> list[autotune.Autotuned]:
    """Every autotuned kernel made during the test."""
    made: list[autotune.Autotuned] = []
    init = autotune.Autotuned.__init__

    def note(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(autotune.Autotuned, "__init__", note)
    return made


@pytest.fixture
def fresh_cache(tmp_path: Path):
    with config.patch(cache_dir=str(tmp_path)):
        triton_runtime._loaded.clear()
        yield tmp_path
        triton_runtime._loaded.clear()


@pytest.mark.parametrize("name", list(WORKLOADS))
@torch.no_grad()
def test_every_configuration_gives_eager_results(name, tuned, fresh_cache):
    fn, shapes = WORKLOADS[name]
    inputs = [torch.randn(*s) for s in shapes]
    expected = fn(*inputs)
    skipped = autotune.stats["skipped"]
    compiled = ember.compile(fn, mode="max-autotune-no-cudagraphs")
    _close(compiled(*inputs), expected, rtol=1e-5, atol=1e-5)
    assert autotune.stats["skipped"] == skipped, "a configuration failed or disagreed"
    assert tuned and any(len(k.configs) > 2 for k in tuned), [k.configs for k in tuned]
    for kernel in tuned:
        (bucket,) = kernel.chosen
        for cfg in kernel.configs:  # each configuration launched by the real path
            kernel.chosen[bucket] = cfg
            _close(compiled(*inputs), expected, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_choice_is_cached_on_disk_and_reused_without_timing(
    tuned, fresh_cache, monkeypatch, caplog
):
    timed: list[int] = []

    def fake_measure(run, device):  # the last configuration timed is the fastest
        run()
        timed.append(1)
        return 100.0 - len(timed)

    monkeypatch.setattr(autotune, "measure", fake_measure)
    fn, (shape,) = WORKLOADS["softmax rows"]
    x = torch.randn(*shape)
    ember.set_logs("autotune")
    with caplog.at_level(logging.DEBUG, logger="ember"):
        _close(ember.compile(fn, mode="max-autotune-no-cudagraphs")(x), fn(x))
    ember.set_logs()
    (kernel,) = tuned
    assert len(timed) == len(kernel.configs) > 1
    assert list(kernel.chosen.values()) == [kernel.configs[-1]]
    assert "<- chosen" in caplog.text and str(kernel.configs[-1]) in caplog.text
    (entry,) = (fresh_cache / "autotune").rglob("*.json")
    assert json.loads(entry.read_text())["config"] == kernel.configs[-1]

    # a fresh load (new process: module and graph reloaded from the disk caches)
    torch._dynamo.reset()
    triton_runtime._loaded.clear()
    hits = autotune.stats["disk_hits"]
    graph_hits = backend_compile.stats["graph_cache_hits"]
    _close(ember.compile(fn, mode="max-autotune-no-cudagraphs")(x), fn(x))
    assert backend_compile.stats["graph_cache_hits"] == graph_hits + 1
    assert autotune.stats["disk_hits"] == hits + 1
    assert len(timed) == len(kernel.configs), "timed again"
    assert list(tuned[-1].chosen.values()) == [kernel.configs[-1]]


@torch.no_grad()
def test_size_buckets_are_tuned_separately(tuned, fresh_cache):
    def fn(x):
        return torch.softmax(x, -1) * 2

    compiled = ember.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=True)
    for rows in (4, 5, 40):  # buckets 4, 8, 64 of the row count
        x = torch.randn(rows, 6000)  # symbolic: looped rows
        # the fastest configuration (by real timing) may sum a row in another order
        _close(compiled(x), fn(x), rtol=1e-5, atol=1e-6)
    (kernel,) = {id(k): k for k in tuned}.values()
    assert len(kernel.chosen) == 3


@torch.no_grad()
def test_default_mode_does_not_autotune(tuned, fresh_cache, monkeypatch):
    monkeypatch.setattr(autotune, "measure", lambda run, device: pytest.fail("timed"))
    fn, (shape,) = WORKLOADS["softmax rows"]
    x = torch.randn(*shape)
    for mode in (None, "default", "reduce-overhead"):  # reduce-overhead: CUDA graphs only
        torch._dynamo.reset()
        _close(ember.compile(fn, mode=mode)(x), fn(x))
    assert not tuned
    assert not list((fresh_cache).rglob("autotune/*/*.json"))


@torch.no_grad()
def test_torch_compile_passes_the_mode_to_embers_backend(tuned, fresh_cache):
    fn, (shape,) = WORKLOADS["pointwise"]
    x = torch.randn(*shape)
    compiled = torch.compile(fn, backend=ember.backend, mode="max-autotune-no-cudagraphs")
    _close(compiled(x), fn(x))
    assert tuned, "torch.compile's mode= did not reach ember's backend"
    with pytest.raises(Exception, match="unknown options"):
        torch.compile(fn, backend=ember.backend, options={"x": 1})(x)


def test_a_configuration_that_fails_is_skipped_with_its_reason(fresh_cache, caplog):
    calls = []

    class Flaky:  # fails for one configuration, as a too-large block would on a GPU
        def __getitem__(self, grid):
            def launch(*args, **blocks):
                calls.append(blocks)
                if blocks["XBLOCK"] == 512:
                    raise RuntimeError("out of resources")
                args[0].add_(1)

            return launch

    configs = [{"XBLOCK": 1024}, {"XBLOCK": 512}, {"XBLOCK": 256}]
    kernel = autotune.Autotuned(Flaky(), "k", "src", configs, torch.device("cpu"))
    x = torch.zeros(8)
    ember.set_logs("autotune")
    with caplog.at_level(logging.DEBUG, logger="ember"):
        kernel[(1,)](x)
    ember.set_logs()
    assert "{'XBLOCK': 512} skipped: RuntimeError: out of resources" in caplog.text
    assert torch.equal(x, torch.ones(8)), "the real buffer saw more than one launch"
    assert list(kernel.chosen.values())[0] in (configs[0], configs[2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="autotuning on a GPU needs CUDA")
@torch.no_grad()
def test_autotuning_on_the_gpu(tuned, fresh_cache):
    dev = torch.device("cuda")
    before = dict(autotune.stats)
    for fn, shapes in WORKLOADS.values():
        inputs = [torch.randn(*s, device=dev) for s in shapes]
        torch._dynamo.reset()
        compiled = ember.compile(fn, mode="max-autotune-no-cudagraphs")
        _close(compiled(*inputs), fn(*inputs), rtol=1e-4, atol=1e-4)
        _close(compiled(*inputs), fn(*inputs), rtol=1e-4, atol=1e-4)
    assert tuned and all(k.chosen for k in tuned)
    made = {k: autotune.stats[k] - before.get(k, 0) for k in ("timed", "disk_hits", "skipped")}
    assert made["timed"] == sum(len(k.chosen) for k in tuned) and made["disk_hits"] == 0, made
    assert made["skipped"] == 0, "a configuration failed to compile or disagreed (EMBER_LOGS)"
