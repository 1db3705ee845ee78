"""Two worker processes on localhost joined in a gloo process group, for the distributed
tests (issue 17).

The workers start once (spawned: each imports torch and ember, seconds on a loaded machine)
and run one program at a time: `Pair.run(fn, *args)` calls `fn(rank, *args)` in both and
returns their results by rank. A program that fails or hangs (one rank waiting in a
collective the other never joins) ends both workers after `timeout` seconds: the next run
starts fresh ones. Each worker destroys its process group when it stops, also after a
failed program; collectives themselves time out after `COLLECTIVE_TIMEOUT`, so no worker
can outlive a stuck test for long.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import queue
import shutil
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
START_TIMEOUT = 300.0


def _serve(rank: int, store: str, tasks: Any, results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # two processes on two cores
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=COLLECTIVE_TIMEOUT
    )
    try:
        import ember

        results.put((rank, True, "ready"))
        while (task := tasks.get()) is not None:
            fn, args = task
            ember.reset()
            torch.manual_seed(0)
            try:
                results.put((rank, True, fn(rank, *args)))
            except BaseException:
                results.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class Pair:
    """Two ranks of a gloo group, started on first use and again after a failure."""

    def __init__(self) -> None:
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._dir: str | None = None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._dir = tempfile.mkdtemp(prefix="ember-dist-")
        store = os.path.join(self._dir, "store")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(2)]
        self._procs = [
            ctx.Process(target=_serve, args=(r, store, self._tasks[r], self._results), daemon=True)
            for r in range(2)
        ]
        for proc in self._procs:
            proc.start()
        self._collect(START_TIMEOUT, "starting the workers")

    def _collect(self, timeout: float, what: str) -> list[Any]:
        got: dict[int, Any] = {}
        failures = []
        while len(got) < 2:
            try:
                rank, ok, value = self._results.get(timeout=timeout)
            except queue.Empty:
                self.close()
                silent = f"{what}: no result from ranks {sorted({0, 1} - set(got))}"
                if failures:
                    raise AssertionError("\n".join([silent, *failures])) from None
                raise TimeoutError(silent) from None
            got[rank] = value
            if not ok:
                failures.append(f"rank {rank}:\n{value}")
                timeout = min(timeout, 30.0)  # the other rank may be stuck in a collective
        if failures:
            self.close()
            raise AssertionError(f"{what} failed\n" + "\n".join(failures))
        return [got[0], got[1]]

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 240.0) -> list[Any]:
        """`fn(rank, *args)` in both workers; their results, by rank."""
        if not self._procs:
            self._start()
        for task in self._tasks:
            task.put((fn, args))
        return self._collect(timeout, f"{fn.__name__}{args}")

    def close(self) -> None:
        """Stop the workers (each destroys its process group); kill what does not stop."""
        for task in self._tasks:
            try:
                task.put(None)
            except (OSError, ValueError):
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs, self._tasks = [], []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
