"""A second module for the capture tests: its globals are read by functions inlined into a
compiled function of another module (foreign globals)."""

from __future__ import annotations

import torch

FACTOR = 3
OFFSET = torch.ones(4)


def scale(x):
    return x * FACTOR + OFFSET
