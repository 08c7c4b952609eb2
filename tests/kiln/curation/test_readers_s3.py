"""Sources on S3: the same readers through pyarrow's S3 filesystem, against moto's server on loopback."""

import gzip
import json

import pytest

from kiln.common.config import Reading, Source
from kiln.curation.documents import Document
from kiln.curation.readers import Quarantined, read_source
from tests.conftest import prose
from tests.s3 import _moto_server, s3_client, s3_endpoint  # noqa: F401 (fixtures)


@pytest.fixture
def s3(s3_endpoint):  # noqa: F811
    client = s3_client(s3_endpoint)
    client.create_bucket(Bucket="corpora")
    return client


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
