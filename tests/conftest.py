"""Suite-wide test settings.

Every test starts from empty ember caches, default logs, a fixed random seed and the grad mode
it found, so that each test's capture counts are its own. Hypothesis runs derandomized: the
property tests explore the same examples on every run, so a CI result does not depend on the
draw (set EMBER_HYPOTHESIS_RANDOM=1 to explore new examples).

EMBER_STRICT=1 (set here, before ember is imported, so processes the tests spawn inherit it)
makes a backend failure raise instead of running the graph as aten ops: a test cannot pass
on a silent fallback. Tests that mean to exercise the fallback turn it off explicitly.
"""

import os

os.environ.setdefault("EMBER_STRICT", "1")

import pytest
import torch
from hypothesis import settings

import ember

settings.register_profile("ember", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("explore" if os.environ.get("EMBER_HYPOTHESIS_RANDOM") else "ember")


@pytest.fixture(autouse=True)
def _fresh_capture_state():
    ember.reset()
    torch.manual_seed(0)
    grad_mode = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(grad_mode)
    ember.set_logs()
    ember.reset()
