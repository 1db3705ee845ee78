"""Issue 12's crashes and whole-frame fallbacks: slicing a Sequential and calling the slice,
indexing with a list and `**=` through ember's aot stage, forward hooks and pre-hooks traced
inline (never a silent eager run under fullgraph=True), modules made inside forward without
an identity guard (no recompile per call), and fullgraph=True raising at the recompile
limit instead of running eagerly."""

from __future__ import annotations

import collections

import pytest
import torch
from fidelity_harness import check, tensors
from torch import nn

import ember
from ember import BreakReason, Unsupported
from ember.testing import CompileCounter, assert_same

SEQ = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.Tanh())
LAYERS = nn.ModuleList([nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4)])


def p_sequential_slice_called(h):
    return SEQ[1:](SEQ[0](h)), SEQ[2:](SEQ[:2](h))


def p_sequential_slice_properties(h):
    tail = SEQ[1:]
    return (
        type(tail).__name__,
        len(tail),
        tail[0] is SEQ[1],
        tail[-1] is SEQ[3],
        list(tail._modules),
    )


def p_modulelist_slice_iterated(h):
    for layer in LAYERS[1:]:
        h = layer(h)
    return h, type(LAYERS[::2]).__name__, len(LAYERS[::2])


def p_module_made_in_forward(x, y):
    loss = nn.CrossEntropyLoss()
    act = nn.Sequential(nn.ReLU(), nn.Tanh())
    summed = nn.CrossEntropyLoss(reduction="sum", ignore_index=3)
    return loss(x, y), act(x), summed(x, y), summed


def _logits_and_labels():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=gen), torch.tensor([0, 3, 1])


@pytest.mark.parametrize(
    "fn", [p_sequential_slice_called, p_sequential_slice_properties, p_modulelist_slice_iterated]
)
def test_container_slices(fn):
    counts = check(fn, tensors((2, 4)))
    assert counts.graphs <= 1 and counts.breaks == 0


def test_module_made_in_forward_has_no_identity_guard():
    counts = check(p_module_made_in_forward, _logits_and_labels)
    assert counts.breaks == 0
    compiled = ember.compile(p_module_made_in_forward, backend="eager")
    for _ in range(5):
        compiled(*_logits_and_labels())
    assert ember.stats()["recompiles"] == 0


def p_module_containers_made_in_forward(x):
    """Containers of parameter-free modules made in forward, from a list or dict of them
    (`creating module ModuleList ... from values known only at run time` broke)."""
    layers = nn.ModuleList([nn.Identity(), nn.ReLU(), nn.Tanh()])
    for layer in reversed(layers):
        x = layer(x) * 2
    table = nn.ModuleDict({"act": nn.Sigmoid(), "out": nn.Softplus()})
    return table["out"](table["act"](x)), len(layers), list(table.keys())


def test_module_containers_made_in_forward():
    counts = check(p_module_containers_made_in_forward, tensors((2, 4)))
    assert counts.breaks == 0


def p_module_with_parameters_made_in_forward(x):
    return nn.Linear(4, 4)(x)


def test_module_with_parameters_made_in_forward_is_refused():
    with pytest.raises(Unsupported, match="parameters or buffers"):
        ember.compile(p_module_with_parameters_made_in_forward, fullgraph=True, backend="eager")(
            torch.randn(2, 4)
        )


def p_list_index(x):
    return x[[0, 2]] * 2, x[:, [1, 3]].sum(), x[[0, 2], 1]


def p_inplace_pow(x):
    z = x * 1
    z **= 2
    w = x + 1
    w **= 0.5
    return z, w, z is not w


def p_list_index_assignment(x):
    z = x.clone()
    z[[0, 2]] = 0.0
    return z


def _positive():
    return (torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) + 0.1,)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
@pytest.mark.parametrize("fn", [p_list_index, p_inplace_pow, p_list_index_assignment])
def test_aot_stage_crashes(fn, backend):
    counts = check(fn, _positive, backend=backend, fullgraph=True)
    assert counts.graphs == 1


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_aot_stage_gradients(backend):
    def loss(x):
        z = x * 1
        z **= 2
        return (z[[0, 2]] * x[[1, 2]]).sum()

    x = torch.rand(3, 4, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    loss(x_ref).backward()
    ember.compile(loss, backend=backend, fullgraph=True)(x).backward()
    assert_same(x.grad, x_ref.grad)


# forward hooks and pre-hooks


LOG: list = []


def _hooked() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    model[0].register_forward_hook(lambda mod, args, out: LOG.append("inner") or out + 1)
    model.register_forward_hook(lambda mod, args, out: LOG.append(("outer", len(args))))

    def kw_pre(mod, args, kwargs):
        LOG.append("kw pre")
        return args, kwargs

    def kw_post(mod, args, kwargs, out):
        return out - 1

    model[2].register_forward_pre_hook(kw_pre, with_kwargs=True)
    model[2].register_forward_hook(kw_post, with_kwargs=True)
    return model


def test_hooks_traced_inline():
    model = _hooked()
    counts = check(model, tensors((3, 4)), state=lambda: list(LOG), reset=LOG.clear)
    assert counts.graphs == 1 and counts.breaks == 0


def test_hooks_under_fullgraph_never_run_eagerly():
    model = _hooked()
    counter = CompileCounter()
    compiled = ember.compile(model, backend=counter, fullgraph=True)
    x = torch.randn(3, 4)
    LOG.clear()
    expected = model(x)
    eager_log = list(LOG)
    LOG.clear()
    assert_same(compiled(x), expected)
    assert LOG == eager_log
    assert counter.frame_count == 1


def test_hooks_added_and_removed_recompile():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    counter = CompileCounter()
    compiled = ember.compile(model, backend=counter)
    x = torch.randn(2, 4)
    assert_same(compiled(x), model(x))
    handle = model.register_forward_hook(lambda mod, args, out: out * 3)
    assert_same(compiled(x), model(x))
    handle.remove()
    assert_same(compiled(x), model(x))
    assert counter.frame_count == 2  # without hooks, with one; the first entry serves again
    global_handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: o + 5)
    try:
        assert_same(compiled(x), model(x))
    finally:
        global_handle.remove()
    assert_same(compiled(x), model(x))


