"""Faults around the backend: broken cache entries, unwritable or full cache directories,
another machine's kernels, and pipeline failures (fallback for users, an error under strict).

Each fault must end in a correct result (rebuilt, or compiled privately, or at worst run as
aten ops), never a crash or a wrong answer.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from ember import config
from ember.aot.program import trace_inference
from ember.backend import compile as backend_compile
from ember.backend.codegen import build, cache, target
from ember.backend.compile import compile_aten, stats
from ember.errors import BackendCompilerFailed
from tests.caching.procs import last_line, start


def _f(x):
    return torch.tanh(x) * 2 - x.sum(-1, keepdim=True)


def _compiled(x: torch.Tensor, fn=_f) -> tuple[torch.Tensor, torch.Tensor]:
    gm = trace_inference(torch.fx.symbolic_trace(fn), [x]).gm
    return compile_aten(gm, [x])(x)[0], fn(x)


def _check(x: torch.Tensor, fn=_f) -> None:
    got, want = _compiled(x, fn)
    torch.testing.assert_close(got, want)


LOAD = """
import torch
import ember.backend
from ember.backend.compile import stats
def f(x):
    return torch.tanh(x) * 2 - x.sum(-1, keepdim=True)
x = torch.randn(4, 6)
torch.testing.assert_close(torch.compile(f, backend=ember.backend, dynamic=False)(x), f(x))
print(stats["generated"], stats["graph_cache_hits"])
"""


def test_a_library_that_fails_to_load_is_rebuilt(tmp_path):
    assert last_line(start(LOAD, tmp_path)) == "1 0"
    (so,) = tmp_path.rglob("kernels/*/*.so")
    junk = b"not a shared object" * 10
    # a consistent but unloadable entry: its checksum matches, dlopen refuses it (written
    # beside and renamed, as ember writes: a library is never rewritten in place)
    so.with_suffix(".sha256").write_text(hashlib.sha256(junk).hexdigest())
    so.with_name("junk").write_bytes(junk)
    os.replace(so.with_name("junk"), so)
    assert last_line(start(LOAD, tmp_path)) == "0 1"  # the graph entry hit, its library rebuilt
    assert so.read_bytes() != junk
    assert last_line(start(LOAD, tmp_path)) == "0 1"


def test_a_graph_entry_with_valid_checksum_but_bad_content_is_a_miss(tmp_path):
    x = torch.randn(3, 5)
    with config.patch(cache_dir=str(tmp_path)):
        _check(x)
        (graph,) = tmp_path.rglob("graphs/*/*.json")
        for payload in (b'{"format": 1, "cpp": 3}', b"[1, 2]", b"\xff\xfe"):
            graph.write_bytes(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            before = stats["generated"]
            _check(x)
            assert stats["generated"] == before + 1


def test_an_unusable_cache_directory_compiles_privately(tmp_path):
    """The cache path lies under a regular file (mkdir fails even for root): kernels are
    built in a private temporary directory, the graph still compiles, nothing falls back."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    x = torch.randn(4, 4)
    with config.patch(cache_dir=str(blocker / "cache")):
        before = dict(stats)
        _check(x)
        assert stats["generated"] == before.get("generated", 0) + 1
        assert stats["graph_fallbacks"] == before.get("graph_fallbacks", 0)
        assert build.private_dir().exists()


def test_a_full_cache_directory_compiles_privately(tmp_path, monkeypatch):
    """Writes into the cache fail with ENOSPC (disk full): same outcome as unwritable."""
    real = build.atomic_write

    def full(path: Path, data: bytes) -> None:
        if str(path).startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(build, "atomic_write", full)
    monkeypatch.setattr(cache, "atomic_write", full)
    x = torch.randn(2, 9)
    with config.patch(cache_dir=str(tmp_path)):
        before = stats["graph_fallbacks"]
        _check(x)
        _check(x)
        assert stats["graph_fallbacks"] == before
        assert not list(tmp_path.rglob("*.json")) and not list(tmp_path.rglob("*.so"))


FULL_DISK = """
import resource, signal, tempfile, torch
import torch._inductor  # imported before the limit: its import looks for a writable temp dir
import ember.backend
from ember.backend.compile import stats
tempfile.gettempdir()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
def f(x):
    return torch.sigmoid(x) * x
x = torch.linspace(-3, 3, 40)
out = torch.compile(f, backend=ember.backend, dynamic=False)(x)
torch.testing.assert_close(out, f(x))
print("fallbacks", stats["graph_fallbacks"])
"""


