"""Running a script in a fresh Python process against a given cache directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start(script: str, cache: Path, **env: str) -> subprocess.Popen:
    """Start `python -c script` with EMBER_CACHE_DIR=cache (and `env`), ember importable."""
    full = dict(os.environ, EMBER_CACHE_DIR=str(cache), **env)
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-c", script], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def last_line(p: subprocess.Popen) -> str:
    """The process's last line of output; fails the test if it did not exit cleanly."""
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()[-3000:]
    return out.decode().strip().splitlines()[-1]
