"""One process pool for every per-part stage (filtering, signatures, tokenization)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")
R = TypeVar("R")


def worker_pool_context(preload: str):
    """forkserver, not fork: the caller may be a threaded process (a Dagster step), where fork is unsafe.
    A forkserver is single-threaded and, with the stage's module preloaded, forks workers that start warm."""
    context = get_context("forkserver")
    context.set_forkserver_preload([preload])
    return context


def map_parts(fn: Callable[[T], R], tasks: Sequence[T], *, workers: int = 0, preload: str, desc: str,
              progress: bool = True, size: Callable[[T], int] | None = None) -> list[R]:
    """`fn` over `tasks` in a pool of `workers` processes (0: one per core), results in task order.
    With `size`, the largest tasks start first, so no big part runs alone at the end while others idle."""
    workers = min(workers or os.cpu_count() or 1, max(len(tasks), 1))
    bar = tqdm(total=len(tasks), desc=desc, unit="part", disable=not progress)
    results: list[R | None] = [None] * len(tasks)
    if workers == 1:
        for i, task in enumerate(tasks):
            results[i] = fn(task)
            bar.update(1)
    else:
        order = sorted(range(len(tasks)), key=lambda i: -size(tasks[i])) if size else range(len(tasks))
        with ProcessPoolExecutor(max_workers=workers, mp_context=worker_pool_context(preload)) as pool:
            futures = {pool.submit(fn, tasks[i]): i for i in order}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                bar.update(1)
    bar.close()
    return results
