"""Every form of generated Triton kernel compiled by Triton's own compiler for an H100/H200
class GPU (sm_90), down to the cubin, on this CPU machine (ptxas ships with Triton).

The interpreter the other tests run kernels under is permissive: it evaluates tiles with
numpy, so code the compiler refuses (operand types it does not unify, a block shape that is
not a power of two, a call that does not lower, an int64 index mixed with int32) can pass
there. Here each program is first checked against eager under the interpreter, recording
its launches (argument types and block sizes), and then every launched kernel is compiled
for the GPU."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.backend.codegen import triton_runtime
from tests.backend.helpers import _close
from tests.triton.helpers import check


def _unary(x):
    return torch.sigmoid(x) * torch.tanh(x) + torch.erf(x) - torch.expm1(x).log1p() + F.gelu(x)


def _binary(a, b):
    return torch.maximum(a, b) + torch.pow(a.abs(), b) + torch.atan2(a, b) - torch.minimum(a, b)


def _bfloat16(x):
    return (x.bfloat16() * 2).sigmoid() + 1


def _integers(i, x):
    return torch.where((i * 3 + 1) % 5 == 2, x, -x), i // 2


def _strided_and_cat(a, b):
    return torch.cat([a.t(), b], 1) * 2


def _reductions(x):
    return x.sum(1), x.amax(0), x.amin(1), x.mean(1), x.prod(1), x.var(1)


def _rows(x, w):
    return (
        torch.softmax(x, -1),
        torch.log_softmax(x, -1),
        F.layer_norm(x, (x.shape[-1],), w, w),
        F.rms_norm(x, (x.shape[-1],), w),
    )


def _long_row(x):
    return x.reshape(1, -1).log_softmax(-1)


def _columns(x):
    return x.sum(0) * 2


def _linear_gelu(x, w, b):
    return F.gelu(x @ w + b)


def _symbolic(x):
    return torch.softmax(x * 2, -1) + x.sum(-1, keepdim=True)


PROGRAMS = {
    "unary": (_unary, (torch.randn(8, 33),), False),
    "binary broadcast": (_binary, (torch.randn(5, 1, 7), torch.randn(3, 7)), False),
    "bfloat16": (_bfloat16, (torch.randn(6, 40),), False),
    "integers and where": (_integers, (torch.arange(60).view(6, 10), torch.randn(6, 10)), False),
    "strided and cat": (_strided_and_cat, (torch.randn(9, 4), torch.randn(4, 5)), False),
    "reductions": (_reductions, (torch.randn(6, 50),), False),
    "row kernels": (_rows, (torch.randn(4, 96), torch.randn(96)), False),
    "looped long row": (_long_row, (torch.randn(8, 4096),), False),
    "columns": (_columns, (torch.randn(300, 24),), False),
    "linear gelu epilogue": (
        _linear_gelu,
        (torch.randn(16, 32), torch.randn(32, 64), torch.randn(64)),
        False,
    ),
    "symbolic sizes": (_symbolic, (torch.randn(7, 19),), True),
}


@pytest.fixture(autouse=True, scope="module")
def _private_triton_cache(tmp_path_factory: pytest.TempPathFactory):
    """Triton's own cache of compiled kernels, empty: every kernel here is really compiled."""
    before = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
    yield
    if before is None:
        del os.environ["TRITON_CACHE_DIR"]
    else:
        os.environ["TRITON_CACHE_DIR"] = before


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_generated_kernels_compile_for_sm90(name):
    fn, inputs, dynamic = PROGRAMS[name]
    with triton_runtime.record_launches() as launches:
        check(fn, *inputs, dynamic=dynamic)
    assert launches, "no Triton kernel was launched"
    compiled = triton_runtime.compile_ahead(launches, capability=90)
    assert len(compiled) == len(set(launches))
    for launch, kernel in zip(dict.fromkeys(launches), compiled, strict=True):
        assert kernel.metadata.target.arch == 90, launch.kernel
        assert kernel.asm["cubin"], f"{launch.kernel}: no cubin"
        assert ".entry " + launch.kernel in kernel.asm["ptx"], launch.kernel


@pytest.mark.parametrize("name", ["unary", "row kernels", "looped long row", "columns"])
def test_every_autotune_configuration_compiles_for_sm90(name, tmp_path):
    """mode="max-autotune" launches each configuration of a kernel's tuning space once to
    compare and time it: each of those launches (its block sizes, num_warps, num_stages)
    compiles for the GPU too."""
    fn, inputs, _ = PROGRAMS[name]
    with config.patch(cache_dir=str(tmp_path)), triton_runtime.record_launches() as launches:
        compiled = ember.compile(fn, mode="max-autotune-no-cudagraphs")
        with torch.no_grad():  # the chosen configuration may sum in another order
            _close(compiled(*inputs), fn(*inputs), rtol=1e-5, atol=1e-4)
    tried = {(launch.kernel, launch.constexprs, launch.options) for launch in launches}
    assert len(tried) > len({launch.kernel for launch in launches}) + 2, tried
    kernels = triton_runtime.compile_ahead(launches, capability=90)
    for launch, kernel in zip(dict.fromkeys(launches), kernels, strict=True):
        assert kernel.metadata.target.arch == 90, launch.kernel
        assert kernel.metadata.num_warps == dict(launch.options)["num_warps"], launch
        assert kernel.asm["cubin"], f"{launch.kernel}: no cubin"
