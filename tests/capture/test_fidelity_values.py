"""Issue 12's wrong answers: identities of in-place and no-op tensor methods, torch.Size
results, dict views that see later mutations, and set/frozenset semantics. Each program runs
eagerly, under ember and under torch.compile (see fidelity_harness)."""

from __future__ import annotations

import pytest
import torch
from fidelity_harness import check, tensors

import ember
from ember.testing import assert_same

# in-place methods and no-op conversions return the same tensor object


def p_augmented_assignment_keeps_identity(x):
    z = x * 1
    w = z
    w += 1
    return w is z, w, z


def p_inplace_method_returns_self(x):
    y = x * 2
    return y.add_(1) is y, y.mul_(2) is y, y


def p_inplace_on_input_returns_input(x):
    return x.add_(1)


def p_noop_conversions_return_self(x):
    same = (
        x.to(x.device) is x,
        x.to(x.dtype) is x,
        x.contiguous() is x,
        x.float() is x,
        x.cpu() is x,
        x.type_as(x) is x,
    )
    return same, x.to(torch.float64) is x, x.detach() is x


def p_inplace_result_kept_in_list(x):
    out = []
    y = x + 1
    out.append(y.relu_())
    return out[0] is y, out


def p_tensor_identity_in_containers(x):
    y = x.sin()
    z = y.mul_(2)
    return z is y, [z, y][0] is y, {0: z}[0] is y


# torch.Size


def p_size_concatenation(x):
    a = x.shape + (1,)
    b = (2,) + x.shape
    return type(a), a, type(b), b, x.view(a).shape


def p_size_slicing_and_methods(x):
    s = x.shape
    return (
        type(s[1:]),
        s[1:],
        s[-1],
        s.numel(),
        s.index(4),
        s.count(3),
        type(x.size()),
        type(s * 2),
        s * 2,
    )


def p_size_built_in_trace(x):
    s = torch.Size([x.shape[0], 2])
    t = torch.Size((1, 2, 3))
    return type(s), s, t, x.new_zeros(s).shape, type(torch.Size(list(x.shape)))


def p_size_in_containers(x):
    shapes = [x.shape, x[0].shape]
    return [type(s) for s in shapes], x.shape == (3, 4), x.shape == torch.Size([3, 4])


