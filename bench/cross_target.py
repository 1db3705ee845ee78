"""ember's generated float math on another architecture: a correctness check, not a timing.

Each function of tests/backend/test_accuracy.py is compiled by ember on this machine; its
kernel (the same C++ a run on the other machine would generate) is cross-compiled for the
target with a `main` that feeds it the accuracy sweep, run under qemu's user-mode emulation,
and checked by the accuracy test's rules (special values as eager's, ulps against the true
value beside eager's error, signs of zeros). Needs a cross compiler and qemu, e.g. on Debian:
`apt-get install g++-aarch64-linux-gnu qemu-user`.

    .venv/bin/python bench/cross_target.py [--arch aarch64] [--march armv8-a]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ember.backend  # noqa: E402
from ember.backend.codegen.build import FLAGS  # noqa: E402
from ember.backend.compile import record  # noqa: E402
from tests.backend import test_accuracy as acc  # noqa: E402

MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  long n = atol(argv[3]), size = atol(argv[4]);
  char* in = (char*)malloc(n * size); char* out = (char*)malloc(n * size);
  FILE* f = fopen(argv[1], "rb"); if (fread(in, size, n, f) != (size_t)n) return 2; fclose(f);
  ((void (*)(void*, void*))kernel0)(in, out);
  f = fopen(argv[2], "wb"); fwrite(out, size, n, f); fclose(f);
  return 0;
}
"""


def run_case(case: acc.Case, dtype: torch.dtype, cxx: str, march: str, qemu: str, tmp: Path):
    x, ref = acc._inputs_and_reference(case.name, dtype)
    with record() as arts:
        torch.compile(case.fn, backend=ember.backend, dynamic=False)(x)
    (art,) = arts
    assert art.kernels == {"kernel0": 2}, art.kernels
    src = tmp / f"{case.name}.cpp"
    src.write_text(art.cpp + MAIN)
    exe = tmp / case.name
    flags = [f for f in FLAGS if f not in ("-shared", "-fPIC")]
    build = [cxx, *flags, f"-march={march}", "-static", str(src), "-o", str(exe)]
    subprocess.run(build, check=True, capture_output=True)
    (tmp / "in").write_bytes(x.contiguous().view(torch.uint8).numpy().tobytes())
    args = [str(tmp / "in"), str(tmp / "out"), str(x.numel()), str(x.element_size())]
    subprocess.run([qemu, str(exe), *args], check=True, timeout=600)
    raw = torch.frombuffer(bytearray((tmp / "out").read_bytes()), dtype=torch.uint8)
    got = raw.view(dtype)
    eager = case.fn(x)
    acc._check_special(got, eager, x)
    bound = {torch.float32: case.bound, torch.float64: case.bound64}.get(dtype, 1)
    acc._check_ulps(got, eager, ref, x, bound)
    if dtype != torch.float64:
        acc._check_zero_signs(got, eager, ref, x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="aarch64")
    p.add_argument("--march", default="armv8-a")
    args = p.parse_args()
    cxx, qemu = f"{args.arch}-linux-gnu-g++", f"qemu-{args.arch}"
    torch._dynamo.config.cache_size_limit = 1000
    failures = 0
    with tempfile.TemporaryDirectory() as d, torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            for case in acc.CASES:
                try:
                    run_case(case, dtype, cxx, args.march, qemu, Path(d))
                    verdict = "ok"
                except AssertionError as e:
                    failures += 1
                    verdict = f"FAILED: {str(e).splitlines()[0]}"
                name = f"{args.arch} -march={args.march} {str(dtype)[6:]:8} {case.name:12}"
                print(name, verdict)
    print(f"{failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
