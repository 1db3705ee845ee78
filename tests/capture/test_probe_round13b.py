"""Probe round 13b (issue 12): nn.Module and training-loop idioms (parameter containers,
autocast queries, whole training steps with gradient clipping and loss scaling), each
compared with eager and with Dynamo's counts through fidelity_harness."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fidelity_harness import check, classification_batch, restoring, tensors
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

import ember
from ember import torch_compat
from ember.capture.values.builtins import BUILTINS


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


# wrong answers


def test_autocast_queries_answer_the_traced_modes():
    """The process's autocast is off while capturing; the answer is the trace's own."""
    lin = torch.nn.Linear(4, 4)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inside = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
            with torch.autocast("cpu", enabled=False):
                off = torch.is_autocast_enabled(device_type="cpu")
            cuda = torch.is_autocast_enabled()
            y = lin(x)
        return inside, off, cuda, y, torch.is_autocast_enabled("cpu")

    check(f, tensors((2, 4)))


def test_autocast_query_under_the_callers_autocast():
    def f(x):
        return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), x @ x.t()

    with torch.autocast("cpu", dtype=torch.bfloat16):
        check(f, tensors((2, 4)))
    check(f, tensors((2, 4)))


def test_grouping_tensors_by_device_and_dtype_gives_the_traced_tensors():
    """It ran on the capture's meta examples, and a dict of them reached the caller."""

    def f(x):
        return _group_tensors_by_device_and_dtype([[x, x.double(), x + 1], [None, x, None]], True)

    check(f, tensors((3,)))


def test_a_call_returning_tensors_in_a_dict_breaks(monkeypatch):
    """Without its own handler, a torch function whose result holds tensors in a dict is a
    break, never a constant of meta tensors."""
    monkeypatch.delitem(BUILTINS, torch_compat.group_tensors_by_device_and_dtype)

    def f(x):
        y = x + 1
        return _group_tensors_by_device_and_dtype([[y, x.double()]]), y * 2

    ember.reset()
    out, expected = ember.compile(f)(torch.ones(3)), f(torch.ones(3))
    torch.testing.assert_close(out, expected)
    assert any("inside a dict" in r for r in ember.stats()["break_reasons"])


# crashes


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_in_a_training_step(norm_type):
    model = _net()

    def step(x, y):
        F.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.05)
        return torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, norm_type=norm_type)

    check(step, classification_batch, **restoring(model))


def test_all_over_a_generator_made_after_a_break():
    """Manual loss scaling: `all(...)` of a generator expression in a resumed frame."""
    model = _net()

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        (loss * 1024.0).backward()
        for p in model.parameters():
            p.grad.div_(1024.0)
        return loss.detach(), all(torch.isfinite(p.grad).all() for p in model.parameters())

    check(step, classification_batch, **restoring(model))


PARAMS = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4)) for _ in range(3)])


def p_parameter_list_slices(x):
    acc = x * PARAMS[-1]
    for i, (p, q) in enumerate(zip(PARAMS, PARAMS[1:])):
        acc = acc + i * p * q
    return acc, [p.shape for p in PARAMS[::2]], len(PARAMS[1:])


def test_parameter_list_slices():
    check(p_parameter_list_slices, tensors((2, 4)))


HOOKED = torch.nn.Linear(4, 4)
CALLED: list[str] = []


def p_global_forward_hook_registered_in_the_trace(x):
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, a, o: CALLED.append(type(m).__name__)
    )
    try:
        return HOOKED(x)
    finally:
        handle.remove()


def p_module_hook_registered_and_removed_in_the_trace(x):
    handle = HOOKED.register_forward_hook(lambda m, a, o: o * 100)
    y = HOOKED(x)
    handle.remove()
    return y, HOOKED(x)


@pytest.mark.parametrize(
    "program",
    [
        p_global_forward_hook_registered_in_the_trace,
        p_module_hook_registered_and_removed_in_the_trace,
    ],
)
def test_hooks_registered_in_the_trace_run(program):
    """The real hook tables are unchanged until the graph has run: the traced ones tell."""
    check(program, tensors((2, 4)), reset=CALLED.clear, state=lambda: list(CALLED))


SEQ = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
ACTIVATIONS: dict[str, torch.Tensor] = {}
for _name, _child in SEQ.named_children():
    _child.register_forward_hook(
        lambda m, a, o, name=_name: ACTIVATIONS.__setitem__(name, o.detach())
    )


def p_hooks_record_activations_through_dict_dunders(x):
    out = SEQ(x)
    seen = ACTIVATIONS.__getitem__("0")
    ACTIVATIONS.__delitem__("1")
    return out, seen


def test_hooks_record_activations_through_dict_dunders():
    """`d.__setitem__` bound and called was a break per hook."""
    check(
        p_hooks_record_activations_through_dict_dunders,
        tensors((2, 4)),
        reset=ACTIVATIONS.clear,
        state=lambda: dict(ACTIVATIONS),
    )


