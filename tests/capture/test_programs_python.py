"""Differential programs: names (locals, globals, attributes, closures and cells), calls
(positional, keyword, *args, **kwargs) and every operator, compiled against eager.

Each program runs twice through `check_against_eager` (the second run takes the cache path)
and must be captured as exactly one graph.
"""

from __future__ import annotations

import operator

import pytest
import torch

from ember.testing import check_against_eager, check_program, program_ids

SCALE = 3
OFFSET = 0.5
NAME = "relu"
FLAG = True
WEIGHT = torch.randn(4)
TABLE = {"a": 2, "b": 3}
PAIR = (1, 2)


class Holder:
    def __init__(self):
        self.k = 2.0
        self.t = torch.randn(4)
        self.inner = Inner()


class Inner:
    def __init__(self):
        self.w = torch.randn(4)
        self.n = 3


HOLDER = Holder()


def x4():
    return torch.randn(4)


def x44():
    return torch.randn(4, 4)


def ints4():
    return torch.randint(1, 8, (4,))


def bools4():
    return torch.tensor([True, False, True, False])


# ---------------------------------------------------------------- locals and globals


def p_locals_rebind(x):
    y = x + 1
    y = y * 2
    z = y
    del y
    return z - x


def p_locals_swap(x, y):
    x, y = y, x
    return x - y


def p_global_tensor(x):
    return x * WEIGHT


def p_global_consts(x):
    return x * SCALE + OFFSET if FLAG else x


def p_global_str_dispatch(x):
    return getattr(torch, NAME)(x)


def p_global_dict(x):
    return x * TABLE["a"] + TABLE["b"]


def p_global_tuple(x):
    a, b = PAIR
    return x * a + b


def p_global_object_attrs(x):
    return x * HOLDER.k + HOLDER.t + HOLDER.inner.w * HOLDER.inner.n


def p_module_attr_chain(x):
    return torch.nn.functional.relu(x) + torch.special.expit(x)


def p_operator_module(x):
    return operator.add(x, 1) * operator.neg(x)


# ---------------------------------------------------------------- attributes


def p_attr_arg(obj, x):
    return x * obj.k + obj.t


def p_attr_nested_arg(obj, x):
    return x + obj.inner.w * obj.inner.n


def p_attr_store_new_object(x):
    inner = Inner()
    inner.n = 5
    return x * inner.n


# ---------------------------------------------------------------- closures and cells


def make_closure_const():
    factor = 4

    def f(x):
        return x * factor

    return f


def make_closure_tensor():
    bias = torch.randn(4)

    def f(x):
        return x + bias

    return f


def p_cell_written_by_inner(x):
    total = x

    def add(v):
        nonlocal total
        total = total + v

    add(x)
    add(1.0)
    return total


def p_cell_read_by_lambda(x):
    k = 3
    g = lambda v: v * k  # noqa: E731
    k = 5
    return g(x)


def p_nested_closures(x):
    a = 2

    def outer(v):
        b = 3

        def inner(w):
            return w * a + b

        return inner(v)

    return outer(x)


def p_closure_over_arg(x, y):
    def use():
        return x * y

    return use() + 1


# ---------------------------------------------------------------- calls


def _kw(x, *, scale=1.0, shift=0.0):
    return x * scale + shift


def _varargs(*tensors):
    out = tensors[0]
    for t in tensors[1:]:
        out = out + t
    return out


def _varkw(x, **options):
    out = x
    for key in sorted(options):
        out = out * options[key]
    return out


def _both(*args, **kwargs):
    return args[0] * kwargs["k"] + len(args) + len(kwargs)


def _defaults(x, a=1, b=2):
    return x * a + b


def _posonly(x, y, /, z=1):
    return x - y + z


def p_call_positional(x):
    return _defaults(x, 3, 4)


def p_call_keyword(x):
    return _defaults(x, b=5) + _kw(x, scale=2.0)


def p_call_kwonly_default(x):
    return _kw(x, shift=1.0)


def p_call_star_args(x, y):
    parts = (x, y, x)
    return _varargs(*parts)


def p_call_star_list(x):
    parts = [x, x * 2]
    return _varargs(*parts, x)


def p_call_double_star(x):
    opts = {"a": 2, "b": 3}
    return _varkw(x, **opts)


def p_call_star_and_double_star(x):
    args = (x, x)
    kwargs = {"k": 2}
    return _both(*args, **kwargs)


def p_call_mixed_star(x):
    return _both(x, *(x, x), k=3, **{"z": 1})


def p_call_posonly(x, y):
    return _posonly(x, y) + _posonly(y, x, z=4)


def p_call_torch_kwargs(x):
    return torch.sum(x, dim=1, keepdim=True) + torch.clamp(x, min=-0.5, max=0.5)


def p_call_torch_star(x):
    dims = (1, 0)
    return x.permute(*dims).contiguous()


def p_call_torch_double_star(x):
    opts = {"dim": 0, "keepdim": False}
    return torch.mean(x, **opts)


def p_call_method_kwargs(x):
    return x.sum(dim=0, keepdim=True).softmax(dim=-1)


# ---------------------------------------------------------------- operators


def _binary_tensor_tensor(op):
    def f(x, y):
        return op(x, y)

    return f


def p_all_binary(x, y):
    return (
        x + y,
        x - y,
        x * y,
        x / y,
        x // y,
        x % y,
        x**2,
        x @ y,
        -x,
        +x,
        abs(x),
    )


