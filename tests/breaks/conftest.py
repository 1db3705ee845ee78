"""Break tests start from an empty cache, default logs and a fixed random seed, so that
each test's capture counts are its own."""

from __future__ import annotations

import pytest
import torch

import ember


@pytest.fixture(autouse=True)
def _fresh_capture_state():
    ember.reset()
    torch.manual_seed(0)
    grad_mode = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(grad_mode)
    ember.set_logs()
    ember.reset()
