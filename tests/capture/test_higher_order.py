"""Issue 17: higher-order ops captured as one graph node each, their functions as bodies of
their own (torch.utils.checkpoint in both use_reentrant modes, torch.cond), compared with
eager (outputs and gradients) and with Dynamo's capture (graphs and breaks); functions that
cannot be bodies (side effects, disabled calls, in-place writes to their inputs) fall back to
a graph break with the reason, and the program still does what it does eagerly."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from fidelity_harness import check, leaf_tensors, tensors, train_check
from torch.utils.checkpoint import checkpoint

import ember
from ember import BreakReason, Unsupported
from ember.testing import CountingBackend, assert_same

OUTSIDE: list = []


def _body(x, w):
    return torch.relu(x @ w).sin()


def p_checkpoint(x, w):
    return checkpoint(_body, x, w, use_reentrant=False).sum(dim=0) * 2


def p_checkpoint_reentrant(x, w):
    return checkpoint(_body, x, w, use_reentrant=True).cos()


def p_checkpoint_kwargs_and_tuple(x, w):
    def body(a, *, scale):
        return a.sin() * scale, None, (a @ w).tanh()

    first, nothing, second = checkpoint(body, x, use_reentrant=False, scale=3.0)
    assert nothing is None
    return first + second


def p_checkpoint_returns_its_input(x, w):
    same, y = checkpoint(lambda a, b: (a, a * b), x, w, use_reentrant=False)
    return same is x, y


def p_nested_checkpoint(x, w):
    def outer(a):
        return checkpoint(_body, a, w, use_reentrant=False) + a

    return checkpoint(outer, x, use_reentrant=False)


@pytest.mark.parametrize(
    "fn",
    [
        p_checkpoint,
        p_checkpoint_reentrant,
        p_checkpoint_kwargs_and_tuple,
        p_checkpoint_returns_its_input,
        p_nested_checkpoint,
    ],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
def test_checkpoint_is_one_node(fn, backend):
    counts = train_check(fn, leaf_tensors((4, 4), (4, 4)), backend=backend)
    assert (counts.graphs, counts.breaks) == (1, 0)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Stack(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.reentrant = reentrant

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return x


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
def test_checkpointed_modules(reentrant, backend):
    """checkpoint(self.block, x): parameters read in the body become operands."""
    model = Stack(reentrant)
    counts = train_check(
        model, leaf_tensors((2, 5, 8)), backend=backend, params=list(model.parameters())
    )
    assert (counts.graphs, counts.breaks) == (1, 0)


def test_reentrant_without_grad_inputs_gives_parameters_no_gradient():
    """Eagerly, the reentrant form runs under no_grad when no tensor argument needs a
    gradient: the parameters get none, and the output needs none."""
    model = Stack(reentrant=True)
    counts = train_check(
        lambda x: model(x).detach().requires_grad_(),
        leaf_tensors((2, 5, 8), grad=(False,)),
        params=list(model.parameters()),
        dynamo=False,
    )
    assert counts.graphs == 1
    assert all(p.grad is None for p in model.parameters())


def test_checkpoint_under_no_grad_just_calls_the_function():
    counter = CountingBackend("eager")
    fn = ember.compile(p_checkpoint, backend=counter)
    x, w = leaf_tensors((4, 4), (4, 4))()
    with torch.no_grad():
        assert_same(fn(x, w), p_checkpoint(x, w))
    (gm,) = counter.graphs
    assert not dict(gm.named_children())  # no body: the function's ops are in the graph


def _dropout_body(x, w):
    return torch.nn.functional.dropout(x @ w, 0.5, training=True).sin()


def p_checkpoint_dropout(x, w):
    return checkpoint(_dropout_body, x, w, use_reentrant=False)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
def test_checkpoint_with_dropout_recomputes_the_same_mask(backend):
    """The backward sees the forward's dropout mask (PyTorch's own eager kernel of
    tag_activation_checkpoint does not restore the random state: Dynamo's 'eager' backend
    gets other gradients here)."""
    train_check(p_checkpoint_dropout, leaf_tensors((8, 8), (8, 8)), backend=backend, dynamo=False)


def _appends(x):
    OUTSIDE.append(1)
    return x.sin()


def _writes_input(x):
    x.mul_(2)
    return x.sin()


@torch.compiler.disable
def _disabled(x):
    return x * 2


def _calls_disabled(x):
    return _disabled(x).sin()


def p_side_effect_body(x):
    return checkpoint(_appends, x * 1, use_reentrant=False)


def p_inplace_body(x):
    return checkpoint(_writes_input, x * 1, use_reentrant=False)


def p_disabled_body(x):
    return checkpoint(_calls_disabled, x + 1, use_reentrant=False).cos()


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (p_side_effect_body, "changes list"),
        (p_inplace_body, "writes in place"),
        (p_disabled_body, "disable"),
    ],
    ids=["side_effect", "inplace_input", "disabled_call"],
)
def test_bodies_that_cannot_be_one_node_break_with_the_reason(fn, why):
    """The call runs in Python (eager's checkpoint) at a graph break; the rest is captured.
    (Dynamo captures the in-place write to the body's input; eagerly, the backward of such a
    checkpoint raises, as it does under ember, which runs it in Python.)"""
    OUTSIDE.clear()
    counts = check(
        fn,
        tensors((4,)),
        state=lambda: list(OUTSIDE),
        reset=OUTSIDE.clear,
        dynamo=fn is not p_inplace_body,
    )
    assert counts.breaks == 1 and counts.graphs >= 1
    reasons = ember.stats()["break_reasons"]
    assert any("checkpoint cannot be captured as one graph node" in r for r in reasons), reasons
    assert any(why in r for r in reasons), reasons
    with pytest.raises(Unsupported) as info:
        ember.compile(fn, backend="eager", fullgraph=True)(torch.randn(4))
    assert info.value.reason is BreakReason.HIGHER_ORDER_OP
    assert "test_higher_order.py" in info.value.location


def p_cond(x, w):
    return torch.cond(x.sum() > 0, lambda a, b: (a @ b).sin(), lambda a, b: a.cos() * 2, (x, w))


def p_cond_closure_and_tuple(x, w):
    def true_fn(a):
        return a.clone(), (a @ w).relu()

    def false_fn(a):
        return a * 2, a + w

    first, second = torch.cond(x.mean() < 0, true_fn, false_fn, (x,))
    return first.sum() + second


def p_cond_constant_pred(x, w):
    return torch.cond(x.shape[0] == 4, lambda a: a.sin(), lambda a: a.cos(), (x,))


@pytest.mark.parametrize(
    "fn",
    [p_cond, p_cond_closure_and_tuple, p_cond_constant_pred],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_is_one_node(fn, backend, sign):
    def make():
        x, w = leaf_tensors((4, 4), (4, 4))()
        with torch.no_grad():
            x.abs_().mul_(sign)
        return x, w

    counts = train_check(fn, make, backend=backend)
    assert (counts.graphs, counts.breaks) == (1, 0)


def test_cond_takes_either_branch_without_recompiling():
    counter = CountingBackend("aot_eager")
    fn = ember.compile(p_cond, backend=counter)
    w = torch.randn(4, 4)
    for sign in (1.0, -1.0, 1.0):
        x = torch.rand(4, 4) * sign
        assert_same(fn(x, w), p_cond(x, w))
    assert counter.frame_count == 1


def p_cond_mismatched(x):
    return torch.cond(x.sum() > 0, lambda a: a.sum(), lambda a: a * 2, (x,))


def p_cond_aliasing(x):
    return torch.cond(x.sum() > 0, lambda a: a, lambda a: a * 2, (x,))


@pytest.mark.parametrize(
    ("fn", "why"),
    [(p_cond_mismatched, "different number"), (p_cond_aliasing, "returns an operand")],
    ids=["mismatched", "aliasing"],
)
def test_cond_that_eager_refuses_breaks(fn, why):
    """ember refuses the node, and the call runs in Python, where torch.cond raises its own
    error, as eagerly."""
    compiled = ember.compile(fn, backend="eager")
    with pytest.raises(Exception) as eager_error:
        fn(torch.randn(3))
    with pytest.raises(type(eager_error.value)):
        compiled(torch.randn(3))
    assert any(why in r for r in ember.stats()["break_reasons"])


def p_cond_in_checkpoint(x):
    def body(a):
        return torch.cond(a.sum() > 0, lambda b: b.sin(), lambda b: b.cos(), (a,))

    return checkpoint(body, x, use_reentrant=False)


def test_cond_inside_a_checkpoint_runs_the_checkpoint_in_python():
    counts = train_check(
        p_cond_in_checkpoint, leaf_tensors((4,)), backend="aot_eager", dynamo=False
    )
    assert counts.breaks == 1


LINEAR = torch.nn.Linear(4, 4)


def p_vmap(x, w):
    return torch.vmap(lambda row, m: (m @ row).sin() + w.sum(), in_dims=(0, None))(x, w)


def p_vmap_out_dims(x, w):
    first, second = torch.vmap(lambda row: (row * 2, row.cos()), out_dims=1)(x)
    return first + second.t().t() * w


def p_grad(x, w):
    return torch.func.grad(lambda a, b: (a @ b).tanh().sum(), argnums=(0, 1))(x, w)


def p_grad_of_closure(x, w):
    return torch.func.grad(lambda a: (a * w).sin().sum())(x) * 2


def p_functional_call(x, w):
    params = {"weight": w, "bias": torch.zeros(4)}
    return torch.func.functional_call(LINEAR, params, (x,))


@pytest.mark.parametrize(
    "fn",
    [p_vmap, p_vmap_out_dims, p_grad, p_grad_of_closure, p_functional_call],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_func_is_captured(fn, backend):
    counts = check(fn, tensors((4, 4), (4, 4)), backend=backend)
    assert (counts.graphs, counts.breaks) == (1, 0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_vmap_and_grad_train(backend):
    train_check(p_vmap, leaf_tensors((4, 4), (4, 4)), backend=backend)


def p_jacrev(x):
    return torch.func.jacrev(torch.sin)(x) + 1


def _pair_product(pair):
    return pair[0] * pair[1]


def p_vmap_nested_in_dims(x):
    return torch.vmap(_pair_product, in_dims=((0, 0),))((x, x.cos())) + 1


@pytest.mark.parametrize("fn", [p_jacrev, p_vmap_nested_in_dims], ids=["jacrev", "nested"])
def test_other_transforms_break_cleanly(fn):
    """Not captured: the call runs in Python at a graph break, with the reason; Dynamo
    captures these, so only the values are compared."""
    counts = check(fn, tensors((3,)), dynamo=False)
    assert counts.graphs >= 1
    reasons = ember.stats()["break_reasons"]
    assert all(r.startswith(BreakReason.HIGHER_ORDER_OP.value) for r in reasons), reasons
    assert any("jacrev is not captured" in r or "in_dims=((0, 0),)" in r for r in reasons)


def test_a_lambda_transformed_in_a_way_not_captured_is_made_again_at_the_break():
    """The transform's function, made in the trace, is made again by the break code, which
    calls the transform in Python (before, the frame ran eagerly)."""

    def fn(x):
        return torch.vmap(lambda pair: pair[0] * pair[1], in_dims=((0, 0),))((x, x))

    check(fn, tensors((3,)), dynamo=False, eager_frames=0)
    (reason,) = ember.stats()["break_reasons"]
    assert "in_dims=((0, 0),)" in reason


def test_compiled_function_called_inside_an_eager_transform_runs_as_written():
    compiled = ember.compile(lambda r: r.sin() * 2, backend=CountingBackend("aot_eager"))
    x = torch.randn(3, 4)
    assert_same(torch.vmap(compiled)(x), x.sin() * 2)
    assert_same(torch.func.grad(lambda r: compiled(r).sum())(x), 2 * x.cos())


def test_inductor_behind_ember_gets_its_own_checkpoint_op():
    """Backend "inductor" (PyTorch's) receives tag_activation_checkpoint, which it knows."""
    train_check(p_checkpoint, leaf_tensors((4, 4), (4, 4)), backend="inductor", dynamo=False)


@pytest.mark.parametrize("fn", [p_checkpoint, p_checkpoint_dropout], ids=["plain", "dropout"])
def test_dynamos_checkpoint_op_through_embers_aot(fn):
    """torch.compile(backend=ember.aot.aot_eager): Dynamo's tag_activation_checkpoint is
    recomputed by ember's aot like ember's own node, random draws included."""
    import ember.aot

    make = leaf_tensors((8, 8), (8, 8))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=ember.aot.aot_eager)
    for seed in range(2):
        results = []
        for f in (fn, compiled):
            x, w = make()
            torch.manual_seed(seed)
            out = f(x, w)
            out.sum().backward()
            results.append((out, x.grad, w.grad))
        assert_same(results[1], results[0])
    torch._dynamo.reset()
