"""g++ in the background (build.start, compile._Joining) and parallel translation units by
measured idle CPUs (build._idle_cpus): results equal eager's, a failed build is what a
failed stage is (BackendCompilerFailed under strict, else aten ops), and the unit count
follows /proc/stat."""

from __future__ import annotations

import pytest
import torch

from ember import config
from ember.aot.program import trace_inference
from ember.backend.codegen import build
from ember.backend.compile import _Joining, compile_aten, stats
from ember.errors import BackendCompilerFailed


def _f(x):
    y = torch.softmax(x, -1) * 3
    return y + x.sum(-1, keepdim=True), (x.exp() - 1).amax(0)


def _compile(x: torch.Tensor, fn=_f):
    gm = trace_inference(torch.fx.symbolic_trace(fn), [x]).gm
    return compile_aten(gm, [x])


def _same(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_compile_returns_while_gxx_builds_and_the_first_call_waits(tmp_path):
    x = torch.randn(7, 13)
    with config.patch(cache_dir=str(tmp_path)):
        fn = _compile(x)
        assert isinstance(fn, _Joining)  # an empty cache: g++ was started, not waited for
        _same(fn(x), _f(x))
        boxed = fn.run_boxed
        assert boxed is fn._fn.run_boxed  # later boxed calls go straight to the wrapper
        _same(boxed([x]), _f(x))
        again = _compile(x)  # the graph cache and kernel library now hold it
        assert not isinstance(again, _Joining)
        _same(again(x), _f(x))


def test_a_boxed_first_call_waits_too(tmp_path):
    x = torch.randn(5, 9)
    with config.patch(cache_dir=str(tmp_path)):
        fn = _compile(x)
        _same(fn.run_boxed([x]), _f(x))
        _same(fn(x), _f(x))


def test_without_background_builds_the_compile_waits(tmp_path):
    x = torch.randn(4, 6)
    with config.patch(cache_dir=str(tmp_path), background_build=False):
        fn = _compile(x)
        assert not isinstance(fn, _Joining)
        _same(fn(x), _f(x))


def _broken_compiler(monkeypatch):
    monkeypatch.setattr(build, "_flags", lambda: ("-fno-such-flag-for-ember",))


def test_a_failed_background_build_raises_at_the_first_call_under_strict(tmp_path, monkeypatch):
    _broken_compiler(monkeypatch)
    x = torch.randn(3, 5)
    with config.patch(cache_dir=str(tmp_path), strict=True):
        fn = _compile(x)
    with pytest.raises(BackendCompilerFailed) as info:
        fn(x)
    assert info.value.stage == "g++ and loading the kernels"


def test_a_failed_background_build_runs_aten_ops_for_users(tmp_path, monkeypatch):
    _broken_compiler(monkeypatch)
    x = torch.randn(3, 5)
    with config.patch(cache_dir=str(tmp_path), strict=False):
        before = stats["graph_fallbacks"]
        fn = _compile(x)
        _same(fn.run_boxed([x]), _f(x))
        _same(fn(x), _f(x))
        assert stats["graph_fallbacks"] == before + 1


def test_parallel_translation_units_give_the_same_results(tmp_path, monkeypatch):
    commands = []
    real = build._start
    monkeypatch.setattr(build, "_idle_cpus", lambda: 2)
    monkeypatch.setattr(build, "_start", lambda cmd: (commands.append(cmd), real(cmd))[1])
    x = torch.randn(6, 11)
    with config.patch(cache_dir=str(tmp_path)):
        _same(_compile(x)(x), _f(x))
    assert sum("-c" in cmd for cmd in commands) == 2  # two units, then one link


def _jiffies(monkeypatch, readings):
    it = iter(readings)
    monkeypatch.setattr(build, "_cpu_jiffies", lambda: next(it))
    monkeypatch.setattr(build.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(build.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


def test_units_follow_the_idle_cpus_seen_since_the_compile_began(monkeypatch):
    _jiffies(monkeypatch, [(1000, 5000), (1090, 5200)])  # the other CPU 90% idle
    build.begin()
    assert build._idle_cpus() == 2
    _jiffies(monkeypatch, [(1000, 5000), (1010, 5200)])  # both busy: ours and another's
    build.begin()
    assert build._idle_cpus() == 1


def test_a_window_too_short_falls_back_to_the_load_average(monkeypatch):
    _jiffies(monkeypatch, [(1000, 5000), (1004, 5004)])
    monkeypatch.setattr(build.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    build.begin()
    assert build._idle_cpus() == 1
    _jiffies(monkeypatch, [None, None])
    monkeypatch.setattr(build.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    build.begin()  # no /proc/stat: no window
    assert build._idle_cpus() == 2


def test_a_build_never_waited_for_leaves_no_directory(tmp_path):
    import gc

    with config.patch(cache_dir=str(tmp_path)):
        pending = build.start(build.SPLIT.join(["// prelude", 'extern "C" void k() {}']))
    assert list(tmp_path.rglob("build-*"))
    del pending
    gc.collect()
    assert not list(tmp_path.rglob("build-*"))


def test_first_calls_from_two_threads_wait_for_one_build(tmp_path):
    import threading

    x = torch.randn(8, 5)
    with config.patch(cache_dir=str(tmp_path)):
        fn = _compile(x)
        outs = []
        threads = [threading.Thread(target=lambda: outs.append(fn(x))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(outs) == 2
    for out in outs:
        _same(out, _f(x))
    assert len(list(tmp_path.rglob("*.so"))) == 1  # built once, into the cache