def test_backward_hooks_are_refused_with_a_reason():
    model = nn.Linear(4, 4)
    model.register_full_backward_hook(lambda mod, gin, gout: None)
    with pytest.raises(Unsupported, match="backward hooks"):
        ember.compile(model, backend="eager", fullgraph=True)(torch.randn(2, 4))
    x = torch.randn(2, 4, requires_grad=True)
    assert_same(ember.compile(model, backend="eager")(x), model(x))


def test_fullgraph_raises_at_the_recompile_limit():
    def f(x, n):
        return x * n

    # dynamic=False: automatic dynamic would make n a size symbol and compile only twice
    compiled = ember.compile(f, backend="eager", fullgraph=True, dynamic=False)
    with ember.config.patch(recompile_limit=2):
        compiled(torch.ones(2), 1)
        compiled(torch.ones(2), 2)
        with pytest.raises(Unsupported) as info:
            compiled(torch.ones(2), 3)
    assert info.value.reason is BreakReason.RECOMPILE_LIMIT
    assert ember.stats()["eager_frames"] == 0


def p_autograd_grad_inside(x):
    w = LAYERS[0].weight
    y = (LAYERS[0](x) * 2).sum()
    (gw,) = torch.autograd.grad(y, w)
    return gw * 3, y.detach()


def p_autograd_backward_inside(x):
    x = x.detach().requires_grad_()
    y = (x.sin() * 2).sum()
    torch.autograd.backward(y)
    return x.grad * 3


@pytest.mark.parametrize(
    "fn", [p_autograd_grad_inside, p_autograd_backward_inside], ids=lambda f: f.__name__[2:]
)
def test_autograd_engine_calls_break_and_run_in_python(fn):
    """`torch.autograd.grad`/`backward` inside a compiled function: ember traced into them
    and on into torch.overrides' mode stack juggling, then raised "trying to pop from empty
    mode stack". They break and run in Python, as under Dynamo."""
    LAYERS.zero_grad()
    counts = check(fn, tensors((2, 4)))
    assert counts.eager_frames == 0


def test_an_optimizer_step_inside_runs_no_frame_eagerly():
    """`opt.step()` inside a compiled function: its `record_function` block (the profiler's
    `with torch._C.DisableTorchFunctionSubclass()`) made a resume function run eagerly.
    A profiler range opened in traced code is now a no-op context (as under torch.compile);
    the steps equal eager's (tests/capture/test_optimizer_steps.py counts the graphs)."""

    def make():
        torch.manual_seed(0)
        net = nn.Linear(4, 3)
        return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def step(net, opt, x):
        opt.zero_grad()
        loss = net(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    ember.reset()
    (net, opt), (net_c, opt_c) = make(), make()
    compiled = ember.compile(step)
    x = torch.randn(5, 4)
    for _ in range(3):
        assert_same(compiled(net_c, opt_c, x), step(net, opt, x), rtol=1e-5, atol=1e-6)
    assert_same(net_c.weight, net.weight, rtol=1e-5, atol=1e-6)
    assert ember.stats()["eager_frames"] == 0


def p_generator_made_in_the_trace(x):
    gen = torch.Generator().manual_seed(3)
    return x + torch.randn(3, generator=gen), gen.initial_seed()


def test_a_generator_made_in_the_trace_breaks_where_dynamo_does():
    """Making the generator, calling its method, and the op that takes it: one break each,
    as Dynamo takes them (loading `gen.manual_seed` broke once more, before the call)."""
    check(p_generator_made_in_the_trace, tensors((3,)))  # breaks no more than Dynamo's
    reasons = ember.stats()["break_reasons"]
    assert not any("attribute 'manual_seed'" in r for r in reasons), reasons


def p_state_dict_in_forward(x):
    sd = STATE_OWNER.state_dict()
    return x * len(sd) + sd["0.weight"].sum(), list(sd), dict(sd._metadata)


STATE_OWNER = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))


def test_state_dict_inside_a_compiled_function():
    """`state_dict()` sets `_metadata` on the OrderedDict it makes: 3 breaks before (an
    attribute on a dict made in the trace), none now, as under Dynamo; its tensors are
    the parameters' storage, as eager's."""
    counts = check(p_state_dict_in_forward, tensors((3,)))
    assert counts.breaks == 0
    sd = ember.compile(lambda: STATE_OWNER.state_dict())()
    assert (
        type(sd) is collections.OrderedDict and sd._metadata == STATE_OWNER.state_dict()._metadata
    )
    assert sd["0.weight"].data_ptr() == STATE_OWNER[0].weight.data_ptr()
