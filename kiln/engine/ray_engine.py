"""Ray: part tasks run as plain Ray tasks of one CPU (retried whole by Ray when its worker or node dies; a part's
output name does not depend on where or how often it ran), at most `workers` running at once, the largest first. A Ray
task costs about 4.5 ms of driver and raylet CPU (measured: 801 exact-dedup tasks), half the work of a small part's
task, so a round runs its tasks in chunks of consecutive ones in launch order, shrinking to single tasks at the end
so that the workers finish together (`base.chunks`). Not Ray Data:
a round of part tasks is no dataset (workers read and write the store themselves, the driver gets small results),
and a Ray Data job per round cost planning, an executor thread and about twice the pool's CPU per MB. Address:
`engine.ray_address` (`auto` or `host:port`), else Ray's own `RAY_ADDRESS`, else an embedded local Ray started once
per process and reused by every stage (Ray stops it at interpreter exit)."""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from kiln.common.secrets import redact, redact_url
from kiln.engine.base import EngineError, chunks

ADDRESS_KEY = "engine.ray_address"


def check_reachable(address: str, origin: str) -> None:
    """Fail in seconds, naming the setting, instead of Ray's minute of connection retries."""
    if address.startswith("ray://"):
        raise EngineError(
            f"{origin} = {redact_url(address)!r} is a Ray Client address; Kiln joins the cluster as a driver, "
            "which Ray recommends over Ray Client for data and ML work. Use the cluster's GCS address instead: 'host:6379' (KubeRay: the head "
            "service, e.g. 'raycluster-head-svc:6379'), or 'auto' on a node of the cluster")
    if address == "auto" or address.startswith("local"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise EngineError(f"{origin} = {redact_url(address)!r} is not 'auto' or 'host:port' "
                          "(the head node's GCS address, port 6379 by default)")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise EngineError(
            f"{origin} = {redact_url(address)!r}: no Ray cluster answers there ({exc.strerror or exc}). "
            f"Start one (`ray start --head`), correct {origin}, or unset it (and RAY_ADDRESS) to run on an "
            "embedded local Ray") from None


@dataclass
class _Session:
    address: str | None  # what was asked (None: embedded)
    gcs_address: str
    dashboard_url: str | None
    num_cpus: int | None = None  # an embedded Ray's logical CPUs (None: a cluster's, not ours to size)


_session: _Session | None = None


def connect(address: str | None, origin: str = ADDRESS_KEY, num_cpus: int | None = None) -> _Session:
    """Connect this process to Ray once: to `address`, or start an embedded local Ray when it is None.
    Later calls for the same address reuse the connection, so every stage of a process shares one Ray; an
    embedded one is started again, larger, for a call asking more workers than it has CPUs."""
    global _session
    import ray

    if address:
        check_reachable(address, origin)
    # Logical CPUs of an embedded Ray: at least one per requested worker, so `workers` means the same on any machine.
    cpus = max(os.cpu_count() or 1, num_cpus or 0) if address is None else None
    if _session is not None and ray.is_initialized():
        same = address in (_session.address, _session.gcs_address)  # the same Ray (an embedded one by its address)
        if same and (cpus is None or _session.num_cpus is None or cpus <= _session.num_cpus):
            return _session
        # another address than this process's Ray (the engine asked for is the engine used), or an embedded Ray too
        # small for the workers asked: they would run fewer at a time than `workers` says
        shutdown()
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING,
                               "configure_logging": True}
    if cpus is not None:
        options |= {"num_cpus": cpus}
    try:
        context = ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise EngineError(
            f"{origin} = {redact_url(address)!r}: could not join the Ray cluster: {redact(str(exc))}. If the "
            "cluster uses token authentication, set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) "
            "as on its nodes") from None
    _session = _Session(address, context.address_info.get("gcs_address", ""), context.dashboard_url or None, cpus)
    return _session


# Ray's default for tasks: a task whose worker or node dies is run again elsewhere, up to this many times; an
# exception raised by the task itself is not retried (it would fail the same way).
NODE_FAILURE_RETRIES = 3


def _run_part(fn: Callable, task: Any, nodes: int) -> Any:
    try:
        return fn(task)
    except FileNotFoundError as exc:
        # Only a missing file on a cluster of several nodes may be a store that is not shared; any other such error
        # (one machine, or one raised with a message and no file name) is the task's own, kept as it was raised.
        if exc.filename is None or nodes < 2:
            raise
        raise EngineError(f"{exc} (on Ray node {socket.gethostname()}, one of {nodes}). Workers read and write the "
                          "store themselves, so KILN_HOME must be one shared filesystem mounted at the same path on "
                          "every node") from exc


