"""A real two-node Ray cluster on loopback for tests: two raylets (one CPU each) started by `ray start`.

Both nodes bind 127.0.0.2 (Ray rewrites 127.0.0.1 to the machine's external address, 127.0.0.2 it keeps), token
auth is set by environment (never from ~/.ray), and the cluster is stopped by the processes its `ray start`
calls started — found by the cluster's own temp folder in their command lines — never by `ray stop`, which
would stop every Ray on the machine.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
HOST = "127.0.0.2"


@dataclass
class RayCluster:
    temp_dir: Path
    env: dict[str, str]  # what a driver needs: RAY_ADDRESS and the auth token
    address: str = ""
    node_pids: list[set[int]] = field(default_factory=list)  # per node, the processes its `ray start` started
    killed: set[int] = field(default_factory=set)  # nodes whose raylet was killed

    def _processes(self) -> set[int]:
        mine = set()
        for p in psutil.process_iter(["pid", "cmdline"]):
            if any(str(self.temp_dir) in arg for arg in (p.info["cmdline"] or [])):
                mine.add(p.info["pid"])
        return mine

    def start_node(self, head: bool = False, cpus: int = 1) -> None:
        before = self._processes()
        args = ["--head", "--port=0", "--include-dashboard=false"] if head else [f"--address={self.address}"]
        subprocess.run([RAY, "start", *args, f"--num-cpus={cpus}", f"--node-ip-address={HOST}",
                        f"--temp-dir={self.temp_dir}", "--object-store-memory=200000000", "--disable-usage-stats"],
                       env=self.env, check=True, capture_output=True, timeout=120)
        if head:
            self.address = (self.temp_dir / "ray_current_cluster").read_text().strip()
            self.env["RAY_ADDRESS"] = self.address
        self.node_pids.append(self._processes() - before)

    def raylet_pid(self, node: int) -> int:
        """The raylet of node `node` (0: the head)."""
        for pid in self.node_pids[node]:
            try:
                if Path(psutil.Process(pid).exe()).name == "raylet":
                    return pid
            except psutil.NoSuchProcess:
                continue
        raise LookupError(f"node {node} has no live raylet")

    def node_id(self, node: int) -> str:
        """Ray's id of node `node` (its raylet's --node_id)."""
        for arg in psutil.Process(self.raylet_pid(node)).cmdline():
            if arg.startswith("--node_id="):
                return arg.partition("=")[2]
        raise LookupError(f"node {node}'s raylet has no --node_id")

    def live_nodes(self) -> list[int]:
        return [n for n in range(len(self.node_pids)) if n not in self.killed]

    def running_map_task(self, node: int) -> bool:
        """Whether a worker of node `node` is running a part task right now (Ray names the process after the task's
        function while it runs it)."""
        try:
            return any(p.name().startswith("ray::_run_parts") for p in psutil.Process(self.raylet_pid(node)).children())
        except (psutil.NoSuchProcess, LookupError):
            return False

    def kill_node(self, node: int) -> None:
        """SIGKILL a node's raylet, as a machine that dies; its workers lose their raylet and exit."""
        os.kill(self.raylet_pid(node), signal.SIGKILL)
        self.killed.add(node)

    def ensure_nodes(self, nodes: int) -> None:
        """Start worker nodes until `nodes` are alive (after a test killed one, the next gets a fresh one). Counted
        from the nodes this cluster started and killed, not from `ray status`, which can lag behind a new node."""
        for _ in range(nodes - (len(self.node_pids) - len(self.killed))):
            self.start_node()
        deadline = time.monotonic() + 60
        while self.alive_nodes() < nodes:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {nodes}-node Ray cluster did not come up in 60 s")
            time.sleep(1)

    @property
    def newest_node(self) -> int:
        return len(self.node_pids) - 1

    def alive_nodes(self) -> int:
        out = subprocess.run([RAY, "status", f"--address={self.address}"], env=self.env, capture_output=True,
                             text=True, timeout=60).stdout
        active = out.partition("Active:")[2].partition("Pending:")[0]
        return active.count("node_")

    def stop(self) -> None:
        """Stop every process this cluster started (its nodes' daemons and the workers and agents they forked: the
        raylet's agents rename themselves `ray::DashboardAgent`, `ray::RuntimeEnvAgent`, so only their parent finds
        them, and they outlive it)."""
        started = set().union(*self.node_pids) | self._processes()
        started |= {child.pid for p in map(_process_or_none, started) if p for child in _children(p)}
        for pid in started:
            try:
                psutil.Process(pid).terminate()
            except psutil.NoSuchProcess:
                pass
        gone, alive = psutil.wait_procs([p for p in map(_process_or_none, started) if p], timeout=5)
        for p in alive:
            p.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _process_or_none(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def start_cluster(nodes: int = 2) -> RayCluster:
    """`nodes` raylets of one CPU each on 127.0.0.2; the caller stops it (`RayCluster.stop`)."""
    # Short: Ray's socket paths live under it and Unix sockets allow ~107 characters.
    temp_dir = Path(tempfile.mkdtemp(prefix="kr", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           # The GCS declares a killed node dead after 3 missed health checks 1 s apart, not Ray's default 5 checks
           # 3 s apart with a 10 s timeout: a node-loss test saw it dead 6-10 s after the kill, not 15-20 s.
           "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
           "RAY_health_check_failure_threshold": "3"}
    env.pop("RAY_ADDRESS", None)
    cluster = RayCluster(temp_dir, env)
    try:
        cluster.start_node(head=True)
        cluster.ensure_nodes(nodes)
    except BaseException:
        cluster.stop()
        raise
    return cluster
