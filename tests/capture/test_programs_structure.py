"""Differential programs: containers (tuples, lists, dicts, sets, slices) built, unpacked,
indexed and returned; f-strings; branches on trace-time values; unrolled loops;
comprehensions; nested functions and lambdas; grad-mode context managers.
"""

from __future__ import annotations

import pytest
import torch

from ember.testing import check_against_eager, check_program, program_ids


def x4():
    return torch.randn(4)


def x34():
    return torch.randn(3, 4)


def x234():
    return torch.randn(2, 3, 4)


# ---------------------------------------------------------------- building and unpacking


def p_build_tuple(x, y):
    return (x, y, x + y)


def p_build_list(x, y):
    return [x, y * 2, 3]


def p_build_dict(x, y):
    return {"sum": x + y, "diff": x - y, "n": 2}


def p_build_dict_comprehension_keys(x):
    d = {}
    d["a"] = x
    d["b"] = x * 2
    d.update(c=x * 3)
    return d


def p_build_set_of_consts(x):
    s = {1, 2, 3}
    s.add(4)
    return x * len(s | {5}), sorted(s)


def p_build_nested(x):
    return {"pair": (x, [x + 1, {"deep": x * 2}]), "k": (1, 2)}


def p_unpack_tuple(x):
    a, b, c = x.unbind(0)
    return a + b * c


def p_unpack_star(x):
    first, *middle, last = x.unbind(0)
    return first + last + sum(middle)


def p_unpack_nested(x):
    (a, b), c = (x, x * 2), x * 3
    return a + b + c


def p_unpack_dict_items(x):
    d = {"a": x, "b": x + 1}
    out = []
    for k, v in d.items():
        out.append(v * len(k))
    return out


def p_list_methods(x):
    items = [x]
    items.append(x + 1)
    items.extend([x * 2, x * 3])
    items.insert(0, x - 1)
    last = items.pop()
    items.reverse()
    items.remove(items[0])
    return items, last


def p_list_concat_repeat(x):
    a = [x] * 2 + [x + 1]
    t = (x,) * 2 + (x * 2,)
    return a, t


def p_list_inplace_concat(x):
    a = [x]
    a += [x * 2]
    a += (x * 3,)
    return a


def p_dict_methods(x):
    d = {"a": x}
    d.setdefault("b", x * 2)
    d.setdefault("a", x * 100)
    v = d.pop("a")
    g = d.get("zzz", x * 3)
    return d, v, g, list(d.keys()), list(d.values())


def p_dict_merge_and_copy(x):
    a = {"x": x}
    b = {**a, "y": x * 2}
    c = dict(b)
    c["z"] = x * 3
    return b, c


def p_dict_from_zip(x):
    names = ("a", "b", "c")
    return dict(zip(names, x.unbind(0)))


def p_arg_list_in_out(xs):
    return [t * 2 for t in xs]


def p_arg_dict_in_out(d):
    return {k: v + 1 for k, v in d.items()}


def p_arg_tuple_index(t):
    return t[0] * t[1] + t[-1]


def p_mutate_arg_list(xs):
    xs.append(xs[0] * 2)
    return len(xs)


def p_mutate_arg_dict(d):
    d["new"] = d["a"] + 1
    del d["b"]
    return d["new"]


# ---------------------------------------------------------------- subscripts and slices


def p_tensor_subscripts(x):
    return x[0], x[-1], x[1:], x[:, 1], x[..., :2], x[None, 0], x[::2, :: -1 if False else 1]


def p_tensor_slice_objects(x):
    s = slice(1, 3)
    return x[:, s], x[s, s.start :]


def p_tensor_index_tensor(x):
    idx = torch.tensor([0, 2])
    return x[idx]


def p_tensor_bool_mask_where(x):
    return torch.where(x > 0, x, torch.zeros_like(x))


def p_tensor_setitem(x):
    y = x.clone()
    y[0] = 0.0
    y[:, 1] = y[:, 2] * 2
    return y


def p_list_slices(x):
    items = [x, x + 1, x + 2, x + 3]
    head = items[:2]
    tail = items[2:]
    stepped = items[::2]
    items[1:3] = [x * 10]
    return head, tail, stepped, items


def p_tuple_slice_negative(x):
    t = tuple(x.unbind(0))
    return t[-2:], t[::-1]


def p_shape_subscripts(x):
    n, m = x.shape[-2:]
    return x.reshape(x.shape[0], -1) * n + m


def p_str_subscript(x):
    s = "abc"
    return x * len(s[1:]), s[0]


# ---------------------------------------------------------------- f-strings and strings


def p_fstring_key(x):
    out = {}
    for i in range(3):
        out[f"layer_{i}"] = x * i
    return out


