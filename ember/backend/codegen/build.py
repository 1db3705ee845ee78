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
import threading
import time
import weakref
from collections.abc import Callable
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


_window: list[tuple[float, tuple[int, int]]] = []
"""When the compile now under way began (`begin`): monotonic seconds, /proc/stat's (idle,
total) jiffies."""
MAX_WINDOW_S = 10.0  # an older window says little about now


def _cpu_jiffies() -> tuple[int, int] | None:
    """(idle + iowait, total) jiffies of the machine's CPUs so far, if /proc/stat says."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[3] + fields[4], sum(fields)) if len(fields) >= 5 else None


def begin(restart: bool = True) -> None:
    """Start measuring how idle the machine's other CPUs are while this process compiles (up
    to g++): `restart=False` keeps a window already open (an aot graph inside the backend
    call that opened one)."""
    if restart or not _window or time.monotonic() - _window[0][0] > MAX_WINDOW_S:
        now = _cpu_jiffies()
        _window[:] = [(time.monotonic(), now)] if now is not None else []


MIN_WINDOW = 6
"""Jiffies per CPU a window needs (60 ms at 100 Hz) to be read as a measurement."""


def _idle_cpus() -> int:
    """CPUs g++ may use: this process's (it waits on g++) and those idle while it compiled.
    Several translation units cost more CPU than one (the prelude parsed per unit, a link
    step; ~10-15% for a GPT-2 graph) and only pay where they run side by side. Idle is what
    /proc/stat saw since `begin` (the load average counts this process's own recent work,
    a run of the model with two threads just before, as other processes' load: a quiet
    machine read as a busy one); without a window, the load average less this process."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    fresh = _window and time.monotonic() - _window[0][0] <= MAX_WINDOW_S
    start, now = (_window[0][1] if fresh else None), _cpu_jiffies()
    _window.clear()
    machine = os.cpu_count() or 1
    if start is not None and now is not None and now[1] - start[1] >= MIN_WINDOW * machine:
        idle = machine * (now[0] - start[0]) / (now[1] - start[1])
        return max(1, min(cpus, 1 + int(idle + 0.3)))
    try:
        others = max(os.getloadavg()[0] - 1.0, 0.0)
    except OSError:
        others = 0.0
    return max(1, round(cpus - others))


def _start_compile(source: str, out: Path, workdir: Path) -> Callable[[], None]:
    """Start g++ on the module (with several kernels and idle CPUs, as parallel translation
    units); returns what finishes it (waits, then links the units)."""
    prelude, *units = source.split(SPLIT)
    n = min(len(units), _idle_cpus(), 4)
    if n <= 1:
        cpp = workdir / "module.cpp"
        cpp.write_text(source)
        one = _start([CXX, *_flags(), str(cpp), "-o", str(out)])
        return lambda: _finish(one)
    objs, procs = [], []
    flags = [f for f in _flags() if f != "-shared"]
    for i, group in enumerate(_groups(units, n)):
        cpp, obj = workdir / f"part{i}.cpp", workdir / f"part{i}.o"
        cpp.write_text(prelude + "\n" + "\n".join(group))
        procs.append(_start([CXX, *flags, "-c", str(cpp), "-o", str(obj)]))
        objs.append(str(obj))

    def link() -> None:
        for p in procs:
            _finish(p)
        _run([CXX, "-shared", "-fopenmp", *objs, "-o", str(out)])

    return link


def _compile(source: str, out: Path, workdir: Path) -> None:
    """g++ the module into `out` (see `_start_compile`)."""
    _start_compile(source, out, workdir)()


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p: subprocess.Popen) -> None:
    _, err = p.communicate()
    if p.returncode != 0:
        raise BuildError(f"g++ failed:\n{err[-4000:]}")


def _run(cmd: list[str]) -> None:
    _finish(_start(cmd))


class Pending:
    """A library g++ may still be building: `wait()` gives its path. Started by `start`, so
    that a caller has the compiler run while it does other work (the wrapper, the capture's
    guards and bytecode) and waits only where it needs the kernels."""

    def __init__(self, source: str, so: Path, finish: Callable[[], Path] | None) -> None:
        self.source, self.so, self._finish = source, so, finish
        self._lock = threading.Lock()  # two threads' first calls: one waits for the other

    @property
    def done(self) -> bool:
        """Whether `wait` returns at once (the library was in the cache)."""
        return self._finish is None

    def wait(self) -> Path:
        """The library's path, once built (raises BuildError if g++ failed)."""
        with self._lock:
            if self._finish is not None:
                self.so = self._finish()
                self._finish = None
        return self.so


def start(source: str) -> Pending:
    """Start building the library for `source` unless a valid entry exists. A cache
    directory that cannot be written costs a private build in a temporary directory (at
    once), not a failure."""
    key = library_key(source)
    so = kernel_dir() / key[:2] / f"{key}.so"
    sha_file = so.with_suffix(".sha256")
    if _valid(so, sha_file):
        return Pending(source, so, None)
    try:
        so.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=so.parent, prefix="build-"))
    except OSError as e:
        logs.log("kernels", "kernel cache not writable (%s); building privately", e)
        return Pending(source, _private_build(source), None)
    try:
        link = _start_compile(source, tmp / "module.so", tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    def finish() -> Path:
        try:
            link()
            atomic_write(sha_file, _sha((tmp / "module.so").read_bytes()).encode())
            os.replace(tmp / "module.so", so)
        except OSError as e:
            logs.log("kernels", "kernel cache not writable (%s); building privately", e)
            return _private_build(source)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        logs.log("kernels", "compiled %s", so)
        return so

    pending = Pending(source, so, finish)
    weakref.finalize(pending, shutil.rmtree, tmp, True)  # never waited for: no litter
    return pending


def build(source: str) -> Path:
    """Path of the compiled library for `source`, compiling it if no valid entry exists."""
    return start(source).wait()


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
    return open_library(start(source), kernels)


def open_library(pending: Pending, kernels: dict[str, str]) -> dict[str, ctypes._CFuncPtr]:
    """Wait for a started build and load its kernels (see `load`)."""
    so = pending.wait()
    try:
        lib = ctypes.CDLL(str(so))
    except OSError:
        so.unlink(missing_ok=True)
        lib = ctypes.CDLL(str(build(pending.source)))
    out = {}
    for name, kinds in kernels.items():
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p if k == "p" else ctypes.c_int64 for k in kinds]
        fn.restype = None
        out[name] = fn
    return out
