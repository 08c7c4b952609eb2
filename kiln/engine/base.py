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


# The stages' modules, the dedup kernels (numba's cached code) and pyarrow's dataset reader: ~2 CPU-seconds to
# import. The process pool's forkserver imports them once and forks its workers warm; a Ray worker imports what its
# tasks need on first use (importing all of them in every worker Ray starts cost more: docs/dedup.md). Benches warm
# either engine with `warm_worker` before their clocks.
STAGE_MODULES = ["kiln.curation.pipeline", "kiln.curation.exact_dedup", "kiln.dedup.signing", "kiln.dedup.buckets",
                 "kiln.dedup._kernels", "kiln.quality.scoring", "kiln.tokens.shard_writer", "pyarrow.dataset"]


def warm_worker(_: object = None) -> None:
    for module in STAGE_MODULES:
        importlib.import_module(module)


GUIDED = 2  # a dispatch takes 1 / (GUIDED x workers) of the round's work not yet dispatched


def chunks(tasks: Sequence[T], workers: int, size: Callable[[T], int] | None = None) -> list[list[int]]:
    """The round's task indices as the engine dispatches them: in launch order (the largest first, with `size`), in
    consecutive runs that shrink as the round goes ("guided" scheduling, as OpenMP's). Each run holds 1 / (GUIDED x
    workers) of the work left (by `size`; else tasks weigh the same), and at least one task. A round of thousands of
    small part tasks does not pay the engine's per-task cost (pickling, queues, a Ray task's scheduling) on each,
    and its last runs are single tasks, so the workers still finish together: 182 equal tasks on 2 workers go in 19
    dispatches, the last seven of one task (fixed runs of 1/16 of a worker's share were 37 dispatches, the last of
    two tasks after runs of five)."""
    sizes = [float(size(t)) for t in tasks] if size else [1.0] * len(tasks)
    order = sorted(range(len(tasks)), key=lambda i: -sizes[i]) if size else list(range(len(tasks)))
    left = sum(sizes)
    out, start = [], 0
    while start < len(order):
        target, end, taken = left / (GUIDED * workers), start + 1, sizes[order[start]]
        while end < len(order) and taken + sizes[order[end]] <= target:
            taken += sizes[order[end]]
            end += 1
        out.append(order[start:end])
        left -= taken
        start = end
    return out