def test_no_file_can_be_written_anywhere(tmp_path):
    """Every file write fails (cache and temp): the graph runs as aten ops, correctly."""
    assert last_line(start(FULL_DISK, tmp_path, EMBER_STRICT="0")) == "fallbacks 1"


def test_another_machines_kernels_are_never_loaded(tmp_path, monkeypatch):
    """Two machines share one cache directory: each gets its own graph and kernel entries,
    because the keys hold the resolved target, not the literal -march flag."""
    x = torch.randn(5, 3)
    with config.patch(cache_dir=str(tmp_path)):
        _check(x)
        mine = set(tmp_path.rglob("*.so")) | set(tmp_path.rglob("*.json"))
        assert len(mine) == 2
        here = target.identity(config.current().cpu_isa)
        other = here.replace("-march=", "-march=other-cpu ") + " -mavx512f"
        monkeypatch.setattr(target, "identity", lambda isa: other)
        build._compiler_id.cache_clear()
        before = stats["generated"]
        _check(x)
        assert stats["generated"] == before + 1  # nothing of the first machine was reused
        theirs = set(tmp_path.rglob("*.so")) | set(tmp_path.rglob("*.json"))
        assert len(theirs) == 4 and mine < theirs
        monkeypatch.undo()
        build._compiler_id.cache_clear()
        hits = stats["graph_cache_hits"]
        _check(x)  # back on the first machine: its own entries again
        assert stats["graph_cache_hits"] == hits + 1
    build._compiler_id.cache_clear()


def test_cache_keys_hold_the_resolved_target():
    # native explicitly: the backend tests' session-wide target may still be patched in
    with config.patch(cpu_isa="native"):
        native_id, native_key = build.compiler_id(), build.library_key("int x;")
    assert "-march=native" not in native_id and target.identity("native") in native_id
    for isa in target.available()[1:]:  # each lower target this machine has
        with config.patch(cpu_isa=isa):
            assert f"-march={target.march(isa)}" in build.compiler_id()
            assert build.library_key("int x;") != native_key


def test_an_unknown_or_foreign_target_is_a_clear_error():
    with pytest.raises(target.TargetError, match="EMBER_CPU_ISA=no-such-cpu"):
        target.check("no-such-cpu")
    lacking = [isa for isa in target.X86_LEVELS if not target.runs_here(isa)]
    for isa in lacking:
        with pytest.raises(target.TargetError, match="which this CPU lacks"):
            target.check(isa)


def _fail_scheduling(monkeypatch):
    def broken(g):
        raise RuntimeError("scheduler exploded")

    monkeypatch.setattr(backend_compile, "schedule", broken)


def test_a_failing_stage_runs_the_graph_as_aten_ops_for_users(tmp_path, monkeypatch, caplog):
    _fail_scheduling(monkeypatch)
    x = torch.randn(3, 3)
    with config.patch(cache_dir=str(tmp_path), strict=False):
        before = stats["graph_fallbacks"]
        with caplog.at_level(logging.DEBUG, logger="ember.kernels"):
            _check(x)
        assert stats["graph_fallbacks"] == before + 1
    assert backend_compile.fallbacks[-1].startswith("scheduling: RuntimeError: scheduler exploded")
    assert "failed in scheduling" in caplog.text and "aten.tanh" in caplog.text


def test_strict_mode_names_the_stage_and_shows_the_graph(tmp_path, monkeypatch):
    _fail_scheduling(monkeypatch)
    with config.patch(cache_dir=str(tmp_path), strict=True):
        with pytest.raises(BackendCompilerFailed) as info:
            _check(torch.randn(3, 3))
    text = str(info.value)
    assert info.value.stage == "scheduling" and "scheduler exploded" in text
    assert "aten.tanh" in text


def test_the_suite_runs_strict():
    assert config.current().strict


def test_graph_cache_format_is_checked(tmp_path):
    x = torch.randn(2, 2)
    with config.patch(cache_dir=str(tmp_path)):
        _check(x)
        (graph,) = tmp_path.rglob("graphs/*/*.json")
        data = json.loads(graph.read_bytes().partition(b"\n")[2])
        data["format"] = 999
        payload = json.dumps(data).encode()
        graph.write_bytes(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
        before = stats["generated"]
        _check(x)
        assert stats["generated"] == before + 1
