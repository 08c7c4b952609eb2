"""A real redis-server on a free loopback port, with a password (as production Redis has one), started and stopped
by its process. CI installs redis-server (.ci/run) and sets KILN_REQUIRE_REDIS=1: there a missing server fails
the test instead of skipping it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PASSWORD = "kiln-redis-pw-7f3a9c"  # a test secret: no file or output of Kiln's may ever contain it


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """Yields the server's URL, password included."""
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server is not installed (apt-get install redis-server; .ci/run does)"
        if os.environ.get("KILN_REQUIRE_REDIS"):
            pytest.fail(message)
        pytest.skip(message)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--requirepass", PASSWORD, "--dir", str(folder)], stdout=subprocess.DEVNULL)
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    import redis

    client = redis.Redis.from_url(url)
    try:
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail(f"redis-server did not answer on port {port}")
        yield url
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)
