"""The distributed tests share one pair of gloo worker processes (tests/distributed/pair.py),
started by the first test that needs it and stopped at the end of the session."""

import pytest
import torch.distributed
from pair import Pair


@pytest.fixture(scope="session")
def pair():
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    workers = Pair()
    yield workers
    workers.close()
