"""A forkserver process pool on this machine (`engine.backend: processes`), and SERIAL: one part after another
in this process, the library functions' default."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import Pipe, get_context
from multiprocessing.connection import Connection
from typing import Any

from tqdm import tqdm

from kiln.engine.base import STAGE_MODULES, chunks


def worker_pool_context(preload: list[str] = STAGE_MODULES):
    """forkserver, not fork: the caller may be a threaded process (a Dagster step), where fork is unsafe.
    A forkserver is single-threaded and, with the stages' modules preloaded, forks workers that start warm."""
    context = get_context("forkserver")
    context.set_forkserver_preload(preload)
    return context


def _run_chunk(fn, tasks: list) -> list:
    return [fn(task) for task in tasks]


def _exit_with_parent(parent_alive: Connection) -> None:
    """A worker's initializer: exit once the process that made the pool is gone. atexit does not run when that
    process is SIGKILLed (the out-of-memory killer, a hard kill of a Dagster step), and its workers would wait on
    their task queue for ever (they hold its write end too), and with them the forkserver, which waits for every
    holder of its own alive pipe, workers included. `parent_alive` is the read end of a pipe whose only write end
    that process holds: the read returns at the pipe's end, however it ends (launch.py's reaper works the same way)."""

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            parent_alive.recv_bytes()
        os._exit(1)

    threading.Thread(target=watch, name="kiln-parent-watch", daemon=True).start()


@functools.lru_cache(maxsize=4)
def _pool(workers: int) -> ProcessPoolExecutor:
    """One pool per size for the life of the process, reused by every stage (starting one costs ~1-2 s)."""
    parent_alive, alive_while_held = Pipe(duplex=False)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=worker_pool_context(),
                               initializer=_exit_with_parent, initargs=(parent_alive,))
    pool._kiln_alive_while_held = alive_while_held  # type: ignore[attr-defined]  # closed only with the pool
    atexit.register(pool.shutdown, cancel_futures=True)
    return pool


@dataclass(frozen=True)
class ProcessPool:
    """A process pool on this machine: `workers` processes (0: one per core)."""

    workers: int = 0

    def map_parts(self, fn, tasks, *, desc, progress=True, size=None):
        workers = self.workers or os.cpu_count() or 1
        bar = tqdm(total=len(tasks), desc=desc, unit="part", disable=not progress)
        results: list = [None] * len(tasks)
        if workers == 1 or len(tasks) <= 1:
            for i, task in enumerate(tasks):
                results[i] = fn(task)
                bar.update(1)
        else:
            pool = _pool(workers)
            futures = {pool.submit(_run_chunk, fn, [tasks[i] for i in chunk]): chunk
                       for chunk in chunks(tasks, workers, size)}
            try:
                for future in as_completed(futures):
                    chunk = futures[future]
                    for i, result in zip(chunk, future.result()):
                        results[i] = result
                    bar.update(len(chunk))
            except BrokenProcessPool:
                _pool.cache_clear()  # a worker died (OOM, a kill): the next stage gets a fresh pool
                raise
            finally:
                for future in futures:
                    future.cancel()
        bar.close()
        return results

    def describe(self) -> dict[str, Any]:
        return {"engine": "processes", "workers": self.workers or os.cpu_count() or 1}


SERIAL = ProcessPool(workers=1)  # in this process, one part after another: library functions' default
