"""The guard shortcuts (the entry that matched last tried first, attribute reads past a
Python `__getattribute__`, missing attributes checked as dict lookups, all parameters in one
C++ tensor check) still refuse every change they must catch: each test changes one thing
the trace relied on and requires exactly one recompile and eager's values, before and
after the change."""

from __future__ import annotations

import torch
from torch import nn

import ember
from ember.testing import CompileCounter, assert_same


def _compiled(fn):
    counter = CompileCounter()
    return ember.compile(fn, backend=counter), counter


def _same(fn, compiled, *args):
    assert_same(compiled(*args), fn(*args))


class Plain:
    def __init__(self) -> None:
        self.scale = 2.0


class Aliasing:
    """What transformers' PretrainedConfig does: a Python `__getattribute__` mapping names."""

    attribute_map = {"width": "hidden"}

    def __init__(self) -> None:
        self.hidden = 3
        self.flag = True

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def _uses_missing(x, obj):
    if hasattr(obj, "bias"):
        return x + obj.bias
    return x * obj.scale


def test_attribute_added_to_instance_recompiles():
    obj = Plain()
    compiled, counter = _compiled(_uses_missing)
    x = torch.randn(4)
    _same(_uses_missing, compiled, x, obj)
    _same(_uses_missing, compiled, x, obj)
    assert counter.frame_count == 1
    obj.bias = 5.0
    _same(_uses_missing, compiled, x, obj)
    assert counter.frame_count == 2
    del obj.bias
    _same(_uses_missing, compiled, x, obj)
    assert counter.frame_count == 2


def test_attribute_added_to_class_recompiles():
    class Local(Plain):
        pass

    obj = Local()
    compiled, counter = _compiled(_uses_missing)
    x = torch.randn(4)
    _same(_uses_missing, compiled, x, obj)
    Local.bias = 7.0
    _same(_uses_missing, compiled, x, obj)
    assert counter.frame_count == 2
    del Local.bias
    _same(_uses_missing, compiled, x, obj)
    assert counter.frame_count == 2


def test_getattr_hook_added_to_class_recompiles():
    class Local(Plain):
        pass

    obj = Local()
    compiled, counter = _compiled(_uses_missing)
    x = torch.randn(4)
    _same(_uses_missing, compiled, x, obj)
    Local.__getattr__ = lambda self, name: 1.5
    _same(_uses_missing, compiled, x, obj)
    assert counter.frame_count == 2


def test_attribute_removed_from_instance_recompiles():
    obj = Plain()
    obj.bias = 1.0
    compiled, counter = _compiled(_uses_missing)
    x = torch.randn(4)
    _same(_uses_missing, compiled, x, obj)
    del obj.bias
    _same(_uses_missing, compiled, x, obj)
    assert counter.frame_count == 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if hasattr(self, "extra"):
            extra = self.extra
            y = extra(y) if isinstance(extra, nn.Module) else y + extra
        return y


def test_module_attribute_added_as_buffer_parameter_submodule_or_plain():
    x = torch.randn(2, 4)
    for add in (
        lambda m: m.register_buffer("extra", torch.ones(4)),
        lambda m: m.register_parameter("extra", nn.Parameter(torch.ones(4))),
        lambda m: setattr(m, "extra", nn.Tanh()),
        lambda m: setattr(m, "extra", 3.0),
        lambda m: setattr(Block, "extra", 4.0),
    ):
        model = Block()
        compiled, counter = _compiled(model)
        with torch.no_grad():
            _same(model, compiled, x)
            _same(model, compiled, x)
            assert counter.frame_count == 1
            add(model)
            _same(model, compiled, x)
        assert counter.frame_count == 2
        if "extra" in Block.__dict__:
            del Block.extra


def _reads_config(x, config):
    if config.flag:
        return x * config.width
    return x - config.width


def test_config_attribute_changed_recompiles():
    config = Aliasing()
    compiled, counter = _compiled(_reads_config)
    x = torch.randn(3)
    _same(_reads_config, compiled, x, config)
    _same(_reads_config, compiled, x, config)
    assert counter.frame_count == 1
    config.hidden = 5  # read as `width` through the alias
    _same(_reads_config, compiled, x, config)
    assert counter.frame_count == 2
    config.flag = False
    _same(_reads_config, compiled, x, config)
    assert counter.frame_count == 3
    config.other = 7
    Aliasing.attribute_map = {"width": "other"}
    try:
        _same(_reads_config, compiled, x, config)
        assert counter.frame_count == 4
    finally:
        Aliasing.attribute_map = {"width": "hidden"}


