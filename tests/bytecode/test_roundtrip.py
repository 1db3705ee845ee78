"""Every code object of the standard library and of torch's Python sources, decoded by ember
and encoded back, gives the original bytes: instructions (`co_code`), exception table, line
table; ember's stack-depth analysis gives `co_stacksize`; every opcode met is an `Op` or
listed as unsupported with a reason. A decoding gap (a new bit in an argument, a new argument
kind, a new cache size, a new opcode) fails here, on every Python version CI runs, instead of
in a user's model.

The code objects come from the compiled files next to the sources (`__pycache__`, written by
the installers), or from compiling the source where there is none. The work is split over
processes (it is ~150,000 code objects of ~7 million instructions per version).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import marshal
import multiprocessing
import os
import sysconfig
import types
import warnings
from collections.abc import Iterator

import pytest
import torch

from ember.bytecode.analysis import encode_exception_table, exception_table, stack_depth
from ember.bytecode.decode import decode
from ember.bytecode.encode import encode_instructions, encode_locations, instruction_locations


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)


def _module_code(path: str) -> types.CodeType | None:
    """The module's code: its compiled file if there is one, else compiled from source
    (None for files that are not Python of this version, like the test suite's bad
    syntax samples)."""
    cached = importlib.util.cache_from_source(path)
    if os.path.exists(cached):
        with open(cached, "rb") as f:
            return marshal.loads(f.read()[16:])  # after the 16-byte header
    try:
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # `1 is 1` in lib2to3's grammar samples
            return compile(f.read(), path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return None


def _mismatches(code: types.CodeType) -> list[str]:
    """What of `code` does not survive decoding and encoding again."""
    insts = decode(code)
    out = []
    unknown = {i.opname for i in insts if i.op is None and not i.unsupported_reason}
    if unknown:
        out.append(f"opcodes neither interpreted nor listed unsupported: {sorted(unknown)}")
    if encode_instructions(insts, code) != code.co_code:
        out.append("instructions")
    if encode_exception_table(exception_table(code)) != code.co_exceptiontable:
        out.append("exception table")
    if encode_locations(instruction_locations(code, insts), code.co_firstlineno) != (
        code.co_linetable
    ):
        out.append("line table")
    depth = stack_depth(code)
    # CPython sizes a frame before it drops dead code (`except*` over an empty `try`
    # leaves its handlers in the table, unreachable): only then may the size be larger
    if depth.highest != code.co_stacksize and not (
        depth.unreachable and depth.highest < code.co_stacksize
    ):
        out.append(f"stack size {depth.highest}, not {code.co_stacksize}")
    return out


def check_files(paths: list[str]) -> tuple[int, list[str]]:
    """(code objects checked, failures) for these source files."""
    count = 0
    failures = []
    for path in paths:
        module = _module_code(path)
        if module is None:
            continue
        for code in _nested(module):
            count += 1
            for what in _mismatches(code):
                failures.append(f"{path}:{code.co_firstlineno} {code.co_qualname}: {what}")
    return count, failures


def _sources(root: str) -> list[str]:
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages"))
        paths += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    return paths


_BODIES = {
    "stdlib": (sysconfig.get_paths()["stdlib"], 60_000),
    "torch": (os.path.dirname(torch.__file__), 50_000),
}
"""Where each body of code is, and fewer code objects than it has (a body that was not
found, or not read, fails instead of passing empty)."""
CHOSEN = os.environ.get("EMBER_ROUNDTRIP", ",".join(_BODIES)).split(",")
"""EMBER_ROUNDTRIP=torch narrows the bodies: .ci/run's second Python 3.11 run (another torch)
has the same standard library as the first."""


@pytest.fixture(scope="module")
def pool():
    """Worker processes for both bodies (each starts by importing ember and torch)."""
    workers = max(1, min(4, os.cpu_count() or 1))
    context = multiprocessing.get_context("spawn")  # the parent holds torch's threads
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as executor:
        yield executor


@pytest.mark.parametrize("body", sorted(CHOSEN))
def test_every_code_object_round_trips(body, pool):
    root, at_least = _BODIES[body]
    paths = _sources(root)
    count, failures = 0, []
    for n, found in pool.map(check_files, [paths[i::32] for i in range(32)]):
        count += n
        failures += found
    assert count >= at_least, f"only {count} code objects under {root}"
    assert not failures, f"{len(failures)} failures, first: " + "\n".join(failures[:20])
