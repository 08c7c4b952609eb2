"""A real S3-compatible server for tests: moto's server on a free loopback port, with the standard AWS_*
variables pointing boto3 (and dagster-aws's `S3Resource()`) at it. Import the fixture into a test module:
`from tests.s3 import _moto_server, s3_endpoint  # noqa: F401`."""

import socket
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def _moto_server() -> str:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port())
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_endpoint(_moto_server, monkeypatch) -> str:
    """The endpoint URL of an empty moto S3 server (one server per test session, reset after each test)."""
    import requests

    for key, value in {"AWS_ENDPOINT_URL": _moto_server, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    yield _moto_server
    requests.post(f"{_moto_server}/moto-api/reset", timeout=10)


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


def assert_bucket_holds_every_dataset(client, bucket: str, prefix: str, data: Path, fresh: Path) -> int:
    """Every dataset under the local cache `data` has its manifest on S3, byte for byte, and a Store with an empty
    cache at `fresh` reads every file of every one of them back identical. Returns the number of datasets."""
    from kiln.common.manifest import MANIFEST_NAME
    from kiln.common.remote import S3Remote
    from kiln.common.storage import Store
    from tests.store_files import published_files

    store = Store(fresh, S3Remote.connect(client, bucket, prefix))
    local = sorted(p.parent.relative_to(data) for p in published_files(data) if p.name == MANIFEST_NAME)
    for rel in local:
        key = f"{prefix}/{rel.as_posix()}/{MANIFEST_NAME}"
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert body == (data / rel / MANIFEST_NAME).read_bytes(), key
        asset, partition = rel.parts[0], "/".join(rel.parts[1:])
        partition = None if partition == "_all" else partition
        for f in store.manifest(asset, partition).files:
            assert (store.dataset_dir(asset, partition) / f.path).read_bytes() == (data / rel / f.path).read_bytes(), \
                (rel, f.path)
    return len(local)
