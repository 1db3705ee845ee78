"""Compile C++ with g++ into a shared object, cached on disk by source and flags.

Cache entries are written atomically (temp file + rename) so that concurrent processes never
see a partial library, and carry a SHA-256 of the library so that a corrupt or truncated
entry is detected and rebuilt instead of loaded.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from ember import config, logs

CXX = os.environ.get("CXX", "g++")
FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fPIC",
    "-shared",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-std=c++17",
    "-w",
)


class BuildError(Exception):
    pass


@functools.cache
def compiler_id() -> str:
    """Compiler version and flags: part of every cache key."""
    try:
        out = subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise BuildError(f"no C++ compiler ({CXX}): {e}") from e
    return out.splitlines()[0] + " " + " ".join(FLAGS)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def kernel_dir() -> Path:
    return Path(config.current().cache_dir) / "kernels"


def library_key(source: str) -> str:
    return _sha((compiler_id() + "\n" + source).encode())


def _valid(so: Path, sha_file: Path) -> bool:
    try:
        return sha_file.read_text().strip() == _sha(so.read_bytes())
    except OSError:
        return False


SPLIT = "\n// ember: translation unit boundary\n"


def _groups(units: list[str], n: int) -> list[list[str]]:
    """Kernels dealt into n groups of similar total size (largest first)."""
    groups: list[list[str]] = [[] for _ in range(n)]
    sizes = [0] * n
    for u in sorted(units, key=len, reverse=True):
        i = sizes.index(min(sizes))
        groups[i].append(u)
        sizes[i] += len(u)
    return groups


def _compile(source: str, out: Path, workdir: Path) -> None:
    """g++ the module; with several kernels, as parallel translation units then one link."""
    prelude, *units = source.split(SPLIT)
    n = min(len(units), os.cpu_count() or 1, 4)
    if n <= 1:
        cpp = workdir / "module.cpp"
        cpp.write_text(source)
        _run([CXX, *FLAGS, str(cpp), "-o", str(out)])
        return
    objs, procs = [], []
    flags = [f for f in FLAGS if f != "-shared"]
    for i, group in enumerate(_groups(units, n)):
        cpp, obj = workdir / f"part{i}.cpp", workdir / f"part{i}.o"
        cpp.write_text(prelude + "\n" + "\n".join(group))
        procs.append(_start([CXX, *flags, "-c", str(cpp), "-o", str(obj)]))
        objs.append(str(obj))
    for p in procs:
        _finish(p)
    _run([CXX, "-shared", "-fopenmp", *objs, "-o", str(out)])


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p: subprocess.Popen) -> None:
    _, err = p.communicate()
    if p.returncode != 0:
        raise BuildError(f"g++ failed:\n{err[-4000:]}")


def _run(cmd: list[str]) -> None:
    _finish(_start(cmd))


def build(source: str) -> Path:
    """Path of the compiled library for `source`, compiling it if no valid entry exists."""
    key = library_key(source)
    so = kernel_dir() / key[:2] / f"{key}.so"
    sha_file = so.with_suffix(".sha256")
    if _valid(so, sha_file):
        return so
    so.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=so.parent, prefix="build-") as tmp:
        tmp_so = Path(tmp) / "module.so"
        _compile(source, tmp_so, Path(tmp))
        atomic_write(sha_file, _sha(tmp_so.read_bytes()).encode())
        os.replace(tmp_so, so)
    logs.log("kernels", "compiled %s", so)
    return so


def load(source: str, kernels: dict[str, int]) -> dict[str, ctypes._CFuncPtr]:
    """Build (or reuse) and load the library; kernels: name -> number of pointer args."""
    so = build(source)
    try:
        lib = ctypes.CDLL(str(so))
    except OSError:
        so.unlink(missing_ok=True)
        lib = ctypes.CDLL(str(build(source)))
    out = {}
    for name, n in kernels.items():
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * n
        fn.restype = None
        out[name] = fn
    return out