def p_fstring_formats(x):
    n = x.shape[0]
    ratio = 2 / 3
    return x * n, f"n={n!r} ratio={ratio:.2f} shape={tuple(x.shape)} {'s'!s:>3}"


def p_string_methods(x):
    name = "Block.Linear"
    parts = name.lower().split(".")
    return x * len(parts), "-".join(parts), name.startswith("Block")


# ---------------------------------------------------------------- branches on trace-time values


def p_branch_const(x, flag=True):
    if flag:
        return x + 1
    return x - 1


def p_branch_shape(x):
    if x.shape[0] > 2 and x.ndim == 2:
        return x.sum(0)
    return x


def p_branch_dtype(x):
    if x.dtype == torch.float32:
        x = x.double()
    if x.dtype is torch.float64:
        return x * 2
    return x


def p_branch_is_none(x, mask=None):
    if mask is None:
        mask = torch.ones_like(x)
    if mask is not None:
        x = x * mask
    return x


def p_branch_optional_given(x, mask):
    return p_branch_is_none(x, mask)


def p_branch_isinstance(x, y):
    out = x
    for v in (y, 2, 2.5, "s"):
        if isinstance(v, torch.Tensor):
            out = out + v
        elif isinstance(v, (int, float)):
            out = out * v
    return out


def p_branch_ternary(x):
    return x.relu() if x.size(-1) == 4 else x.sigmoid()


def p_branch_requires_grad(x):
    if x.requires_grad:
        return x * 2
    return x * 3


def p_branch_device(x):
    if x.device.type == "cpu" and x.is_floating_point():
        return x + 1
    return x


def p_branch_while_const(x):
    n = 0
    while n < 3:
        x = x * 2
        n += 1
    return x


def p_branch_assert(x):
    assert x.dim() == 2, "expected a matrix"
    return x.t()


def p_branch_training_flag(x, training=False):
    return torch.nn.functional.dropout(x, p=0.5, training=training)


# ---------------------------------------------------------------- loops


def p_loop_range(x):
    for i in range(3):
        x = x + i
    return x


def p_loop_range_shape(x):
    total = torch.zeros_like(x[0])
    for i in range(x.shape[0]):
        total = total + x[i]
    return total


def p_loop_list(x):
    for scale in [1.0, 2.0, 3.0]:
        x = x * scale
    return x


def p_loop_tuple_of_tensors(x, y):
    out = 0
    for t in (x, y, x * y):
        out = out + t
    return out


def p_loop_dict(x):
    d = {"a": 1, "b": 2}
    for key in d:
        x = x + d[key]
    for key, value in d.items():
        x = x * value + len(key)
    for value in d.values():
        x = x - value
    return x


def p_loop_enumerate(x):
    out = []
    for i, t in enumerate(x.unbind(0), start=1):
        out.append(t * i)
    return torch.stack(out)


def p_loop_zip(x, y):
    return [a * b for a, b in zip(x.unbind(0), y.unbind(0))]


def p_loop_reversed_break_continue(x):
    for i in reversed(range(6)):
        if i % 2:
            continue
        if i == 0:
            break
        x = x + i
    else:
        x = x * 100
    return x


def p_loop_for_else(x):
    for _ in range(2):
        x = x + 1
    else:
        x = x * 2
    return x


def p_loop_nested(x):
    out = x
    for i in range(2):
        for j in range(3):
            out = out + i * j
    return out


def p_loop_over_tensor(x):
    return [row.sum() for row in x]


def p_loop_while_list(x):
    items = [x, x + 1, x + 2]
    out = 0
    while items:
        out = out + items.pop()
    return out


def p_loop_iter_next(x):
    it = iter([x, x * 2, x * 3])
    first = next(it)
    rest = list(it)
    return first, rest, next(it, None)


# ---------------------------------------------------------------- comprehensions


def p_list_comprehension(x):
    return torch.stack([x * i for i in range(3) if i != 1])


def p_dict_comprehension(x):
    return {f"k{i}": x + i for i in range(2)}


def p_set_comprehension(x):
    sizes = {d for d in x.shape}
    return x * len(sizes)


def p_nested_comprehension(x):
    return [[x * i + j for j in range(2)] for i in range(2)]


def p_comprehension_closure(x):
    k = 3
    return [x * k + i for i in range(2)]


def p_comprehension_shadow(x):
    i = 10
    vals = [i * 2 for i in range(3)]
    return x * i + sum(vals)


def p_generator_into_sum(x):
    return sum(t * t for t in x.unbind(0))


def p_any_all_generators(x):
    shapes = [x.shape, x.shape]
    ok = all(s[0] == 3 for s in shapes) and not any(s[1] == 7 for s in shapes)
    return x + 1 if ok else x


# ---------------------------------------------------------------- nested functions and lambdas