def _config_missing(x, config):
    if hasattr(config, "extra"):
        return x + config.extra
    return x * config.width


def test_config_attribute_added_recompiles():
    config = Aliasing()
    compiled, counter = _compiled(_config_missing)
    x = torch.randn(3)
    _same(_config_missing, compiled, x, config)
    _same(_config_missing, compiled, x, config)
    config.extra = 2.0
    _same(_config_missing, compiled, x, config)
    assert counter.frame_count == 2
    del config.extra
    Aliasing.attribute_map = {"width": "hidden", "extra": "flag"}
    try:
        _same(_config_missing, compiled, x, config)
        assert counter.frame_count == 3
    finally:
        Aliasing.attribute_map = {"width": "hidden"}


def _caught(x, obj):
    try:
        return x + obj.bias
    except AttributeError:
        return x - 1


def test_attribute_error_caught_in_traced_code_is_guarded():
    obj = Plain()
    compiled, counter = _compiled(_caught)
    x = torch.randn(3)
    _same(_caught, compiled, x, obj)
    _same(_caught, compiled, x, obj)
    obj.bias = 10.0
    _same(_caught, compiled, x, obj)
    assert counter.frame_count == 2


def test_attribute_error_caught_on_a_module_is_guarded():
    class Net(nn.Module):
        def forward(self, x):
            try:
                return x + self.bias
            except AttributeError:
                return x - 1

    model = Net()
    compiled, counter = _compiled(model)
    x = torch.randn(3)
    _same(model, compiled, x)
    _same(model, compiled, x)
    model.bias = nn.Parameter(torch.ones(3))
    with torch.no_grad():
        _same(model, compiled, x)
    assert counter.frame_count == 2


def test_attribute_error_caught_on_a_function_is_guarded():
    def helper():
        return 1

    def f(x):
        try:
            return x + helper.bias
        except AttributeError:
            return x - 1

    compiled, counter = _compiled(f)
    x = torch.randn(3)
    _same(f, compiled, x)
    helper.bias = 4.0
    _same(f, compiled, x)
    assert counter.frame_count == 2


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_parameter_changes_recompile():
    x = torch.randn(3, 4)
    changes = (
        lambda m: setattr(m[0], "weight", nn.Parameter(torch.randn(8, 4))),  # replaced: same
        lambda m: m[2].weight.requires_grad_(False),
        lambda m: setattr(m[2], "bias", nn.Parameter(torch.randn(2, dtype=torch.float64))),
        lambda m: setattr(m[0], "bias", nn.Parameter(torch.randn(1))),
        lambda m: (delattr(m[0], "bias"), m[0].register_buffer("bias", torch.zeros(8))),
    )
    expected = (1, 2, 2, 2, 2)
    for change, frames in zip(changes, expected, strict=True):
        model = _net()
        compiled, counter = _compiled(model)
        _same(model, compiled, x)
        _same(model, compiled, x)
        change(model)
        try:
            want = model(x)
        except RuntimeError:
            continue  # the dtype change: eager refuses too
        assert_same(compiled(x), want)
        assert counter.frame_count == frames


def test_argument_dtype_and_shape_changes_recompile_and_entries_alternate():
    model = _net()
    compiled, counter = _compiled(model)
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    for x in (a, a, b, a, b, b, a):
        with torch.no_grad():
            _same(model, compiled, x)
    assert counter.frame_count <= 3  # a, then b (maybe dynamic), never again
    frames = counter.frame_count
    with torch.no_grad():
        _same(model, compiled, a.double().float())
    assert counter.frame_count == frames


def test_inference_mode_toggled():
    model = _net()
    compiled, counter = _compiled(model)
    x = torch.randn(3, 4)
    with torch.inference_mode():
        _same(model, compiled, x)
        _same(model, compiled, x)
    _same(model, compiled, x)
    with torch.inference_mode():
        out = compiled(x)
        assert out.is_inference()
        assert_same(out, model(x))
    out = compiled(x)
    assert not out.is_inference() and out.requires_grad
    assert counter.frame_count == 2


def test_requires_grad_of_argument_toggled():
    model = _net()
    compiled, counter = _compiled(model)
    x = torch.randn(3, 4)
    _same(model, compiled, x)
    xg = x.clone().requires_grad_()
    _same(model, compiled, xg)
    _same(model, compiled, x)
    assert counter.frame_count == 2
