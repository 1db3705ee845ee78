"""Backend tests share one kernel/graph cache per session so g++ runs once per distinct graph.

Every backend test runs once per CPU target this machine can execute (`native`, then each
lower x86-64 level: avx512, avx2, sse2), because the same C++ becomes different vector code
(and different special-value paths) per target. EMBER_TEST_ISAS=native,avx2 narrows the set.
The target fixture is package-scoped (this directory is a package for that reason), so the
tests of other directories run on the native target again.
"""

from __future__ import annotations

import os

import pytest
import torch

from ember import config
from ember.backend.codegen import target, wrapper


def _isas() -> list[str]:
    chosen = os.environ.get("EMBER_TEST_ISAS")
    if not chosen:
        return list(target.available())
    isas = [isa.strip() for isa in chosen.split(",") if isa.strip()]
    for isa in isas:
        target.check(isa)
    return isas


@pytest.fixture(autouse=True, scope="package", params=_isas(), ids=lambda isa: f"isa={isa}")
def cpu_isa(request: pytest.FixtureRequest, _shared_cache):
    with config.patch(cpu_isa=request.param):
        yield request.param


@pytest.fixture(autouse=True, scope="session")
def _shared_cache(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("ember_cache")
    with config.patch(cache_dir=str(path)):
        yield path


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


@pytest.fixture
def wrapper_calls(monkeypatch) -> dict:
    """Records what the wrappers compiled while the test runs ask of torch: the memory
    format of each convolution's input, and each layout copy `_fix` makes of a library
    result that came back in other strides than the kernels were generated for."""
    seen: dict = {"conv_inputs": [], "copies": 0}
    instantiate = wrapper.instantiate

    def conv(x, *args):
        cl = x.is_contiguous(memory_format=torch.channels_last)
        seen["conv_inputs"].append("channels_last" if cl else "nchw")
        return torch.convolution(x, *args)

    def fix(t, size, stride):
        out = wrapper._fix(t, size, stride)
        seen["copies"] += out.numel() > 1 and out.data_ptr() != t.data_ptr()
        return out

    def watched(source, kernels, constants, device=None):
        call = instantiate(source, kernels, constants, device)
        scope = call.__globals__
        for name in [n for n, op in scope.items() if op is torch.convolution]:
            scope[name] = conv
        scope["_fix"] = fix
        return call

    monkeypatch.setattr(wrapper, "instantiate", watched)
    return seen
