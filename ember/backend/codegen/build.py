"""Compile C++ with g++ into a shared object, cached on disk by source, flags and target.

Cache entries are written atomically (temp file + rename) so that concurrent processes never
see a partial library, and carry a SHA-256 of the library so that a corrupt or truncated
entry is detected and rebuilt instead of loaded. The key holds the resolved CPU target
(target.identity), so machines sharing a cache directory never load each other's kernels.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ember import config, logs
from ember.backend.codegen import target
from ember.backend.codegen.target import CXX

FLAGS = (
    "-O3",
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


def compiler_id() -> str:
    """Compiler version, flags and the resolved CPU target: part of every cache key."""
    return _compiler_id(config.current().cpu_isa)


@functools.cache
def _compiler_id(isa: str) -> str:
    target.check(isa)
    try:
        out = subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise BuildError(f"no C++ compiler ({CXX}): {e}") from e
    return f"{out.splitlines()[0]} {' '.join(FLAGS)} {target.identity(isa)}"


def _flags() -> tuple[str, ...]:
    return (*FLAGS, *target.flags(config.current().cpu_isa))


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


def _idle_cpus() -> int:
    """CPUs no other process is using (this one's own load counts as one, as it waits on
    g++): several translation units cost more CPU than one (the prelude parsed per unit, a
    link step; ~10-15% for a GPT-2 graph) and only pay where they run side by side. On a
    machine whose cores other processes keep busy they run one after another, slower in
    wall time too than one unit."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    try:
        others = max(os.getloadavg()[0] - 1.0, 0.0)
    except OSError:
        others = 0.0
    return max(1, round(cpus - others))


def _compile(source: str, out: Path, workdir: Path) -> None:
    """g++ the module; with several kernels and idle CPUs, as parallel translation units then
    one link."""
    prelude, *units = source.split(SPLIT)
    n = min(len(units), _idle_cpus(), 4)
    if n <= 1:
        cpp = workdir / "module.cpp"
        cpp.write_text(source)
        _run([CXX, *_flags(), str(cpp), "-o", str(out)])
        return
    objs, procs = [], []
    flags = [f for f in _flags() if f != "-shared"]
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
    """Path of the compiled library for `source`, compiling it if no valid entry exists.
    A cache directory that cannot be written (read-only, full) costs a private build in a
    temporary directory, not a failure."""
    key = library_key(source)
    so = kernel_dir() / key[:2] / f"{key}.so"
    sha_file = so.with_suffix(".sha256")
    if _valid(so, sha_file):
        return so
    try:
        so.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=so.parent, prefix="build-") as tmp:
            tmp_so = Path(tmp) / "module.so"
            _compile(source, tmp_so, Path(tmp))
            atomic_write(sha_file, _sha(tmp_so.read_bytes()).encode())
            os.replace(tmp_so, so)
    except OSError as e:
        logs.log("kernels", "kernel cache not writable (%s); building privately", e)
        return _private_build(source)
    logs.log("kernels", "compiled %s", so)
    return so


@functools.cache
def private_dir() -> Path:
    """This process's own temporary directory (removed at exit), for when the cache
    directory cannot be written."""
    path = Path(tempfile.mkdtemp(prefix="ember-kernels-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _private_build(source: str) -> Path:
    """Compile into this process's own temporary directory (removed at exit)."""
    so = private_dir() / f"{library_key(source)}.so"
    if not so.exists():
        with tempfile.TemporaryDirectory(dir=so.parent) as tmp:
            _compile(source, Path(tmp) / "module.so", Path(tmp))
            os.replace(Path(tmp) / "module.so", so)
    return so


def load(source: str, kernels: dict[str, str]) -> dict[str, ctypes._CFuncPtr]:
    """Build (or reuse) and load the library; kernels: name -> argument kinds ("p" a
    pointer, "s" an int64 size)."""
    so = build(source)
    try:
        lib = ctypes.CDLL(str(so))
    except OSError:
        so.unlink(missing_ok=True)
        lib = ctypes.CDLL(str(build(source)))
    out = {}
    for name, kinds in kernels.items():
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p if k == "p" else ctypes.c_int64 for k in kinds]
        fn.restype = None
        out[name] = fn
    return out
