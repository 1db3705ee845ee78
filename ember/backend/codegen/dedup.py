"""Kernels that differ only in names, compiled once: later copies become aliases of the first.

A model's layers repeat their fused kernels on other buffers (GPT-2 tiny's two blocks give 13
C++ kernels of which 3 repeat another's code, in its dynamic graph), and g++'s time grows
with the code it optimizes: each copy cost as much as the original (~15-20% of the dynamic
graph's g++ time). Takes the kernels' (name, C++ text, parameters) as cpp.kernel_source
writes them and returns the translation units' texts: each distinct kernel once, a repeat
as `extern "C" void kernelN(<its signature>) __attribute__((alias("kernelM")));` in the same
unit as kernelM (an alias must name a function of its own translation unit). The wrapper and
the loader keep calling every kernel by its own name, with its own argument list.

Two kernels are one when their texts are equal after renaming, consistently and
one-to-one, the identifiers that are local to a kernel: its name, its parameters (buffers
and size symbols, the signature's order being part of the text) and the locals the writer
derives from a buffer's name (`acc_`, `red_`, `pw_`, `nan_`, `tot_` + name). Equal texts
under such a renaming are the same function up to alpha-equivalence; any other difference
(a constant, a type, an index, `__restrict__`) keeps them apart.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

_IDENT = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
"""An identifier not inside a number (`0x1.8p+3`) or after a member dot."""
_LOCAL_PREFIXES = ("acc_", "red_", "pw_", "nan_", "tot_")
"""The prefixes cpp.KernelWriter puts before a buffer's name to name its locals."""

ENABLED = sys.platform.startswith("linux")
"""ELF aliases: what g++ gives on Linux (Mach-O has no `alias` attribute)."""


def shape_of(name: str, source: str, local_names: Iterable[str]) -> str:
    """The kernel's text with its own name and its local identifiers numbered by first
    appearance (`$0`, `acc_$1`, ...: `$` is in no C identifier, so nothing collides)."""
    local = frozenset(local_names)
    numbers: dict[str, int] = {}

    def rename(m: re.Match[str]) -> str:
        word = m.group(0)
        if word == name:
            return "$kernel"
        prefix, base = "", word
        if base not in local:
            prefix = next((p for p in _LOCAL_PREFIXES if word.startswith(p)), "")
            base = word[len(prefix) :]
            if not prefix or base not in local:
                return word
        return f"{prefix}${numbers.setdefault(base, len(numbers))}"

    return _IDENT.sub(rename, source)


def alias_of(name: str, source: str, target: str) -> str:
    """`name` declared with its own signature as another symbol for `target`'s code."""
    signature = source.split("\n", 1)[0]
    if not signature.startswith(f'extern "C" void {name}(') or not signature.endswith(") {"):
        raise ValueError(f"not a kernel definition: {signature!r}")
    return f'{signature[:-2]} __attribute__((alias("{target}")));'


def merge(kernels: list[tuple[str, str, list[str]]], buffers: Iterable[str]) -> list[str]:
    """Translation units for the kernels (name, C++ text, parameters), in order: a kernel
    whose shape (`shape_of`) an earlier one has is an alias line added to that one's unit."""
    if not ENABLED:
        return [source for _, source, _ in kernels]
    buffer_names = frozenset(buffers)
    units: list[str] = []
    first: dict[str, tuple[int, str]] = {}  # shape -> (unit index, kernel name)
    for name, source, params in kernels:
        shape = shape_of(name, source, buffer_names.union(params))
        if shape in first:
            i, target = first[shape]
            units[i] += "\n" + alias_of(name, source, target)
            continue
        first[shape] = (len(units), name)
        units.append(source)
    return units
