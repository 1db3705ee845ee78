"""Accuracy of the generated float math, in ulps against the true value, beside eager's.

Each function of the prelude (and the lowerings built on it) runs compiled on a sweep of
inputs: a dense grid over [-20, 20], both signs of every magnitude from the smallest
subnormal to the largest float, and the special values (NaN, +-inf, +-0, the edges of exp's
range). Like every backend test this runs under each CPU target the machine has, since the
same C++ becomes different vector code per target.

The reference is the true value: float64 formulas without cancellation for float32 and
bfloat16 inputs, mpmath at 40 digits for float64 inputs (eager's float64 result where no
mpmath function is given). The rules, per element:
- NaN where eager gives NaN, and the same infinity where eager gives one;
- where eager is accurate (at most `bound` ulps off everywhere near this input: a window of
  neighbouring inputs, so that eager's lucky roundings inside a region where it loses digits
  do not count as accuracy), ember is within `bound` ulps;
- everywhere, ember is within 2 ulps of eager's error nearby, so never meaningfully worse
  (where eager loses digits to cancellation or flushed results, and where both are near
  `bound`: a row's sum rounds differently with each vector width);
- a zero has the sign of the true result wherever eager's zero has it.
Row functions (softmax, log-softmax) take rows of 64 neighbouring grid values, and rows with
one special value among ordinary ones.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import mpmath
import pytest
import torch
import torch.nn.functional as F

from tests.backend.helpers import compile_ember

EXP_EDGES = [88.72283935546875, 88.7229, -87.33654, -87.3366, -103.97208, -104.0]
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -0.5, 0.625, -0.625, *EXP_EDGES]


def _sweep(n_lin: int, n_log: int) -> torch.Tensor:
    lin = torch.linspace(-20, 20, n_lin, dtype=torch.float64)
    mags = torch.logspace(-45.8, 38.5, n_log, dtype=torch.float64)
    return torch.cat([lin, mags, -mags, torch.tensor(SPECIAL, dtype=torch.float64)])


ROW = 64


def _row_sweep(n_rows: int) -> torch.Tensor:
    """Rows of neighbouring values over [-100, 100]; 16 wide rows, each spanning 160 (most
    of their exps underflow, some to subnormals); one row per special value (the rest of
    that row ordinary values); flattened."""
    grid = torch.linspace(-100, 100, n_rows * ROW, dtype=torch.float64)
    wide = [torch.linspace(-150, 10, ROW, dtype=torch.float64) + d / 16 for d in range(16)]
    rest = torch.linspace(-3, 3, ROW - 1, dtype=torch.float64)
    specials = [torch.cat([torch.tensor([v], dtype=torch.float64), rest]) for v in SPECIAL]
    return torch.cat([grid, *wide, *specials])


def _mp(f: Callable) -> Callable[[torch.Tensor], torch.Tensor]:
    """A float64 reference from an mpmath function (NaN where mpmath has no real value)."""

    @mpmath.workdps(40)
    def ref(x: torch.Tensor) -> torch.Tensor:
        out = []
        for v in x.tolist():
            try:
                out.append(float(f(mpmath.mpf(v))) if math.isfinite(v) else math.nan)
            except (ValueError, ZeroDivisionError, OverflowError):
                out.append(math.nan)
        return torch.tensor(out, dtype=torch.float64)

    return ref


def _mp_rows(f: Callable) -> Callable[[torch.Tensor], torch.Tensor]:
    """A float64 reference for a row function from an mpmath one on lists of values (NaN
    for rows holding a non-finite value: those are checked against eager only)."""

    @mpmath.workdps(40)
    def ref(x: torch.Tensor) -> torch.Tensor:
        out = []
        for row in x.view(-1, ROW).tolist():
            finite = all(map(math.isfinite, row))
            out += [float(v) for v in f(list(map(mpmath.mpf, row)))] if finite else [math.nan] * ROW
        return torch.tensor(out, dtype=torch.float64)

    return ref


def _mp_softmax(row: list) -> list:
    exps = [mpmath.exp(v - max(row)) for v in row]
    return [e / sum(exps) for e in exps]


def _mp_log_softmax(row: list) -> list:
    top = max(row)
    log_sum = mpmath.log(sum(mpmath.exp(v - top) for v in row))
    return [v - top - log_sum for v in row]


def _gelu_ref(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * torch.special.erfc(-x * math.sqrt(0.5))


def _gelu_tanh_ref(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    ref64: Callable[[torch.Tensor], torch.Tensor]  # accurate in float64 (no cancellation)
    mp: Callable | None  # the mpmath function, for float64 inputs
    bound: float  # ulps, float32
    bound64: float = 4  # ulps, float64
    rows: bool = False  # a row function (inputs from _row_sweep)


def _on_abs(f: Callable) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: f(x.abs())


def _per_row(f: Callable) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: f(x.view(-1, ROW), -1).flatten()


def _mp_sigmoid(v):
    return 1 / (1 + mpmath.exp(-v))


CASES = [
    Case("exp", torch.exp, torch.exp, mpmath.exp, 2),
    Case("log", _on_abs(torch.log), _on_abs(torch.log), lambda v: mpmath.log(abs(v)), 2),
    Case("tanh", torch.tanh, torch.tanh, mpmath.tanh, 3),
    Case("sigmoid", torch.sigmoid, torch.sigmoid, _mp_sigmoid, 3),
    Case("erf", torch.erf, torch.erf, mpmath.erf, 3),
    Case("gelu", F.gelu, _gelu_ref, lambda v: v * mpmath.erfc(-v / mpmath.sqrt(2)) / 2, 6),
    Case("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), _gelu_tanh_ref, None, 6),
    Case("silu", F.silu, F.silu, lambda v: v * _mp_sigmoid(v), 4),
    Case("expm1", torch.expm1, torch.expm1, mpmath.expm1, 2),
    Case("log1p", _on_abs(torch.log1p), _on_abs(torch.log1p), lambda v: mpmath.log1p(abs(v)), 2),
    Case("sin", torch.sin, torch.sin, mpmath.sin, 2),
    Case("cos", torch.cos, torch.cos, mpmath.cos, 2),
    Case("sqrt", _on_abs(torch.sqrt), _on_abs(torch.sqrt), lambda v: mpmath.sqrt(abs(v)), 1),
    Case("rsqrt", _on_abs(torch.rsqrt), _on_abs(torch.rsqrt), lambda v: 1 / mpmath.sqrt(abs(v)), 2),
    Case("reciprocal", torch.reciprocal, torch.reciprocal, lambda v: 1 / v, 1),
    Case("softmax", _per_row(torch.softmax), _per_row(torch.softmax), _mp_softmax, 4, 8, rows=True),
    Case(
        "log_softmax",
        _per_row(torch.log_softmax),
        _per_row(torch.log_softmax),
        _mp_log_softmax,
        4,
        8,
        rows=True,
    ),
]


def _ulp(r: torch.Tensor) -> torch.Tensor:
    """The spacing of floats at |r|, in r's dtype, as float64."""
    a = r.abs()
    return (torch.nextafter(a, torch.full_like(a, math.inf)) - a).double()


