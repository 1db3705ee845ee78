"""Triton tests: CPU graphs compiled by the Triton code generator and run under Triton's
interpreter (config.triton_interpret, i.e. EMBER_TRITON_INTERPRET=1), differential against
eager. The interpreter runs each program of a kernel in Python over numpy tiles, so tensors
here are small; the same kernels run compiled on a GPU (bench/gpu.py)."""

from __future__ import annotations

import pytest
import torch

from ember import config

pytest.importorskip("triton", reason="the Triton tests need triton (pip install -e '.[test]')")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # the interpreter evaluates tiles with numpy, which warns where IEEE gives NaN or Inf
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("ignore::RuntimeWarning"))


@pytest.fixture(autouse=True, scope="package")  # undone after this directory's tests
def _interpreted(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("ember_triton_cache")
    with config.patch(cache_dir=str(path), triton_interpret=True):
        yield path


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
