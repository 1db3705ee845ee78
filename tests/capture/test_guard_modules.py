"""The guard of a compiled module tree (a small conv net: nested Sequential, conv, batch norm,
a buffer) still refuses every change to the tree the trace relied on, with the hook tables
read from the instance dicts (guards.py `_no_hooks`): each test changes one thing on a deep
submodule and requires exactly one recompile (two calls after the change) and eager's
values, side effects on buffers included."""

from __future__ import annotations

import copy

import torch
from torch import nn

import ember
from ember.testing import CompileCounter, assert_same


class Scaled(nn.Module):
    """A buffer the forward multiplies by (its dtype and shape decide the result's)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, channels).view(channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.scaled = Scaled(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.scaled(self.bn(self.conv(x)))) + x


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Sequential(Block(4), Block(4)), nn.Flatten())
    net.eval()
    return net


def _check(change, captures: int = 2) -> None:
    """Compile a net and its eager twin, call both, `change(net)` on both, call again:
    eager's values and buffers every time, one capture before and one after the change
    (none where the changed value is a graph input that still fits: `captures=1`)."""
    net = _net()
    twin = copy.deepcopy(net)
    counter = CompileCounter()
    compiled = ember.compile(net, backend=counter)
    x = torch.randn(2, 3, 5, 5)

    def same() -> None:
        assert_same(compiled(x), twin(x))
        assert_same(dict(net.named_buffers()), dict(twin.named_buffers()))

    same()
    same()
    assert counter.frame_count == 1
    change(net)
    change(twin)
    same()
    same()
    assert counter.frame_count == captures


def _deep(net: nn.Module) -> Block:
    return net[1][1]


def test_forward_hook_on_deep_submodule_recompiles():
    _check(lambda n: _deep(n).bn.register_forward_hook(lambda m, a, out: out * 2))


def test_forward_pre_hook_on_deep_submodule_recompiles():
    _check(lambda n: _deep(n).conv.register_forward_pre_hook(lambda m, a: (a[0] + 1,)))


def test_global_forward_hook_recompiles():
    handle = None

    def change(n: nn.Module) -> None:
        nonlocal handle
        if handle is None:  # once for both nets: the table is global
            hook = lambda m, a, out: out + 1 if isinstance(m, Scaled) else None  # noqa: E731
            handle = nn.modules.module.register_module_forward_hook(hook)

    try:
        _check(change)
    finally:
        handle.remove()


def test_swapped_submodule_recompiles():
    def change(n: nn.Module) -> None:
        torch.manual_seed(1)
        _deep(n).conv = nn.Conv2d(4, 4, 3, padding=1, bias=True)

    _check(change)


def test_replaced_sequential_item_recompiles():
    _check(lambda n: n[1].__setitem__(0, nn.Identity()))


def test_training_flag_of_deep_batch_norm_recompiles():
    _check(lambda n: _deep(n).bn.train())


def test_replaced_parameter_is_read_not_recompiled():
    """A parameter is a graph input: a new one of the same kind is simply read."""

    def change(n: nn.Module) -> None:
        torch.manual_seed(2)
        _deep(n).conv.weight = nn.Parameter(torch.randn(4, 4, 3, 3))

    _check(change, captures=1)


def test_replaced_parameter_of_other_kind_recompiles():
    def change(n: nn.Module) -> None:
        torch.manual_seed(2)
        _deep(n).conv.weight = nn.Parameter(torch.randn(4, 4, 3, 3), requires_grad=False)

    _check(change)


def test_parameter_replaced_in_table_recompiles():
    """Written into `_parameters` directly, past Module.__setattr__."""

    def change(n: nn.Module) -> None:
        torch.manual_seed(3)
        _deep(n).conv._parameters["weight"] = nn.Parameter(torch.randn(4, 4, 3, 3))

    _check(change, captures=1)


def test_buffer_dtype_change_recompiles():
    _check(lambda n: setattr(_deep(n).scaled, "scale", _deep(n).scaled.scale.double()))


def test_buffer_shape_change_recompiles():
    _check(lambda n: setattr(_deep(n).scaled, "scale", torch.full((4, 1, 5), 0.5)))


def test_hook_table_replaced_in_instance_dict_recompiles():
    """The guard reads the hook tables as instance dict items: a table put there directly
    (not through register_*) is what it reads."""

    def change(n: nn.Module) -> None:
        tables = _deep(n).bn.__dict__
        tables["_forward_hooks"] = {0: lambda m, a, out: out - 1}

    _check(change)


def test_hook_table_property_added_to_class_recompiles():
    """A class that starts answering `_forward_hooks` itself (so the instance dict's table is
    no longer what nn.Module's call reads) is caught by the per-class checks."""

    class Hooked(Scaled):
        pass

    def make() -> nn.Module:
        net = _net()
        _deep(net).scaled.__class__ = Hooked
        return net

    net, twin = make(), make()
    twin.load_state_dict(net.state_dict())
    counter = CompileCounter()
    compiled = ember.compile(net, backend=counter)
    x = torch.randn(2, 3, 5, 5)
    assert_same(compiled(x), twin(x))
    assert counter.frame_count == 1
    Hooked._forward_hooks = property(lambda self: {0: lambda m, a, out: out * 3})
    try:
        assert_same(compiled(x), twin(x))
        assert_same(compiled(x), twin(x))
        assert counter.frame_count == 2
    finally:
        del Hooked._forward_hooks


class Gained(nn.Module):
    """A plain float attribute, read by the guard as an instance dict item."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


def _gained_check(change_class, undo) -> None:
    class Local(Gained):
        pass

    net = nn.Sequential(nn.Sequential(Local()))
    counter = CompileCounter()
    compiled = ember.compile(net, backend=counter)
    x = torch.randn(3)
    assert_same(compiled(x), net(x))
    assert_same(compiled(x), net(x))
    assert counter.frame_count == 1
    change_class(Local)
    try:
        assert_same(compiled(x), net(x))
        assert_same(compiled(x), net(x))
        assert counter.frame_count == 2
    finally:
        undo(Local)
    net[0][0].gain = 5.0  # the instance dict item itself
    assert_same(compiled(x), net(x))
    assert_same(compiled(x), net(x))


def test_property_shadowing_an_instance_attribute_recompiles():
    def add(cls: type) -> None:
        cls.gain = property(lambda self: 3.0)

    _gained_check(add, lambda cls: delattr(cls, "gain"))