def p_int_bitwise(a, b):
    return a & b, a | b, a ^ b, ~a, a << 1, b >> 1


def p_bool_ops(a, b):
    return a & b, a | b, a ^ b, ~a


def p_compare_tensors(x, y):
    return x < y, x <= y, x == y, x != y, x > y, x >= y


def p_compare_scalar(x):
    return x > 0, 0.5 >= x, x == 1.0


def p_reflected(x):
    return 1 - x, 2 * x, 3 / (x.abs() + 1), 2**x, 5 + x


def p_inplace_tensor(x, y):
    z = x.clone()
    z += y
    z -= 1
    z *= y
    z /= 2
    return z


def p_inplace_on_arg(x):
    x += 1
    x.mul_(2)
    return x


def p_inplace_int_tensor(a):
    b = a.clone()
    b //= 2
    b %= 3
    b |= 4
    b &= 7
    b ^= 1
    b <<= 1
    b >>= 1
    return b


def p_const_arith(x):
    n = 7
    m = n // 2 + n % 3 - (n << 1) + (n >> 1) + (n & 3) + (n | 8) + (n ^ 5) + n**2 - ~n
    f = 7.5 / 2 - 1.5
    return x * m + f


def p_const_inplace(x):
    n = 1
    n += 2
    n *= 3
    n -= 1
    n //= 2
    n **= 2
    n %= 7
    s = "a"
    s += "b"
    return x * n, s


def p_matmul_inplace_names(x, y):
    z = x
    z @= y
    return z


def p_unary_consts(x):
    a = 3
    return x * -a + (+a) + ~a + (not a)


def p_chained_compare(x):
    n = x.shape[0]
    return x * (1 if 0 < n <= 4 else 2)


def p_is_and_in(x):
    a = None
    flags = [1, 2, 3]
    out = x
    if a is None and 2 in flags and 5 not in flags and x is not a:
        out = out + 1
    return out


def p_bool_logic_short_circuit(x):
    a = 0
    b = 3
    c = a or b
    d = a and b
    return x * c + d


CASES = [
    (p_locals_rebind, [x4]),
    (p_locals_swap, [x4, x4]),
    (p_global_tensor, [x4]),
    (p_global_consts, [x4]),
    (p_global_str_dispatch, [x4]),
    (p_global_dict, [x4]),
    (p_global_tuple, [x4]),
    (p_global_object_attrs, [x4]),
    (p_module_attr_chain, [x4]),
    (p_operator_module, [x4]),
    (p_attr_arg, [Holder, x4]),
    (p_attr_nested_arg, [Holder, x4]),
    (p_attr_store_new_object, [x4]),
    (make_closure_const(), [x4]),
    (make_closure_tensor(), [x4]),
    (p_cell_written_by_inner, [x4]),
    (p_cell_read_by_lambda, [x4]),
    (p_nested_closures, [x4]),
    (p_closure_over_arg, [x4, x4]),
    (p_call_positional, [x4]),
    (p_call_keyword, [x4]),
    (p_call_kwonly_default, [x4]),
    (p_call_star_args, [x4, x4]),
    (p_call_star_list, [x4]),
    (p_call_double_star, [x4]),
    (p_call_star_and_double_star, [x4]),
    (p_call_mixed_star, [x4]),
    (p_call_posonly, [x4, x4]),
    (p_call_torch_kwargs, [x44]),
    (p_call_torch_star, [x44]),
    (p_call_torch_double_star, [x44]),
    (p_call_method_kwargs, [x44]),
    (p_all_binary, [x44, lambda: torch.rand(4, 4) + 0.5]),
    (p_int_bitwise, [ints4, ints4]),
    (p_bool_ops, [bools4, bools4]),
    (p_compare_tensors, [x4, x4]),
    (p_compare_scalar, [x4]),
    (p_reflected, [x4]),
    (p_inplace_tensor, [x4, lambda: torch.rand(4) + 1]),
    (p_inplace_on_arg, [x4]),
    (p_inplace_int_tensor, [ints4]),
    (p_const_arith, [x4]),
    (p_const_inplace, [x4]),
    (p_matmul_inplace_names, [x44, x44]),
    (p_unary_consts, [x4]),
    (p_chained_compare, [x4]),
    (p_is_and_in, [x4]),
    (p_bool_logic_short_circuit, [x4]),
]

BINARY_OPERATORS = [
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.floordiv,
    operator.mod,
    operator.pow,
    operator.lt,
    operator.le,
    operator.eq,
    operator.ne,
    operator.gt,
    operator.ge,
]


@pytest.mark.parametrize(("fn", "makers"), CASES, ids=program_ids(CASES))
def test_program(fn, makers):
    check_program(fn, makers)


@pytest.mark.parametrize("op", BINARY_OPERATORS, ids=lambda op: op.__name__)
def test_binary_operator_tensor_and_scalar(op):
    def f(x, y):
        return op(x, y), op(x, 2.0), op(3.0, y)

    check_against_eager(f, torch.rand(4) + 0.5, torch.rand(4) + 0.5, frames=1)


@pytest.mark.parametrize(
    "op",
    [operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ipow],
    ids=lambda op: op.__name__,
)
def test_inplace_operator_on_fresh_tensor(op):
    def f(x, y):
        z = x * 1
        z = op(z, y)
        return z

    check_against_eager(f, torch.rand(4) + 0.5, torch.rand(4) + 0.5, frames=1)
