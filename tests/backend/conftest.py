"""Backend tests share one kernel/graph cache per session so g++ runs once per distinct graph."""

from __future__ import annotations

import pytest
import torch

from ember import config


@pytest.fixture(autouse=True, scope="session")
def _shared_cache(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("ember_cache")
    with config.patch(cache_dir=str(path)):
        yield path


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
