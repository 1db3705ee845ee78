"""nll_loss forward and backward lowered (lowering/losses.py): values and gradients as
eager's for each reduction, ignore_index (also every target ignored: eager's NaN mean),
1-d and 2-d inputs and the float dtypes; the fallbacks that stay (class weights, an input
over the forward's element limit); and a conv classifier's SGD steps against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ember.backend.compile import record
from ember.backend.lowering import losses
from tests.backend.helpers import check, compile_ember, extern_ops

TARGETS = {
    "2d": ((5, 7), [1, -100, 6, 0, 3]),
    "2d_all_ignored": ((3, 4), [-100, -100, -100]),
    "2d_repeated": ((4, 3), [2, 2, 0, 2]),
    "1d": ((6,), 4),
    "1d_ignored": ((6,), -100),
}


def _nll_calls(arts: list) -> list[str]:
    return [op for art in arts for op in extern_ops(art) if "nll_loss" in op]


def _only_the_target_check(art) -> bool:
    """The wrapper calls nothing but ember's target check (no aten op)."""
    return [op.rsplit(".", 1)[-1] for op in extern_ops(art)] == ["raise_out_of_bounds"]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", list(TARGETS))
@pytest.mark.parametrize("ignore_index", [-100, 0])
def test_cross_entropy_values_and_gradients(case, reduction, ignore_index):
    shape, target = TARGETS[case]
    t = torch.tensor(target)
    if ignore_index != -100:
        t = t.clamp(min=0)  # -100 is out of range unless ignored
    x = torch.randn(*shape, dtype=torch.float64) * 3

    def f(x, t):
        return F.cross_entropy(x * 2, t, reduction=reduction, ignore_index=ignore_index)

    xe = x.clone().requires_grad_(True)
    xc = x.clone().requires_grad_(True)
    expected = f(xe, t)
    (expected * torch.linspace(0.5, 1.5, expected.numel()).view_as(expected)).sum().backward()
    with record() as arts:
        got = compile_ember(f)(xc, t)
        (got * torch.linspace(0.5, 1.5, got.numel()).view_as(got)).sum().backward()
    torch.testing.assert_close(got, expected, equal_nan=True)
    torch.testing.assert_close(xc.grad, xe.grad, equal_nan=True)
    assert _nll_calls(arts) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_aten_nll_loss_ops_lowered(dtype):
    """The two aten ops as the joint graph holds them (the total weight is the forward's
    second output and the backward's last input), in each float dtype."""
    x = torch.randn(8, 5).log_softmax(1).to(dtype)
    t = torch.tensor([0, 4, -100, 2, 2, 1, 3, 0])
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype != torch.float32 else {}
    for reduction in (0, 1, 2):
        (art,) = check(
            lambda x, t, r=reduction: torch.ops.aten.nll_loss_forward(x, t, None, r, -100),
            x,
            t,
            **tol,
        )
        assert _only_the_target_check(art)
        g = torch.randn(8 if reduction == 0 else (), dtype=dtype)
        w = torch.tensor(7.0, dtype=dtype)
        (art,) = check(
            lambda g, x, t, w, r=reduction: torch.ops.aten.nll_loss_backward(
                g, x, t, None, r, -100, w
            ),
            g,
            x,
            t,
            w,
            **tol,
        )
        assert _only_the_target_check(art)


def test_fallbacks_that_stay():
    """Class weights, and a forward over more than FORWARD_LIMIT elements (a vocabulary's
    logits: the masked sum would read them all where eager reads one per row), keep the aten
    op, with eager's values."""
    x = torch.randn(6, 4).log_softmax(1)
    t = torch.tensor([0, 3, 1, 1, 2, 0])
    w = torch.rand(4)
    (art,) = check(lambda x, t, w: torch.ops.aten.nll_loss_forward(x, t, w, 1, -100), x, t, w)
    assert any("nll_loss_forward" in op for op in extern_ops(art))
    rows = losses.FORWARD_LIMIT // 512 + 1
    big = torch.randn(rows, 512).log_softmax(1)
    tb = torch.randint(0, 512, (rows,))
    (art,) = check(lambda x, t: torch.ops.aten.nll_loss_forward(x, t, None, 1, -100), big, tb)
    assert any("nll_loss_forward" in op for op in extern_ops(art))


class _Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x, labels):
        h = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return F.cross_entropy(self.head(h), labels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_classifier_sgd_steps_match_eager(dtype):
    """Three SGD steps of a conv classifier ending in cross entropy: losses, gradients,
    parameters and running statistics as eager's, no nll_loss call left."""
    torch.manual_seed(0)
    eager = _Classifier().to(dtype)
    model = _Classifier().to(dtype)
    model.load_state_dict(eager.state_dict())
    compiled = compile_ember(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    x = torch.randn(4, 3, 6, 6, dtype=dtype)
    labels = torch.tensor([0, 4, 2, 2])
    with record() as arts:
        for _ in range(3):
            expected = eager(x, labels)
            got = compiled(x, labels)
            torch.testing.assert_close(got, expected)
            expected.backward()
            got.backward()
            for (name, a), b in zip(model.named_parameters(), eager.parameters(), strict=True):
                torch.testing.assert_close(a.grad, b.grad, msg=name)
            for opt in opts:
                opt.step()
                opt.zero_grad()
    for a, b in zip(model.state_dict().values(), eager.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    assert _nll_calls(arts) == []


@pytest.mark.parametrize(
    ("shape", "target", "reduction"),
    [
        ((3, 4), [0, 5, 1], "mean"),
        ((3, 4), [0, -3, 1], "sum"),
        ((3, 4), [2, 1, -7], "none"),
        ((4,), 9, "mean"),
    ],
)
def test_target_out_of_bounds_raises_eagers_error(shape, target, reduction):
    """A target outside [0, C) that is not ignored raises eager's IndexError, naming it, from
    the lowered forward; in-range targets through the same compiled graph run on."""
    x = torch.randn(*shape).log_softmax(-1)
    t = torch.tensor(target)

    def f(x, t):
        return F.nll_loss(x, t, reduction=reduction)

    with pytest.raises(IndexError) as expected:
        f(x, t)
    compiled = compile_ember(f)
    with record() as arts:
        with pytest.raises(IndexError, match=f"^{expected.value}$"):
            compiled(x, t)
    assert _nll_calls(arts) == []
    fine = t.clamp(0, shape[-1] - 1)
    torch.testing.assert_close(compiled(x, fine), f(x, fine))


def test_backward_alone_checks_its_targets():
    """The lowered backward, called without the forward that would have checked its targets,
    raises as eager's does."""
    x = torch.randn(3, 4).log_softmax(-1)

    def backward(g, x, t):
        return torch.ops.aten.nll_loss_backward(g, x, t, None, 1, -100, torch.tensor(3.0))

    compiled = compile_ember(backward)
    g = torch.tensor(1.0)
    for t in ([0, 4, 1], [0, 3, -100]):
        t = torch.tensor(t)
        try:
            expected = backward(g, x, t)
        except IndexError:
            with pytest.raises(IndexError):
                compiled(g, x, t)
            continue
        torch.testing.assert_close(compiled(g, x, t), expected)
