"""The CPU target generated C++ is built for, and its identity in cache keys.

`EMBER_CPU_ISA` (config `cpu_isa`) picks the target: `native` (the default: every feature of
the machine that compiles), an alias for a lower x86-64 level (`avx512`, `avx2`, `sse2`), or
any value g++ takes for `-march`. A lower target on a machine that has a higher one lets one
machine run every code path the generated kernels may take elsewhere.

A kernel built for one CPU can fault (an illegal instruction) or compute differently on
another, and `-march=native` means something else on every machine. So cache keys carry the
resolved target, never the literal flag: for `native`, the architecture, tuning, feature list
and cache parameters g++ expands it into on this machine.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess

CXX = os.environ.get("CXX", "g++")

ALIASES = {"avx512": "x86-64-v4", "avx2": "x86-64-v3", "sse2": "x86-64"}
"""Named x86-64 levels: AVX-512 (F, BW, CD, DQ, VL), AVX2 with FMA, and the SSE2 baseline."""

X86_LEVELS = ("avx512", "avx2", "sse2")


class TargetError(Exception):
    """The chosen CPU target cannot run on this machine, or g++ does not know it."""


def march(isa: str) -> str:
    """The `-march` value of an ISA name (an alias, `native`, or a g++ architecture)."""
    return ALIASES.get(isa, isa)


def _driver(isa: str, *args: str) -> str:
    """g++'s output for `-march=<isa> args` (TargetError when it refuses the target)."""
    try:
        cmd = [CXX, f"-march={march(isa)}", *args]
        out = subprocess.run(cmd, input="", capture_output=True, text=True, check=False)
    except OSError as e:
        raise TargetError(f"no C++ compiler ({CXX}): {e}") from e
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or ["(no message)"])[0]
        raise TargetError(f"g++ refuses EMBER_CPU_ISA={isa}: {first}")
    return out.stdout + out.stderr


@functools.cache
def _expanded(isa: str) -> tuple[str, ...]:
    """The options g++'s driver hands its compiler proper for `-march=<isa>`: for `native`,
    the machine's resolved architecture, every feature as -mX / -mno-X, and cache sizes."""
    text = _driver(isa, "-###", "-E", "-")
    for line in text.splitlines():
        if "cc1" in line and "-march=" in line:
            args = re.findall(r'"([^"]*)"|(\S+)', line)
            return tuple(a or b for a, b in args if (a or b).startswith(("-m", "--param", "l")))
    raise TargetError(f"no compiler command in g++'s plan for -march={march(isa)}")


@functools.cache
def _enabled_features(isa: str) -> frozenset[str]:
    """The -m options g++ enables for `-march=<isa>` (from `-Q --help=target`)."""
    text = _driver(isa, "-Q", "--help=target")
    return frozenset(re.findall(r"^\s+(-m[\w.-]+)\s+\[enabled\]", text, re.M))


def machine_features() -> frozenset[str]:
    """The CPU-feature switches `-march=native` sets on this machine (-mavx2, ...)."""
    return frozenset(a for a in _expanded("native") if a.startswith("-m") and "=" not in a)


@functools.cache
def runs_here(isa: str) -> bool:
    """Whether code built for `isa` can run on this machine: every CPU feature the target
    turns on is one the machine has (features g++ does not list for native do not count)."""
    if isa == "native":
        return True
    native = machine_features()
    known = {f.replace("-mno-", "-m") for f in native}
    missing = {f for f in _enabled_features(isa) if f in known and f not in native}
    return not missing


def check(isa: str) -> None:
    """Raise TargetError when `isa` is unknown to g++ or needs features this CPU lacks."""
    if not runs_here(isa):
        native = machine_features()
        lacking = sorted(f for f in _enabled_features(isa) if f.replace("-m", "-mno-", 1) in native)
        raise TargetError(
            f"EMBER_CPU_ISA={isa} (-march={march(isa)}) needs {', '.join(lacking)}, "
            f"which this CPU lacks; choose one of: {', '.join(available())}"
        )


def flags(isa: str) -> tuple[str, ...]:
    """The target options for g++."""
    return (f"-march={march(isa)}",)


def identity(isa: str) -> str:
    """What the kernels built for `isa` depend on, for cache keys: the machine architecture
    and the options g++ resolves the target into."""
    return platform.machine() + " " + " ".join(_expanded(isa))


@functools.cache
def available() -> tuple[str, ...]:
    """The targets this machine can run: `native`, then each named x86-64 level it has."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ("native",)
    return ("native", *(isa for isa in X86_LEVELS if runs_here(isa)))
