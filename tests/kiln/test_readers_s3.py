"""Sources on S3: the same readers through pyarrow's S3 filesystem, against moto's server on loopback."""

import gzip
import json
import socket

import pytest

from kiln.config import Reading, Source
from kiln.documents import Document
from kiln.readers import Quarantined, read_source
from tests.conftest import prose


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3(monkeypatch):
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="corpora")
    yield client
    server.stop()


def test_jsonl_glob_on_s3_with_a_corrupt_line(s3):
    good = "\n".join(json.dumps({"id": i, "text": prose(i)}) for i in range(3)) + "\n{broken\n"
    s3.put_object(Bucket="corpora", Key="crawl/2026-11/a.jsonl.gz", Body=gzip.compress(good.encode()))
    s3.put_object(Bucket="corpora", Key="crawl/2026-11/b.jsonl", Body=json.dumps({"id": 9, "text": prose(9)}).encode())
    s3.put_object(Bucket="corpora", Key="crawl/2026-11/notes.txt", Body=b"not matched by the glob")
    source = Source(name="crawl", kind="jsonl", path="s3://corpora/crawl/2026-11/*.jsonl*", license="CC-BY",
                    domain="web", profile="prose")
    records = list(read_source(source, Reading()))
    docs = [r for r in records if isinstance(r, Document)]
    bad = [r for r in records if isinstance(r, Quarantined)]
    assert [d.meta["id"] for d in docs] == [0, 1, 2, 9], bad
    assert [(q.reason, q.locator) for q in bad] == [("malformed_json", "a.jsonl.gz#L4")]