class _Delegating(torch.nn.Module):
    """A wrapper whose `__getattr__` falls back to the wrapped module's attributes."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, x):
        return self.inner(x) + self.out_features


DELEGATING = _Delegating(torch.nn.Linear(4, 3))


def p_module_getattr_override_delegates(x):
    return DELEGATING(x), DELEGATING.in_features, DELEGATING.weight.shape


def test_module_getattr_override_is_inlined():
    """A module class's own `__getattr__` was never called: each miss was a break."""
    check(p_module_getattr_override_delegates, tensors((2, 4)))


# containers made in the trace and changed there


def p_sequential_built_by_add_module_and_append(x):
    seq = torch.nn.Sequential()
    seq.add_module("act", torch.nn.ReLU())
    seq.append(torch.nn.Tanh())
    return seq(x), len(seq)


def p_module_list_extend_insert_setitem(x):
    layers = torch.nn.ModuleList([torch.nn.ReLU()])
    layers.extend([torch.nn.Tanh(), torch.nn.Sigmoid()])
    layers.insert(0, torch.nn.Identity())
    layers[1] = torch.nn.Softsign()
    for layer in layers:
        x = layer(x)
    return x, [type(m).__name__ for m in layers]


def p_module_dict_update_setitem_delitem(x):
    blocks = torch.nn.ModuleDict({"a": torch.nn.ReLU()})
    blocks.update({"b": torch.nn.Tanh()})
    blocks["c"] = torch.nn.Sigmoid()
    del blocks["a"]
    for key in blocks:
        x = blocks[key](x)
    return x, list(blocks.keys())


@pytest.mark.parametrize(
    "program",
    [
        p_sequential_built_by_add_module_and_append,
        p_module_list_extend_insert_setitem,
        p_module_dict_update_setitem_delitem,
    ],
)
def test_containers_changed_in_the_trace(program):
    """What the trace added to `_modules` was dropped: the container ran as it was made."""
    check(program, tensors((2, 4)))


def test_a_changed_container_is_not_made_again_from_its_recipe():
    def f(x):
        seq = torch.nn.Sequential(torch.nn.Tanh())
        seq.append(torch.nn.ReLU())
        return seq(x), seq

    ember.reset()
    out, seq = ember.compile(f)(torch.ones(2))
    assert [type(m) for m in seq] == [torch.nn.Tanh, torch.nn.ReLU]


# training steps


WEIGHT = torch.nn.Parameter(torch.ones(3))


def _reset_weight_grad() -> None:
    WEIGHT.grad = torch.full((3,), 2.0)


def p_grad_assigned_and_read_back(x):
    before = WEIGHT.grad * 2
    WEIGHT.grad = None
    cleared = WEIGHT.grad is None
    WEIGHT.grad = x * 3
    WEIGHT.grad.add_(1)
    return cleared, WEIGHT.grad, before


def test_grad_assigned_in_the_trace():
    """`p.grad = ...` was a break at every assignment."""
    check(
        p_grad_assigned_and_read_back,
        tensors((3,)),
        reset=_reset_weight_grad,
        state=lambda: WEIGHT.grad,
    )


def test_manual_sgd_step_clears_grads():
    model = _net()

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None
        return loss.detach()

    check(step, classification_batch, **restoring(model))


def test_grad_of_another_size_is_eagers_error():
    def f(x):
        WEIGHT.grad = x
        return x

    ember.reset()
    with pytest.raises(RuntimeError, match="same size"):
        ember.compile(f)(torch.ones(2))


LINEAR = torch.nn.Linear(4, 4)


def p_local_function_decorated_with_no_grad(x):
    @torch.no_grad()
    def infer(t):
        return LINEAR(t)

    y = infer(x)
    return y.requires_grad, y, infer.__name__


def p_enable_grad_decorator_inside_no_grad(x):
    with torch.no_grad():

        @torch.enable_grad()
        def train(t):
            return LINEAR(t) * 2

        y = train(x)
        z = LINEAR(x)
    return y.requires_grad, z.requires_grad, y, z


@pytest.mark.parametrize(
    "program", [p_local_function_decorated_with_no_grad, p_enable_grad_decorator_inside_no_grad]
)
def test_grad_mode_decorator_on_a_local_function(program):
    """The decoration was a break (calling the context object)."""
    check(program, tensors((2, 4)))


def test_a_decorated_local_function_returned_is_torchs():
    def f(x):
        @torch.no_grad()
        def infer(t):
            return LINEAR(t)

        return infer

    ember.reset()
    infer = ember.compile(f)(torch.ones(2, 4))
    assert infer.__name__ == "infer" and not infer(torch.ones(2, 4)).requires_grad