def _ulp_error(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|y - ref| in ulps of ref (0 where either is not finite: checked apart)."""
    both = torch.isfinite(y) & torch.isfinite(ref)
    err = torch.zeros(ref.shape, dtype=torch.float64)
    err[both] = (y[both].double() - ref[both].double()).abs() / _ulp(ref[both])
    return err


@functools.cache
def _inputs_and_reference(name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs in `dtype` and the true results rounded to it (computed once per process)."""
    case = next(c for c in CASES if c.name == name)
    if dtype == torch.float64:
        x = _row_sweep(16) if case.rows else _sweep(601, 301)
        ref = (_mp_rows if case.rows else _mp)(case.mp)(x) if case.mp else case.ref64(x)
        return x, ref
    x = (_row_sweep(625) if case.rows else _sweep(40001, 4001)).to(dtype)
    return x, case.ref64(x.double()).to(dtype)


def _check_special(got: torch.Tensor, eager: torch.Tensor, x: torch.Tensor) -> None:
    nan_differs = got.isnan() != eager.isnan()
    inf_differs = (eager.isinf() | got.isinf()) & (got != eager)
    bad = nan_differs | inf_differs
    assert not bad.any(), (
        f"special values differ from eager at x={x[bad][:8].tolist()}: "
        f"ember {got[bad][:8].tolist()}, eager {eager[bad][:8].tolist()}"
    )


def _nearby_max(err: torch.Tensor, window: int = 33) -> torch.Tensor:
    """The largest error among each input's neighbours in the sweep (sorted runs)."""
    pooled = F.max_pool1d(err[None, None], window, stride=1, padding=window // 2)
    return pooled[0, 0]


def _check_ulps(got, eager, ref, x, bound: float) -> None:
    err, eager_err = _ulp_error(got, ref), _nearby_max(_ulp_error(eager, ref))
    allowed = torch.maximum(torch.full_like(err, bound), eager_err + 2)
    bad = err > allowed
    if bad.any():
        i = int((err - allowed).argmax())
        raise AssertionError(
            f"{int(bad.sum())} results off by more than allowed; worst at x={x[i].item()!r}: "
            f"ember {got[i].item()!r} ({err[i].item():.3g} ulps), eager {eager[i].item()!r} "
            f"(up to {eager_err[i].item():.3g} ulps nearby), true {ref[i].item()!r}"
        )


def _check_zero_signs(got, eager, ref, x) -> None:
    zero = (ref == 0) & (eager == 0) & (eager.signbit() == ref.signbit())
    bad = zero & ((got != 0) | (got.signbit() != ref.signbit()))
    assert not bad.any(), f"zero of the wrong sign at x={x[bad][:8].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@torch.no_grad()
def test_accuracy_in_ulps(case: Case, dtype: torch.dtype) -> None:
    x, ref = _inputs_and_reference(case.name, dtype)
    eager = case.fn(x)
    got = compile_ember(case.fn)(x)
    _check_special(got, eager, x)
    bound = {torch.float32: case.bound, torch.float64: case.bound64}.get(dtype, 1)
    _check_ulps(got, eager, ref, x, bound)
    if dtype != torch.float64:  # mpmath has no signed zero
        _check_zero_signs(got, eager, ref, x)
