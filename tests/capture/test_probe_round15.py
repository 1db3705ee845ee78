"""Probe round of session 15 (issue 12): wrong answers, crashes and extra breaks found by
small programs, each compared with eager (values, types, identities, outside state, printed
text) and, where it matters, with Dynamo's counts on the same function (fidelity_harness).

The first group is the bug left open by session 13c: a method reached through `super()`
and called at a graph break was rebuilt by break code as `receiver.<name>`, which finds the
subclass's override: break code ran the override again in place of the base's method (an
optimizer subclass whose `_init_group` counts its calls, then calls SGD's, counted 2 per
step once torch had marked SGD's `_init_group` disable)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from fidelity_harness import check, tensors

import ember

# --- methods reached through super() or an alias, called at a break -----------------------


class _Base:
    @torch._dynamo.disable  # a break at the call, for ember and Dynamo alike
    def f(self, x):
        return x + 1


class _Sub(_Base):
    calls = 0

    def f(self, x):
        _Sub.calls += 1
        return super().f(x) * 2


def p_super_method_called_at_break(x, obj):
    return obj.f(x + 1) - 1


def test_super_method_called_at_break_runs_the_base_method_once():
    def reset():
        _Sub.calls = 0

    check(
        p_super_method_called_at_break,
        lambda: (torch.ones(2), _Sub()),
        state=lambda: _Sub.calls,
        reset=reset,
        compare_args=False,
    )


class CountingSGD(torch.optim.SGD):
    calls = 0

    def _init_group(self, *args, **kwargs):
        CountingSGD.calls += 1
        return super()._init_group(*args, **kwargs)


SGD_OPTIONS = {
    "plain": {},
    "momentum": {"momentum": 0.9},
    "foreach": {"foreach": True},
    "momentum_foreach": {"momentum": 0.9, "foreach": True},
}


def _sgd_run(options: dict, compiled: bool, steps: int = 3):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = CountingSGD(model.parameters(), lr=0.1, **options)
    CountingSGD.calls = 0

    def step(x):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    ember.reset()
    run = ember.compile(step) if compiled else step
    gen = torch.Generator().manual_seed(0)
    counts = []
    for _ in range(steps):
        run(torch.randn(5, 4, generator=gen))
        counts.append(CountingSGD.calls)
    return counts, copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())


@pytest.mark.parametrize("name", SGD_OPTIONS)
def test_sgd_subclass_init_group_counted_once_per_step(name):
    """torch.compile marks SGD's `_init_group` disable (TorchPatcher.patch, run by the
    first torch.compile in the process; called here so that the test does not depend on
    the order tests run in)."""
    import torch._dynamo.eval_frame

    torch._dynamo.eval_frame.TorchPatcher.patch()
    expected = _sgd_run(SGD_OPTIONS[name], compiled=False)
    actual = _sgd_run(SGD_OPTIONS[name], compiled=True)
    assert actual[0] == expected[0] == [1, 2, 3]
    torch.testing.assert_close(actual[1], expected[1])
    torch.testing.assert_close(actual[2], expected[2])


def test_sgd_subclass_super_init_group_runs_ahead():
    """`super()._init_group` of torch.optim's SGD in an override runs on the real optimizer
    while capturing, as `opt._init_group` does: no break more than plain SGD's step."""
    import torch._dynamo.eval_frame

    torch._dynamo.eval_frame.TorchPatcher.patch()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)

    def counts(opt_class):
        opt = opt_class(model.parameters(), lr=0.1, momentum=0.9)

        def step(x):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        def reset():
            CountingSGD.calls = 0
            opt.state.clear()

        return check(
            step,
            tensors((5, 4)),
            state=lambda: CountingSGD.calls,
            reset=reset,
            compare_args=False,
            dynamo=False,
        )

    assert counts(CountingSGD).breaks == counts(torch.optim.SGD).breaks
