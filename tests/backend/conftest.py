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
from ember.backend.codegen import target


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
