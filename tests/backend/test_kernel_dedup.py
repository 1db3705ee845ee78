"""Kernels repeated under other names are compiled once (codegen/dedup.py): a repeat is an
ELF alias of the first kernel with the same code, called by its own name and arguments.
Checked against eager, static and with symbolic sizes; kernel counts are unchanged."""

from __future__ import annotations

import re

import pytest
import torch

import ember.backend
from ember.backend.codegen import dedup
from ember.backend.compile import record, stats
from tests.backend.helpers import check, kernel_count

pytestmark = pytest.mark.skipif(not dedup.ENABLED, reason="ELF aliases (Linux) only")


def _definitions(cpp: str) -> list[str]:
    return re.findall(r'^extern "C" void (kernel\d+)\(.*\) \{$', cpp, re.M)


def _aliases(cpp: str) -> dict[str, str]:
    found = re.findall(r'^extern "C" void (kernel\d+)\(.*alias\("(kernel\d+)"\)\)\);$', cpp, re.M)
    return dict(found)


def _two_layers(x, w1, w2, b1, b2):
    """Two layers of the same shape: their bias + gelu kernels differ only in buffers."""
    h = torch.nn.functional.gelu(x @ w1 + b1)
    return torch.nn.functional.gelu(h @ w2 + b2)


def _inputs(n: int, d: int = 64) -> tuple:
    return (
        torch.randn(n, d),
        *(torch.randn(d, d) for _ in range(2)),
        torch.randn(d),
        torch.randn(d),
    )


def test_repeated_layer_kernel_is_an_alias_and_matches_eager():
    (art,) = check(_two_layers, *_inputs(33))
    aliases = _aliases(art.cpp)
    assert aliases, art.cpp
    defined = _definitions(art.cpp)
    assert set(aliases.values()) <= set(defined)
    assert not set(aliases) & set(defined)
    assert kernel_count(art) == len(defined) + len(aliases) == len(art.kernels)


@torch.no_grad()
def test_aliases_with_symbolic_sizes_over_many_sizes():
    torch._dynamo.reset()
    stats.clear()
    compiled = torch.compile(_two_layers, backend=ember.backend, dynamic=True)
    with record() as arts:
        for n in (3, 17, 64, 5):
            args = _inputs(n)
            torch.testing.assert_close(compiled(*args), _two_layers(*args), atol=1e-5, rtol=1e-5)
    assert stats["graph_fallbacks"] == 0
    (art,) = arts
    assert "const int64_t s" in art.cpp and _aliases(art.cpp)


def test_independent_repeats_on_graph_inputs():
    """The same reduction on two pairs of inputs: the second kernel is the first's alias,
    called with its own inputs and output."""

    def fn(a, b, c, d):
        return (a.exp() + b).sum(-1), (c.exp() + d).sum(-1)

    (art,) = check(fn, *(torch.randn(8, 100) for _ in range(4)))
    assert list(_aliases(art.cpp).items()) == [("kernel1", "kernel0")]


SOURCE = 'extern "C" void {name}({sig}) {{\n  {body}\n}}'


def _kernel(name: str, sig: str, body: str) -> str:
    return SOURCE.format(name=name, sig=sig, body=body)


def test_shape_renames_locals_consistently_and_nothing_else():
    sig = "const float* __restrict__ {a}, const float* __restrict__ {b}, float* {c}"
    body = "float acc_{c}[16]; {c}[0] = {a}[0] - {b}[0] * ((float)0x1.8p+3);"
    one = _kernel(
        "kernel1", sig.format(a="in0", b="buf1", c="buf2"), body.format(a="in0", b="buf1", c="buf2")
    )
    two = _kernel(
        "kernel7", sig.format(a="in3", b="buf5", c="buf9"), body.format(a="in3", b="buf5", c="buf9")
    )
    names = ["in0", "buf1", "buf2", "in3", "buf5", "buf9"]
    assert dedup.shape_of("kernel1", one, names) == dedup.shape_of("kernel7", two, names)
    # the same body with the parameters in the other order computes b - a from (a, b)
    swapped = _kernel(
        "kernel7", sig.format(a="buf5", b="in3", c="buf9"), body.format(a="in3", b="buf5", c="buf9")
    )
    assert dedup.shape_of("kernel1", one, names) != dedup.shape_of("kernel7", swapped, names)
    # another constant, another kernel
    other = two.replace("0x1.8p+3", "0x1.8p+4")
    assert dedup.shape_of("kernel1", one, names) != dedup.shape_of("kernel7", other, names)
    # a size symbol renamed like a buffer; prelude functions and loop variables kept
    s1 = _kernel("kernel2", "const float* in0, const int64_t s0", "ember_expf(in0[x0 + s0]);")
    s2 = _kernel("kernel3", "const float* in1, const int64_t s4", "ember_expf(in1[x0 + s4]);")
    assert dedup.shape_of("kernel2", s1, ["in0", "s0"]) == dedup.shape_of(
        "kernel3", s2, ["in1", "s4"]
    )
    assert "ember_expf" in dedup.shape_of("kernel2", s1, ["in0", "s0"])


def test_merge_puts_an_alias_in_its_targets_unit():
    body = "{o}[0] = {i}[0];"
    kernels = [
        (
            "kernel0",
            _kernel("kernel0", "const float* in0, float* buf1", body.format(i="in0", o="buf1")),
            ["in0", "buf1"],
        ),
        (
            "kernel1",
            _kernel("kernel1", "const float* buf1, float* buf2", "buf2[0] = -buf1[0];"),
            ["buf1", "buf2"],
        ),
        (
            "kernel2",
            _kernel("kernel2", "const float* buf2, float* buf3", body.format(i="buf2", o="buf3")),
            ["buf2", "buf3"],
        ),
    ]
    units = dedup.merge(kernels, ["in0", "buf1", "buf2", "buf3"])
    assert len(units) == 2
    assert units[0].endswith(
        'extern "C" void kernel2(const float* buf2, float* buf3) __attribute__((alias("kernel0")));'
    )
    assert units[1] == kernels[1][1]