@pytest.mark.parametrize(
    "fn",
    [
        p_augmented_assignment_keeps_identity,
        p_inplace_method_returns_self,
        p_inplace_on_input_returns_input,
        p_noop_conversions_return_self,
        p_inplace_result_kept_in_list,
        p_tensor_identity_in_containers,
        p_size_concatenation,
        p_size_slicing_and_methods,
        p_size_built_in_trace,
        p_size_in_containers,
    ],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
def test_tensor_identity_and_size(fn):
    check(fn, tensors((3, 4)))


@pytest.mark.parametrize(
    "fn",
    [p_augmented_assignment_keeps_identity, p_inplace_on_input_returns_input],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
def test_identity_through_aot(fn):
    """The functionalized graph writes the input back, and the result is still the input."""
    check(fn, tensors((3, 4)), backend="aot_eager", dynamo=False)


# dict views see later mutations


def p_keys_view_sees_insertion(x):
    d = {"a": x}
    keys = d.keys()
    values = d.values()
    items = d.items()
    d["b"] = x + 1
    return list(keys), list(values), list(items), len(keys), "b" in keys


def p_views_see_deletion_and_update(x):
    d = {"a": x, "b": x * 2, "c": x * 3}
    keys, values = d.keys(), d.values()
    del d["b"]
    d.update(c=x * 4, e=x * 5)
    d.pop("a")
    return list(keys), list(values), len(values), list(d.items())


def p_key_view_set_operations(x):
    d = {"a": x, "b": x}
    keys = d.keys()
    d["c"] = x
    return (
        sorted(keys & {"a", "c", "z"}),
        sorted(keys | {"q"}),
        sorted(keys - {"a"}),
        keys
        == {
            "a",
            "b",
            "c",
        },
    )


def p_items_view_iterated_after_mutation(x):
    d = {}
    items = d.items()
    for i in range(3):
        d[i] = x * i
    total = x
    for k, v in items:
        total = total + v * k
    return total, type(items).__name__, type(d.keys()).__name__


@pytest.mark.parametrize(
    "fn",
    [
        p_keys_view_sees_insertion,
        p_views_see_deletion_and_update,
        p_key_view_set_operations,
        p_items_view_iterated_after_mutation,
    ],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
def test_dict_views(fn):
    check(fn, tensors((2,)))


# sets and frozensets


def p_set_iteration_order_is_pythons(x):
    s = {"weight", "bias", "alpha", "z", "a"}
    s.add("m")
    s.discard("z")
    n = {30, 1, 17, 2, 100}
    return list(s), list(n), [k for k in {5, 3, 9}]


def p_frozenset_type_and_operations(x):
    f = frozenset(["a", "b"])
    g = f | {"c"}
    h = {"c"} | f
    return type(f), type(g), type(h), sorted(g), f == {"a", "b"}, hash(f) == hash(frozenset("ab"))


def p_set_equality_and_ops(x):
    a = {1, 2, 3}
    b = {3, 2, 1}
    return a == b, a <= {1, 2, 3, 4}, a.isdisjoint({7}), sorted(a ^ {1, 9}), len(a | b)


def p_tensors_in_sets_by_identity(x):
    y = x + 1
    s = {x, y}
    z = x + 1
    return x in s, y in s, z in s, len(s), len({x, x, y})


def p_frozenset_cannot_be_mutated(x):
    f = frozenset([1])
    return hasattr(f, "add"), hasattr(set(), "add")


@pytest.mark.parametrize(
    "fn",
    [
        p_set_iteration_order_is_pythons,
        p_frozenset_type_and_operations,
        p_set_equality_and_ops,
        p_tensors_in_sets_by_identity,
        p_frozenset_cannot_be_mutated,
    ],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
def test_sets(fn):
    check(fn, tensors((2,)))


def _set_with_history():
    s = {f"name{i}" for i in range(30)}
    for i in range(0, 30, 3):
        s.discard(f"name{i}")
    return torch.ones(2), s


def p_set_argument_and_results_keep_pythons_order(x, s):
    union = s | {"extra", "name3"}
    common = s & {"name1", "name2", "name4", "zzz"}
    ordered = [k for k in s]
    return x * len(union), list(union), list(common), ordered, list(s - {"name1"})


def test_set_order_of_arguments_and_results():
    check(p_set_argument_and_results_keep_pythons_order, _set_with_history)


# tensors made from Python data inside the graph


def p_new_tensor_returned(x):
    return x.new_tensor([1, 2]), x.new_tensor(3.0, dtype=torch.float64)


def p_new_tensor_in_ops(x):
    return x.new_tensor([1.0, 2.0, 3.0, 4.0]) * x, x.new_tensor(2.0) + x


def p_tensor_literal_returned(x):
    return torch.tensor([1, 2]), torch.tensor(3.0) * x


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
@pytest.mark.parametrize(
    "fn",
    [p_new_tensor_returned, p_new_tensor_in_ops, p_tensor_literal_returned],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
def test_tensors_from_python_data(fn, backend):
    """`x.new_tensor(data)` in the aot trace made a meta tensor with no values (returned to
    the user as a meta tensor, or "a tensor reached an aten op without being an input"), and
    a returned `torch.tensor(data)` was one object shared by every call."""
    check(fn, tensors((3, 4)), backend=backend)
    compiled = ember.compile(fn, backend=backend)
    x = torch.randn(3, 4)
    first = compiled(x)[0]
    assert first.device == x.device
    first.add_(10)  # the caller owns what it got: the next call is not affected
    assert_same(compiled(x)[0], fn(x)[0])


def p_types_of_bound_methods(x):
    import types

    items = [1]
    return (
        callable(x.sum),
        type(x.sum),
        type(x.backward),
        type(items.append),
        isinstance(x.add, types.BuiltinMethodType),
        x * 2,
    )


def test_types_of_bound_methods():
    """`callable(x.sum)` and `type(x.sum)` broke ("type of method sum ... is not known")."""
    counts = check(p_types_of_bound_methods, tensors((3, 4)))
    assert (counts.graphs, counts.breaks) == (1, 0)


# identity and equality of outside objects: `is` between two arguments, `==` on objects
# whose classes define no __eq__ (Python falls back to identity)


class _Kind:
    def __init__(self, name):
        self.name = name


KIND_A, KIND_B = _Kind("a"), _Kind("b")


class _Holder:
    def __init__(self, kind):
        self.kind = kind


def _same_or_not(x, a, b):
    return x + 1 if a is b else x - 1


def _sentinel_equality(x, holder):
    r = x
    if holder.kind in (KIND_A, KIND_B):
        r = r + 1
    if holder.kind == KIND_B:
        r = r * 2
    if holder.kind != KIND_A:
        r = r - 3
    if holder.kind == 3 or holder.kind == "a":
        r = r * 10
    return r


def test_is_between_two_arguments_is_guarded():
    """Two different objects answered `a is b` False without a guard: a later call passing
    one object twice reused that graph (a wrong answer)."""
    ember.reset()
    compiled = ember.compile(_same_or_not)
    x = torch.zeros(2)
    one, other = _Kind("one"), _Kind("other")
    for a, b in ((one, other), (one, one), (other, one), (other, other)):
        assert_same(compiled(x, a, b), _same_or_not(x, a, b))


@pytest.mark.parametrize("kind", [KIND_A, KIND_B, _Kind("c")], ids=lambda k: k.name)
def test_equality_of_objects_without_eq_is_identity(kind):
    """`==` and `in` on objects whose class defines no __eq__ are identity tests, answered
    in the trace (they broke at object.__eq__, as in dataclasses' field kinds)."""
    counts = check(_sentinel_equality, lambda: (*tensors((3,))(), _Holder(kind)))
    assert counts.breaks == 0


def test_equality_of_objects_without_eq_is_guarded():
    ember.reset()
    compiled = ember.compile(_sentinel_equality)
    x = torch.randn(3)
    holder = _Holder(KIND_A)
    for kind in (KIND_A, KIND_B, KIND_A, _Kind("d"), KIND_B, _Kind("e"), KIND_A):
        holder.kind = kind
        assert_same(compiled(x, holder), _sentinel_equality(x, holder))


def _append_then_count(x, a, b):
    a.append(1)
    return x * len(b)


class _Box:
    def __init__(self):
        self.n = 0


def _bump_then_read(x, a, b):
    a.n += 1
    return x * b.n


def test_a_changed_argument_aliased_on_a_later_call():
    """`f(x, [], [])` then `f(x, l, l)`: the graph and ledger of the first call assumed two
    objects, so the second reused them and missed the append through the other name (a
    wrong answer; torch.compile gives the same). A changed outside object is now guarded
    distinct from the other outside values of its type."""
    for fn, make in ((_append_then_count, list), (_bump_then_read, _Box)):
        ember.reset()
        compiled = ember.compile(fn)
        x = torch.ones(2)
        assert_same(compiled(x, make(), make()), fn(x, make(), make()))
        shared, shared_eager = make(), make()
        assert_same(compiled(x, shared, shared), fn(x, shared_eager, shared_eager))
        assert_same(compiled(x, make(), make()), fn(x, make(), make()))
