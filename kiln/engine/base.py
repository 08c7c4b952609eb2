"""What every engine is: `map_parts` over per-part tasks, results in task order, and `describe`.

Every per-document stage is a function of one task (one input Parquet part → its output parts, named by
the input part's position, never by arrival order) that reads and writes the store itself, so the driver
holds task descriptions and small per-part results, never documents. The engine only decides where those
functions run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")

class EngineError(RuntimeError):
    """The engine cannot start or connect; the message names the setting, what was tried and the fix."""


class Engine(Protocol):
    workers: int

    def map_parts(self, fn: Callable[[T], R], tasks: Sequence[T], *, desc: str, progress: bool = True,
                  size: Callable[[T], int] | None = None) -> list[R]:
        """`fn` over `tasks`, results in task order. With `size`, the largest tasks start first, so no big
        part runs alone at the end while the other workers idle."""

    def describe(self) -> dict[str, Any]:
        """What ran the stage, for metadata and manifests' stats: engine, address (no credentials), workers."""


def launch_order(tasks: Sequence[T], size: Callable[[T], int] | None) -> list[int]:
    return sorted(range(len(tasks)), key=lambda i: -size(tasks[i])) if size else list(range(len(tasks)))


# The stages' modules, the dedup kernels (numba's cached code) and pyarrow's dataset reader: ~2 CPU-seconds to
# import. The process pool's forkserver imports them once and forks its workers warm; a Ray worker imports what its
# tasks need on first use (importing all of them in every worker Ray starts cost more: docs/dedup.md). Benches warm
# either engine with `warm_worker` before their clocks.
STAGE_MODULES = ["kiln.curation.pipeline", "kiln.curation.exact_dedup", "kiln.dedup.signing", "kiln.dedup.buckets",
                 "kiln.dedup._kernels", "kiln.quality.scoring", "kiln.tokens.shard_writer", "pyarrow.dataset"]


def warm_worker(_: object = None) -> None:
    for module in STAGE_MODULES:
        importlib.import_module(module)


CHUNKS_PER_WORKER = 16


def chunks(order: list[int], workers: int) -> list[list[int]]:
    """The launch order in consecutive runs, one per dispatch: at least CHUNKS_PER_WORKER per worker (one task each
    when that few), so a round of thousands of small part tasks does not pay the engine's per-task cost (pickling,
    queues, a Ray task's scheduling) on each, and the workers still finish together."""
    per = max(1, len(order) // (workers * CHUNKS_PER_WORKER))
    return [order[i:i + per] for i in range(0, len(order), per)]