def _run_parts(fn: Callable, tasks: list, nodes: int) -> list:
    return [_run_part(fn, task, nodes) for task in tasks]


@functools.cache
def _remote_parts():
    import ray

    return ray.remote(num_cpus=1, max_retries=NODE_FAILURE_RETRIES, retry_exceptions=False)(_run_parts)


@dataclass(frozen=True)
class RayEngine:
    """Ray: `address` (`auto`, `host:port`), else `RAY_ADDRESS`, else an embedded local Ray; `workers`
    concurrent part tasks of one CPU each (0: as many as the cluster has CPUs)."""

    address: str | None = None
    workers: int = 0

    @property
    def origin(self) -> str:
        return ADDRESS_KEY if self.address else "RAY_ADDRESS"

    @property
    def target(self) -> str | None:
        return self.address or os.environ.get("RAY_ADDRESS") or None

    def session(self) -> _Session:
        return connect(self.target, self.origin, num_cpus=self.workers or None)

    def map_parts(self, fn, tasks, *, desc, progress=True, size=None):
        self.session()
        import ray

        if not tasks:
            return []
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        workers = self.workers or cpus
        run = _remote_parts()
        shared_fn = ray.put(fn)  # serialized once per round, not once per task
        nodes = len([n for n in ray.nodes() if n["Alive"]])
        queue = iter(chunks(tasks, workers, size))
        # In flight: `workers` (back-pressure, and `workers` means concurrency), or twice that when the cluster's CPUs
        # already cap the concurrency at `workers` (each task takes one): a worker that finishes a chunk then finds the
        # next one queued at its lease instead of idling for a round trip to the driver (at 1M documents, near dedup's
        # 560 chunks left two workers 5.5-6.7 worker-seconds idle, 0.8 on the process pool).
        in_flight = 2 * workers if workers >= cpus else workers
        running: dict = {}  # ObjectRef -> its task indices

        def launch() -> None:
            chunk = next(queue, None)
            if chunk is not None:
                running[run.remote(shared_fn, [tasks[i] for i in chunk], nodes)] = chunk

        results: list = [None] * len(tasks)
        with tqdm(total=len(tasks), desc=desc, unit="part", disable=not progress) as bar:
            try:
                for _ in range(in_flight):
                    launch()
                while running:
                    done, _ = ray.wait(list(running), num_returns=1)
                    chunk = running.pop(done[0])
                    for i, result in zip(chunk, ray.get(done[0])):  # a task's own exception is raised here, as its type
                        results[i] = result
                    launch()
                    bar.update(len(chunk))
            finally:
                for ref in running:  # a failed round stops its other tasks instead of leaving them to run on
                    ray.cancel(ref)
        return results

    def describe(self) -> dict[str, Any]:
        session = self.session()
        import ray

        described = {"engine": "ray", "address": redact_url(session.address) or "embedded",
                     "gcs_address": session.gcs_address, "nodes": len([n for n in ray.nodes() if n["Alive"]]),
                     "workers": self.workers or int(ray.cluster_resources().get("CPU", 1))}
        if session.dashboard_url:
            described["dashboard"] = session.dashboard_url if "://" in session.dashboard_url \
                else f"http://{session.dashboard_url}"
        return described


@contextmanager
def shared_local_ray(settings) -> Iterator[None]:
    """One embedded Ray for this process and the processes it starts (Dagster's step processes, which would each
    start their own): started here, its address handed down as RAY_ADDRESS, stopped on exit. Nothing to do when
    the backend is not Ray or a cluster is named (`engine.ray_address`, RAY_ADDRESS)."""
    if settings.backend != "ray" or settings.ray_address or os.environ.get("RAY_ADDRESS"):
        yield
        return
    session = connect(None, num_cpus=settings.workers or None)
    os.environ["RAY_ADDRESS"] = session.gcs_address
    try:
        yield
    finally:
        os.environ.pop("RAY_ADDRESS", None)
        shutdown()


def shutdown() -> None:
    """Leave Ray: an embedded Ray stops with it (Ray also does this at interpreter exit)."""
    global _session
    if _session is not None:
        import ray

        ray.shutdown()
        _session = None