def p_nested_def(x):
    def helper(v, k=2):
        return v * k

    return helper(x) + helper(x, k=3)


def p_lambda_map(x):
    fns = [lambda v: v + 1, lambda v: v * 2, torch.relu]
    for fn in fns:
        x = fn(x)
    return x


def p_lambda_default_arg(x):
    fns = [lambda v, i=i: v * i for i in range(3)]
    return [f(x) for f in fns]


def p_nested_returns_closure(x):
    def make(k):
        return lambda v: v * k

    return make(2)(x) + make(3)(x)


def p_recursion_fixed_depth(x):
    def apply(v, n):
        if n == 0:
            return v
        return apply(v * 2, n - 1)

    return apply(x, 3)


def p_map_filter(x):
    vals = list(map(lambda v: v * 2, [x, x + 1]))
    kept = list(filter(lambda n: n % 2, range(5)))
    return vals, kept


# ---------------------------------------------------------------- grad mode


def p_no_grad(x, w):
    with torch.no_grad():
        y = x @ w
    return y + x.sum(), y.requires_grad


def p_enable_grad_inside_no_grad(x, w):
    with torch.no_grad():
        a = x * w
        with torch.enable_grad():
            b = x * w
    return a, b


def p_set_grad_enabled(x, w):
    with torch.set_grad_enabled(False):
        a = x * w
    return a, (x * w)


def p_is_grad_enabled(x):
    if torch.is_grad_enabled():
        return x * 2
    return x * 3


CASES = [
    (p_build_tuple, [x4, x4]),
    (p_build_list, [x4, x4]),
    (p_build_dict, [x4, x4]),
    (p_build_dict_comprehension_keys, [x4]),
    (p_build_set_of_consts, [x4]),
    (p_build_nested, [x4]),
    (p_unpack_tuple, [x34]),
    (p_unpack_star, [x34]),
    (p_unpack_nested, [x4]),
    (p_unpack_dict_items, [x4]),
    (p_list_methods, [x4]),
    (p_list_concat_repeat, [x4]),
    (p_list_inplace_concat, [x4]),
    (p_dict_methods, [x4]),
    (p_dict_merge_and_copy, [x4]),
    (p_dict_from_zip, [x34]),
    (p_arg_list_in_out, [lambda: [x4(), x4()]]),
    (p_arg_dict_in_out, [lambda: {"a": x4(), "b": x4()}]),
    (p_arg_tuple_index, [lambda: (x4(), x4(), x4())]),
    (p_mutate_arg_list, [lambda: [x4()]]),
    (p_mutate_arg_dict, [lambda: {"a": x4(), "b": x4()}]),
    (p_tensor_subscripts, [x34]),
    (p_tensor_slice_objects, [lambda: torch.randn(4, 4)]),
    (p_tensor_index_tensor, [x34]),
    (p_tensor_bool_mask_where, [x34]),
    (p_tensor_setitem, [x34]),
    (p_list_slices, [x4]),
    (p_tuple_slice_negative, [x34]),
    (p_shape_subscripts, [x234]),
    (p_str_subscript, [x4]),
    (p_fstring_key, [x4]),
    (p_fstring_formats, [x4]),
    (p_string_methods, [x4]),
    (p_branch_const, [x4]),
    (p_branch_shape, [x34]),
    (p_branch_dtype, [x4]),
    (p_branch_is_none, [x4]),
    (p_branch_optional_given, [x4, x4]),
    (p_branch_isinstance, [x4, x4]),
    (p_branch_ternary, [x34]),
    (p_branch_requires_grad, [lambda: torch.randn(4, requires_grad=True)]),
    (p_branch_device, [x4]),
    (p_branch_while_const, [x4]),
    (p_branch_assert, [x34]),
    (p_branch_training_flag, [x4]),
    (p_loop_range, [x4]),
    (p_loop_range_shape, [x34]),
    (p_loop_list, [x4]),
    (p_loop_tuple_of_tensors, [x4, x4]),
    (p_loop_dict, [x4]),
    (p_loop_enumerate, [x34]),
    (p_loop_zip, [x34, x34]),
    (p_loop_reversed_break_continue, [x4]),
    (p_loop_for_else, [x4]),
    (p_loop_nested, [x4]),
    (p_loop_over_tensor, [x34]),
    (p_loop_while_list, [x4]),
    (p_loop_iter_next, [x4]),
    (p_list_comprehension, [x4]),
    (p_dict_comprehension, [x4]),
    (p_set_comprehension, [x34]),
    (p_nested_comprehension, [x4]),
    (p_comprehension_closure, [x4]),
    (p_comprehension_shadow, [x4]),
    (p_generator_into_sum, [x34]),
    (p_any_all_generators, [x34]),
    (p_nested_def, [x4]),
    (p_lambda_map, [x4]),
    (p_lambda_default_arg, [x4]),
    (p_nested_returns_closure, [x4]),
    (p_recursion_fixed_depth, [x4]),
    (p_map_filter, [x4]),
    (p_no_grad, [lambda: torch.randn(4, requires_grad=True), lambda: torch.randn(4, 4)]),
    (
        p_enable_grad_inside_no_grad,
        [lambda: torch.randn(4, requires_grad=True), x4],
    ),
    (p_set_grad_enabled, [lambda: torch.randn(4, requires_grad=True), x4]),
    (p_is_grad_enabled, [x4]),
]


