"""Differential programs: Python builtins, torch functions, torch.nn.functional, tensor
methods and tensor attributes (shape, size, dtype, ndim, T, ...)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ember.testing import check_against_eager, check_program, program_ids


def x4():
    return torch.randn(4)


def x34():
    return torch.randn(3, 4)


def img():
    return torch.randn(2, 3, 8, 8)


# ---------------------------------------------------------------- builtins


def p_len(x):
    return x * len(x) + len([1, 2]) + len({"a": 1}) + len((x, x)) + len("abc")


def p_isinstance(x):
    checks = (
        isinstance(x, torch.Tensor),
        isinstance(3, int),
        isinstance([x], (list, tuple)),
        isinstance(x, (int, float)),
        isinstance(None, type(None)),
    )
    return x * sum(checks), checks


def p_getattr_hasattr(x):
    fn = getattr(x, "relu")  # noqa: B009  (the getattr builtin is what is tested)
    default = getattr(x, "not_a_tensor_attribute", 2.0)
    return fn() * default, hasattr(x, "shape"), hasattr(x, "nothing_here"), hasattr(torch, "sin")


def p_range_forms(x):
    return x * sum(range(3)) + sum(range(1, 5, 2)) + len(range(10, 0, -3))


def p_enumerate_zip(x):
    a = list(enumerate(["a", "b"]))
    b = list(zip((1, 2, 3), "xyz"))
    return x * len(a) + len(b), a, b


def p_min_max_consts(x):
    n = x.shape[0]
    return x * max(n, 2) + min(1, n, 3) + max([4, 5]) - min((7, 8))


def p_abs_sum_any_all(x):
    return abs(x) + abs(-3) + sum([1, 2, 3]) + sum([x, x], x), any([0, 1]), all([1, 0])


def p_sum_of_tensors_start(x):
    return sum(x.unbind(0), torch.zeros(4))


def p_round_divmod_pow(x):
    q, r = divmod(17, 5)
    return x * round(2.567, 2) + q + r + pow(2, 3)


def p_type_and_callable(x):
    t = type(x)
    return t.__name__, callable(torch.relu), x * (type(3) is int)  # noqa: UP003  (type() is tested)


def p_sorted_reversed(x):
    order = sorted([3, 1, 2], reverse=True)
    back = list(reversed([x, x * 2]))
    return order, back


def p_str_int_float_bool(x):
    n = int("3") + int(2.9) + float("0.5") + bool([1])
    return x * n, str(4), repr("a")


def p_tuple_list_dict_constructors(x):
    t = tuple([x, x])
    lst = list((x, 1))
    d = dict(a=x, b=2)
    return t, lst, d, x + 1


def p_math_module(x):
    return x * math.sqrt(4.0) + math.pi + math.floor(2.7) + math.ceil(0.2) + math.log(math.e)


def p_slice_builtin(x):
    return x[slice(1, None)], x[slice(None, None, 2)]


def p_iter_next_builtins(x):
    it = iter(x.unbind(0))
    return next(it) + next(it)


# ---------------------------------------------------------------- torch functions


def p_torch_creation(x):
    z = torch.zeros(3, 4)
    o = torch.ones_like(x)
    f = torch.full((3, 4), 2.0)
    a = torch.arange(12).reshape(3, 4).float()
    e = torch.eye(4)[:3]
    return x + z + o + f + a + e


def p_torch_creation_dtype_device(x):
    z = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    t = torch.tensor([1.0, 2.0, 3.0, 4.0])
    return x + z + t, torch.empty_like(x).shape


def p_torch_reductions(x):
    return (
        torch.sum(x),
        torch.mean(x, dim=0),
        torch.amax(x, dim=1),
        torch.std(x),
        torch.logsumexp(x, dim=-1),
        torch.norm(x),
        torch.prod(x, 1),
    )


def p_torch_max_structseq(x):
    values, indices = torch.max(x, dim=1)
    result = torch.sort(x, dim=-1)
    return values, indices, result.values, result.indices, torch.topk(x, 2).values


def p_torch_shape_ops(x):
    return (
        torch.cat([x, x], dim=0),
        torch.stack([x, x], dim=1),
        torch.transpose(x, 0, 1),
        torch.flatten(x),
        torch.unsqueeze(x, 0),
        torch.squeeze(x.unsqueeze(0)),
        torch.chunk(x, 2, dim=1),
        torch.split(x, [1, 2], dim=0),
    )


def p_torch_pointwise(x):
    return (
        torch.exp(x),
        torch.tanh(x),
        torch.sigmoid(x),
        torch.clamp(x, -1, 1),
        torch.where(x > 0, x, -x),
        torch.maximum(x, torch.zeros_like(x)),
        torch.lerp(x, torch.ones_like(x), 0.3),
        torch.sqrt(x.abs()),
    )


def p_torch_matmuls(x, y):
    return torch.matmul(x, y), torch.mm(x, y), torch.einsum("ij,jk->ik", x, y), x @ y


def p_torch_linalg_fft(x):
    return torch.linalg.vector_norm(x, dim=-1), torch.fft.rfft(x).abs()


def p_torch_is_tensor(x):
    return x * torch.is_tensor(x) + torch.numel(x) + torch.is_floating_point(x)


def p_torch_special(x):
    return torch.special.erf(x), torch.nn.functional.softplus(x)


# ---------------------------------------------------------------- torch.nn.functional


def p_F_activations(x):
    return F.relu(x), F.gelu(x), F.silu(x), F.leaky_relu(x, 0.1), F.elu(x), F.hardtanh(x)


def p_F_softmax_norm(x):
    return (
        F.softmax(x, dim=-1),
        F.log_softmax(x, dim=1),
        F.normalize(x, dim=-1),
        F.layer_norm(x, (4,)),
    )


def p_F_linear(x, w, b):
    return F.linear(x, w, b), F.linear(x, w)


def p_F_conv_pool(x, w):
    y = F.conv2d(x, w, padding=1)
    return F.max_pool2d(y, 2), F.avg_pool2d(y, 2), F.adaptive_avg_pool2d(y, 1)


def p_F_dropout_eval(x):
    return F.dropout(x, p=0.3, training=False)


def p_F_pad_interpolate(x):
    return F.pad(x, (1, 1)), F.interpolate(x, scale_factor=2, mode="nearest")


def p_F_losses(x, y):
    return F.mse_loss(x, y), F.l1_loss(x, y, reduction="sum"), F.cross_entropy(x, y.argmax(-1))


def p_F_embedding_one_hot(idx, table):
    return F.embedding(idx, table), F.one_hot(idx, 10)


def p_F_scaled_dot_product(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# ---------------------------------------------------------------- tensor methods and attributes


def p_tensor_attrs(x):
    n, m = x.shape
    return x * n + m, x.size(0), x.size(), x.shape, x.dtype, x.ndim, x.dim(), x.numel(), x.device


def p_tensor_T(x):
    return x.T, x.mT, x.t() @ x


def p_tensor_methods(x):
    return (
        x.relu(),
        x.view(-1),
        x.reshape(2, 6),
        x.permute(1, 0),
        x.transpose(0, 1).contiguous(),
        x.expand(2, 3, 4),
        x.repeat(2, 1),
        x.flatten(),
        x.unsqueeze(-1).squeeze(-1),
        x.mean(dim=-1, keepdim=True),
        x.argmax(dim=1),
        x.masked_fill(x > 0, 0.0),
        x.type_as(x.double()),
    )


def p_tensor_dtype_conversions(x):
    return x.float(), x.double(), x.half().float(), x.to(torch.float64), x.to(dtype=torch.int32)


def p_tensor_view_as_and_new(x):
    return x.new_zeros(2, 2), x.new_ones((3,)), x.new_full((2,), 3.0), x.view_as(x)


def p_tensor_inplace_methods(x):
    y = x.clone()
    y.add_(1).mul_(2).clamp_(max=3.0)
    y.zero_() if False else y.sub_(0.5)
    return y


def p_tensor_stride_contiguous(x):
    t = x.t()
    return t.is_contiguous(), t.stride(), t.contiguous().stride(), x.is_contiguous()


def p_tensor_size_arith(x):
    b, c = x.size()
    return x.view(b * c) / math.sqrt(c), x.new_zeros(x.size(-1))


def p_tensor_requires_grad_attr(x):
    return x * 2, x.requires_grad, x.is_leaf


def p_tensor_detach_clone(x):
    # (requires_grad_() on a tensor made in the graph breaks: test_fidelity_tensor_data.py)
    return x.detach() * 2, x.clone().sum(), x.detach().requires_grad


def p_tensor_chunk_unpack(x):
    a, b = x.chunk(2, dim=-1)
    return a * b.sigmoid()


def p_tensor_split_comprehension(x):
    return [part.sum() for part in x.split(1)]


def p_tensor_float_dtype_compare(x):
    same = x.dtype == torch.float32 and x.is_floating_point() and x.element_size() == 4
    return x + int(same)


def p_number_augmented_by_tensor(x):
    # numbers have no in-place form: `n += t` is n = n + t (T5's relative position buckets)
    buckets = 0
    buckets += (x > 0).to(torch.long) * 16
    scale = 1.5
    scale *= x
    return buckets, scale


CASES = [
    (p_len, [x4]),
    (p_isinstance, [x4]),
    (p_getattr_hasattr, [x4]),
    (p_range_forms, [x4]),
    (p_enumerate_zip, [x4]),
    (p_min_max_consts, [x4]),
    (p_abs_sum_any_all, [x4]),
    (p_sum_of_tensors_start, [x34]),
    (p_round_divmod_pow, [x4]),
    (p_type_and_callable, [x4]),
    (p_sorted_reversed, [x4]),
    (p_str_int_float_bool, [x4]),
    (p_tuple_list_dict_constructors, [x4]),
    (p_math_module, [x4]),
    (p_slice_builtin, [x4]),
    (p_iter_next_builtins, [x34]),
    (p_torch_creation, [x34]),
    (p_torch_creation_dtype_device, [x4]),
    (p_torch_reductions, [x34]),
    (p_torch_max_structseq, [x34]),
    (p_torch_shape_ops, [x34]),
    (p_torch_pointwise, [x34]),
    (p_torch_matmuls, [x34, lambda: torch.randn(4, 5)]),
    (p_torch_linalg_fft, [x34]),
    (p_torch_is_tensor, [x4]),
    (p_torch_special, [x4]),
    (p_F_activations, [x34]),
    (p_F_softmax_norm, [x34]),
    (p_F_linear, [x34, lambda: torch.randn(5, 4), lambda: torch.randn(5)]),
    (p_F_conv_pool, [img, lambda: torch.randn(4, 3, 3, 3)]),
    (p_F_dropout_eval, [x34]),
    (p_F_pad_interpolate, [img]),
    (p_F_losses, [x34, x34]),
    (p_F_embedding_one_hot, [lambda: torch.randint(0, 10, (5,)), lambda: torch.randn(10, 3)]),
    (p_F_scaled_dot_product, [lambda: torch.randn(1, 2, 5, 8)] * 3),
    (p_tensor_attrs, [x34]),
    (p_tensor_T, [x34]),
    (p_tensor_methods, [x34]),
    (p_tensor_dtype_conversions, [x34]),
    (p_tensor_view_as_and_new, [x34]),
    (p_tensor_inplace_methods, [x34]),
    (p_tensor_stride_contiguous, [x34]),
    (p_tensor_size_arith, [x34]),
    (p_tensor_requires_grad_attr, [lambda: torch.randn(3, requires_grad=True)]),
    (p_tensor_detach_clone, [lambda: torch.randn(3, requires_grad=True)]),
    (p_tensor_chunk_unpack, [x34]),
    (p_tensor_split_comprehension, [x34]),
    (p_tensor_float_dtype_compare, [x4]),
    (p_number_augmented_by_tensor, [x34]),
]


@pytest.mark.parametrize(("fn", "makers"), CASES, ids=program_ids(CASES))
def test_program(fn, makers):
    check_program(fn, makers)


@pytest.mark.parametrize(
    "method",
    ["abs", "neg", "exp", "sin", "cos", "tanh", "sigmoid", "floor", "ceil", "sign", "square"],
)
def test_unary_tensor_method(method):
    def f(x):
        return getattr(x, method)() + getattr(torch, method)(x)

    check_against_eager(f, x34(), frames=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_dtype_dependent_program(dtype):
    def f(x):
        if x.dtype.is_floating_point:
            return x * 2, x.dtype
        if x.dtype is torch.bool:
            return ~x, x.dtype
        return x // 2, x.dtype

    check_against_eager(f, torch.ones(3).to(dtype), frames=1)


def test_structseq_results_keep_their_type():
    def f(x):
        return torch.max(x, 0), x.sort(dim=-1), torch.linalg.slogdet(x @ x.T + torch.eye(3))

    result = check_against_eager(f, x34()[:, :3], frames=1)
    assert type(result[0]) is torch.return_types.max
    assert result[1].indices.dtype is torch.int64


def test_builtins_on_tensors_and_keys():
    def f(x):
        d = {"b": x, "a": x * 2, "c": x * 3}
        ordered = [v for _, v in sorted(d.items(), key=lambda kv: kv[0])]
        by_len = sorted([x, x[:2], x[:1]], key=len, reverse=True)
        flags = (callable(3), callable(torch.relu), callable(x), callable(len), callable(int))
        return pow(x, 2), pow(2, 3, 5), ordered, by_len, flags, sorted(d)

    check_against_eager(f, x4(), frames=1)
