"""The C prelude's float16 conversions against torch's, exhaustively: the compiler's
_Float16 (g++ >= 12) and the by-bits fallback that compilers without it get."""

from __future__ import annotations

import ctypes
import subprocess

import pytest
import torch

from ember import config
from ember.backend.codegen import build, target
from ember.backend.codegen.prelude import PRELUDE

_CONVERT = r"""
extern "C" void widen(const ember_f16* h, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = ember_f16_to_f32(h[i]);
}
extern "C" void narrow(const float* f, ember_f16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = ember_f32_to_f16(f[i]);
}
"""


def _floats() -> torch.Tensor:
    """Every float16 value widened, the midpoints between neighbours (ties), points just
    either side of them, values past the largest float16, tiny ones and random bits."""
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    halves = every.view(torch.float16).float()
    finite = halves[halves.isfinite()].unique()
    mids = (finite[:-1].double() + finite[1:].double()) / 2
    near = torch.cat([mids.float(), mids.float().nextafter(mids.float() + 1)])
    near = torch.cat([near, mids.float().nextafter(mids.float() - 1)])
    edges = torch.tensor([65504.0, 65519.99, 65520.0, 7e4, 1e38, 1e-8, 2.9e-8, 3e-8, 1e-45])
    rand = torch.randint(-(1 << 31), 1 << 31, (1 << 16,), dtype=torch.int64).to(torch.int32)
    out = torch.cat([halves, near, edges, -edges, rand.view(torch.float32)])
    return out.contiguous()


@pytest.mark.parametrize("builtin", [True, False], ids=["_Float16", "by-bits"])
def test_float16_conversions_match_torch(builtin, tmp_path):
    src = tmp_path / "convert.cpp"
    src.write_text(PRELUDE + _CONVERT)
    lib = tmp_path / "convert.so"
    flags = [f for f in build.FLAGS if f != "-fopenmp"] + list(
        target.flags(config.current().cpu_isa)
    )
    undef = [] if builtin else ["-U__FLT16_MAX__"]  # as a compiler without _Float16 sees it
    subprocess.run([target.CXX, *flags, *undef, str(src), "-o", str(lib)], check=True)
    so = ctypes.CDLL(str(lib))

    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    widened = torch.empty(every.shape, dtype=torch.float32)
    so.widen(
        ctypes.c_void_p(every.data_ptr()),
        ctypes.c_void_p(widened.data_ptr()),
        ctypes.c_int64(every.numel()),
    )
    want = every.view(torch.float16).float()
    torch.testing.assert_close(widened, want, rtol=0, atol=0, equal_nan=True)

    f = _floats()
    narrowed = torch.empty(f.shape, dtype=torch.int16)
    so.narrow(
        ctypes.c_void_p(f.data_ptr()),
        ctypes.c_void_p(narrowed.data_ptr()),
        ctypes.c_int64(f.numel()),
    )
    got, want = narrowed.view(torch.float16), f.half()
    assert torch.equal(got.isnan(), want.isnan())
    keep = ~want.isnan()
    assert torch.equal(narrowed[keep], want.view(torch.int16)[keep])  # bits: signed zeros too