@pytest.mark.parametrize(("fn", "makers"), CASES, ids=program_ids(CASES))
def test_program(fn, makers):
    check_program(fn, makers)


def test_grad_mode_is_restored_after_call():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y

    check_against_eager(f, x4(), frames=1)
    assert torch.is_grad_enabled()
    with torch.no_grad():
        check_against_eager(f, x4(), frames=1)
        assert not torch.is_grad_enabled()


def test_gradients_flow_through_compiled_graph():
    import ember

    def f(x, w):
        return ((x @ w).relu() * 2).sum()

    x = torch.randn(3, 4)
    w = torch.randn(4, 5, requires_grad=True)
    w2 = w.detach().clone().requires_grad_(True)
    f(x, w).backward()
    ember.compile(f, backend="eager", fullgraph=True)(x, w2).backward()
    torch.testing.assert_close(w2.grad, w.grad)


def _pairs(xs):
    for i, t in enumerate(xs):
        yield i, t * 2


def _squares(n):
    for i in range(n):
        received = yield i * i
        assert received is None
    return "done"


def test_generator_functions_are_run_to_exhaustion():
    def f(x):
        total = 0
        for i, t in _pairs(x.unbind(0)):
            total = total + t * i
        return total, list(_squares(3)), sum(_squares(4))

    check_against_eager(f, x34(), frames=1)


def test_nested_generator_function():
    def f(x):
        def gen():
            yield x
            yield x + 1

        return torch.stack(tuple(gen()))

    check_against_eager(f, x4(), frames=1)


def _inner_gen(xs):
    for t in xs:
        yield t * 2
    return len(xs)


def _outer_gen(xs):
    n = yield from _inner_gen(xs)
    yield n
    yield from (t + 1 for t in xs)
    yield from [100]


def test_yield_from_delegates_and_returns():
    def f(x):
        return list(_outer_gen(x.unbind(0)))

    check_against_eager(f, x34(), frames=1)


def test_sets_of_objects_by_identity():
    def f(x, y):
        seen = {x}
        seen.add(y)
        seen.add(x)
        out = [t * 2 for t in (x, y) if t in seen]
        return len(seen), out, y in seen, {1, 2} | {3}

    check_against_eager(f, x4(), x4(), frames=1)


def q_late_binding_lambdas(x):
    fns = [lambda v: v * i for i in range(3)]  # noqa: B023  (late binding is the point)
    return [f(x) for f in fns]


def q_chained_assignment_walrus(x):
    a = b = x * 2
    (y,) = (a,)
    if (n := x.shape[0]) > 2:
        y = y + n
    return y, b


def q_star_literals(x):
    a = [x, x + 1]
    b = (x * 2,)
    s = {*range(3), 5}
    return [*a, *b], (*a, x), {**{"p": x}, **{"q": 2}}, s, torch.stack([*a])


def q_star_call_of_nested(x):
    def g(*args):
        return len(args)

    return x * g(*[1, 2], *(3,))


def q_del_and_augmented_item(x, xs):
    del xs[0]
    xs[0] += 1
    return x


def q_generator_in_loop(x):
    out = 0
    for i in range(3):
        out = out + sum(x * j for j in range(i))
    return out


def q_nested_comprehension_closure(x):
    k = 2
    return [[x * k * i * j for j in range(2)] for i in range(2)]


def q_while_true_break(x):
    i = 0
    while True:
        i += 1
        if i > 3:
            break
    return x * i


OPCODE_CASES = [
    (q_late_binding_lambdas, [x4]),
    (q_chained_assignment_walrus, [x4]),
    (q_star_literals, [x4]),
    (q_star_call_of_nested, [x4]),
    (q_del_and_augmented_item, [x4, lambda: [x4(), x4()]]),
    (q_generator_in_loop, [x4]),
    (q_nested_comprehension_closure, [x4]),
    (q_while_true_break, [x4]),
]


@pytest.mark.parametrize(
    ("fn", "makers"), OPCODE_CASES, ids=[c[0].__name__.removeprefix("q_") for c in OPCODE_CASES]
)
def test_opcode_program(fn, makers):
    check_against_eager(fn, *[make() for make in makers], frames=1)
