"""How long the training loop waits in mlflow.log_metrics at each logging interval: a synchronous call (a round trip to
the tracking server) against MLflow's async queue (what training_jobs.reporting.Reporter.step uses), on a real
`mlflow server` started here on loopback (SQLite store) and stopped by its pid.

    .venv/bin/python bench/mlflow_log_bench.py            # 30 calls of 8 metrics per round, rounds alternating

A call blocks the loop for its whole duration; on a GPU the queued kernels run dry meanwhile when the call outlasts
them. The flush after each round is what Reporter.finish waits for once, at the end of a run.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def serve(folder: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
         "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=1)
            return server, uri
        except OSError:
            time.sleep(0.5)
    server.kill()
    sys.exit("mlflow server did not answer /health within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    with tempfile.TemporaryDirectory(prefix="kiln-mlflow-bench-") as tmp:
        server, uri = serve(Path(tmp))
        try:
            mlflow.set_tracking_uri(uri)
            mlflow.set_experiment("mlflow-log-bench")
            metrics = {f"train/metric_{i}": 1.0 for i in range(8)}
            print(f"machine: {os.cpu_count()} cores, mlflow {mlflow.__version__}, server on loopback (SQLite)")
            with mlflow.start_run():
                for r in range(args.rounds):
                    synchronous = r % 2 == 0
                    waits = []
                    for step in range(args.calls):
                        start = time.perf_counter()
                        mlflow.log_metrics(metrics, step=r * args.calls + step, synchronous=synchronous)
                        waits.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    mlflow.flush_async_logging()
                    flush = time.perf_counter() - start
                    mode = "synchronous" if synchronous else "async queue"
                    print(f"  {mode:12s} median {statistics.median(waits) * 1e3:7.2f} ms a call, max "
                          f"{max(waits) * 1e3:7.2f} ms; flush after the round {flush * 1e3:5.0f} ms")
        finally:
            os.killpg(server.pid, 15)  # the server and the uvicorn worker it started
            server.wait()


if __name__ == "__main__":
    main()
