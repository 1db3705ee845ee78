"""Every Python-version difference lives in ember/bytecode/: no other module reads the
version, imports the `bytecode` package or `opcode`, or uses `dis` beyond printing a
disassembly. Inside the package only dialect.py reads the version."""

from __future__ import annotations

import ast
import pathlib

import ember

_PACKAGE = pathlib.Path(ember.__file__).parent
_VERSION_NAMES = ("version_info", "hexversion", "sys.version")


def _modules(*, inside_bytecode: bool) -> list[pathlib.Path]:
    paths = sorted(_PACKAGE.rglob("*.py"))
    return [p for p in paths if (p.parent.name == "bytecode") == inside_bytecode]


def _offences(path: pathlib.Path) -> list[str]:
    """Imports of bytecode machinery and `dis` uses other than `dis.dis`, with line numbers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "dis"
            and node.attr != "dis"
        ):
            found.append(f"{path.name}:{node.lineno} dis.{node.attr}")
            continue
        else:
            continue
        for name in names:
            if name.split(".")[0] in ("bytecode", "opcode"):
                found.append(f"{path.name}:{node.lineno} import {name}")
    return found


def test_no_version_check_outside_the_bytecode_layer():
    outside = _modules(inside_bytecode=False)
    assert len(outside) > 50
    found = [
        f"{p.relative_to(_PACKAGE)}: {word}"
        for p in outside
        for word in _VERSION_NAMES
        if word in p.read_text()
    ]
    assert not found, found


def test_only_the_dialect_reads_the_version_inside_the_layer():
    found = [
        p.name
        for p in _modules(inside_bytecode=True)
        if p.name != "dialect.py" and any(w in p.read_text() for w in _VERSION_NAMES)
    ]
    assert not found, found


def test_capture_writes_no_raw_instructions():
    found = [o for p in _modules(inside_bytecode=False) for o in _offences(p)]
    assert not found, found
