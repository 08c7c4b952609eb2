"""The engine: where per-part work runs, Ray (embedded, or a cluster) or a local process pool; the same
input gives byte-identical output on any engine and worker count. Used by every per-document stage's asset
(curation, minhash, quality scores, token shards) through the `KilnEngine` resource; `engine_for` picks one.
"""

from kiln.engine.base import Engine, EngineError
from kiln.engine.process_pool import SERIAL, ProcessPool
from kiln.engine.ray_engine import RayEngine, check_reachable, shared_local_ray, shutdown

__all__ = ["SERIAL", "Engine", "EngineError", "ProcessPool", "RayEngine", "check_reachable", "engine_for",
           "shared_local_ray", "shutdown"]


def engine_for(settings) -> Engine:
    """The engine the project config's `engine:` section names (a `kiln.common.config.EngineSettings`)."""
    if settings.backend == "processes":
        return ProcessPool(settings.workers)
    return RayEngine(settings.ray_address, settings.workers)
