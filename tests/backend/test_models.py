"""Whole blocks against eager: a transformer block, a small convnet, fallbacks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from tests.backend.helpers import check, extern_ops


class Block(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def test_transformer_block():
    torch.manual_seed(0)
    block = Block().eval()
    with torch.no_grad():
        check(block, torch.randn(2, 16, 64), atol=1e-4, rtol=1e-4)


def test_hand_written_attention():
    torch.manual_seed(0)

    def attn(q, k, v):
        s = (q @ k.transpose(-2, -1)) / 8.0
        mask = torch.ones(16, 16).tril().bool()
        s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, -1) @ v

    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    check(attn, q, k, v, atol=1e-5, rtol=1e-4)


def test_conv_net_uses_library_conv_and_fuses_the_rest():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    with torch.no_grad():
        (art,) = check(net, torch.randn(2, 3, 12, 12), atol=1e-5, rtol=1e-4)
    assert sum("convolution" in op for op in extern_ops(art)) == 2


def test_ops_without_lowering_fall_back_correctly():
    def f(x, idx):
        y = torch.cumsum(x, 0) * 2  # no lowering: aten fallback, then a fused kernel
        return torch.sort(y, -1).values, y[idx], torch.cat([x, y], 1)

    check(f, torch.randn(5, 6), torch.tensor([0, 3, 3]))


def test_input_mutation_and_aliasing_outputs():
    def f(x, y):
        y.add_(1)
        return x.t(), x * y

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    expected_y = y + 1
    from tests.backend.helpers import compile_ember

    out = compile_ember(f)(x, y)
    torch.testing.assert_close(y, expected_y)
    assert out[0].data_ptr() == x.data_ptr()  # eager's t() aliases x; so does ember's
    torch.testing.assert_close(out[1], x * expected_y)


def test_tensor_constants_in_the_graph():
    table = torch.tensor([1.0, -2.0, 3.0])

    def f(x):
        return torch.softmax(x * table, -1) + torch.tensor([0.5, 0.25, 0.125])

    check(f, torch.randn(4, 3))


@pytest.mark.parametrize("batch", [8, 4096])
def test_training_step_gradients_match_eager(batch):
    # batch 4096: the partitioner saves GELU's output (>= 256 KiB), so the forward kernel's
    # layer norm loops read again an erf the first loop computed for a graph output
    import copy

    from ember.backend.compile import record, stats

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    twin = copy.deepcopy(model)
    x = torch.randn(batch, 16)
    before = stats["graph_fallbacks"]
    from tests.backend.helpers import compile_ember

    with record() as arts:
        compile_ember(twin)(x).square().sum().backward()
    model(x).square().sum().backward()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    assert len(arts) == 2 and stats["graph_fallbacks"] == before  # forward and backward


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM], ids=lambda c: c.__name__)
def test_recurrent_batch_first_inference_and_gradients(cell):
    """eager's RNN ends with an in-place `transpose_` for batch_first: the stacked outputs'
    buffer keeps the layout the stack produced (it used to take the transposed one and the
    wrapper failed copying into it)."""
    import ember

    torch.manual_seed(0)
    ref = cell(16, 32, batch_first=True)
    mine = copy.deepcopy(ref)
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        check(lambda x: ref(x)[0], x, atol=1e-5, rtol=1e-4)
    ember.compile(lambda x: mine(x)[0])(x).square().sum().backward()
    ref(x)[0].square().sum().backward()
    for (name, p), q in zip(ref.named_parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)
