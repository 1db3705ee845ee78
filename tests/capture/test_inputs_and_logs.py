"""Graph inputs as seed 000 describes them (registered on first use, named from the source
chain, deduplicated, unused ones dropped) and the log channels, including EMBER_LOGS in a
fresh interpreter."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import torch
from torch import nn

import ember
from ember.testing import CompileCounter, assert_same

SHARED = torch.randn(4)


def _placeholders(fn, *args):
    counter = CompileCounter()
    compiled = ember.compile(fn, backend=counter, fullgraph=True)
    for _ in range(2):
        assert_same(compiled(*args), fn(*args))
    assert counter.frame_count == 1
    return [n.target for n in counter.graphs[0].graph.nodes if n.op == "placeholder"]


def test_unused_arguments_are_not_inputs():
    def f(x, unused, also_unused=None):
        return x * 2, unused.shape[0]

    assert _placeholders(f, torch.randn(3), torch.randn(5), torch.randn(2)) == ["L_x_"]


def test_inputs_in_order_of_first_use():
    def f(a, b, c):
        return c + b * a

    assert _placeholders(f, torch.randn(2), torch.randn(2), torch.randn(2)) == [
        "L_c_",
        "L_b_",
        "L_a_",
    ]


def test_one_tensor_through_two_sources_is_one_input():
    def f(x, y, holder):
        return x + y + holder["t"] + SHARED

    x = torch.randn(4)
    names = _placeholders(f, x, x, {"t": SHARED})
    assert names == ["L_x_", "L_holder_t_"]


def test_module_parameter_names_follow_the_attribute_chain():
    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(2, 2)

        def forward(self, x):
            return self.proj(x)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Inner()])

        def forward(self, x):
            return self.blocks[0](x)

    mod = Outer()

    def f(x):
        return mod(x)

    names = _placeholders(f, torch.randn(2))
    assert names == [
        "L_x_",
        "L_mod_blocks_0_proj_weight_",
        "L_mod_blocks_0_proj_bias_",
    ]  # a free var


def test_bytecode_log_shows_original_and_replacement(caplog):
    def f(x):
        return x.cos() * 2

    ember.set_logs("bytecode")
    try:
        with caplog.at_level(logging.DEBUG, logger="ember"):
            ember.compile(f, backend="eager", fullgraph=True)(torch.randn(2))
    finally:
        ember.set_logs()
    text = caplog.text
    assert "ORIGINAL" in text and "REPLACEMENT" in text
    assert "LOAD_GLOBAL" in text and "__compiled_fn_" in text
    assert "BINARY_OP" in text  # the original's `* 2`


def test_ember_logs_environment_variable_prints_seed_graph():
    program = textwrap.dedent(
        """
        import torch, ember
        bias = torch.randn(4)
        def f(x, y):
            return (x @ y + bias).relu()
        ember.compile(f, backend="eager")(torch.randn(4, 4), torch.randn(4, 4))
        """
    )
    env = dict(os.environ, EMBER_LOGS="graph_code")
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    text = done.stderr
    assert 'L_x_: "f32[4, 4]", L_y_: "f32[4, 4]", G_bias_: "f32[4]"' in text
    assert "matmul" in text and "add" in text and "relu" in text
    assert "return (relu,)" in text
