"""Sources on S3: the same readers through pyarrow's S3 filesystem, against moto's server on loopback."""

import gzip
import json
from pathlib import Path

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


@pytest.mark.parametrize("pattern", ["crawl/web-*.jsonl", "crawl/*.jsonl", "crawl/*/*.jsonl", "crawl/**/*.jsonl",
                                     "crawl/CC-MAIN-2024-*/*.jsonl", "crawl/w?b-[12].jsonl", "crawl", "crawl/web-1.jsonl"])
def test_a_glob_on_s3_names_the_files_it_names_on_local_disk(s3, tmp_path, pattern):
    """The same layout on S3 and on disk, `expand` of the same pattern: local disk (Python's glob, the second
    implementation) is the reference. On S3 a wildcard inside a name (`web-*.jsonl`, CommonCrawl's
    `CC-MAIN-2024-*/`) listed a prefix that is no folder and read nothing, `*` crossed `/` into subfolders, and
    hidden files were read."""
    from kiln.curation.readers.paths import expand

    keys = ["crawl/web-1.jsonl", "crawl/web-2.jsonl", "crawl/sub/web-3.jsonl", "crawl/.hidden.jsonl",
            "crawl/other.jsonl", "crawl/.cache/web-4.jsonl", "crawl/CC-MAIN-2024-10/a.jsonl",
            "crawl/CC-MAIN-2024-10/deep/b.jsonl", "crawl/CC-MAIN-2023-50/c.jsonl"]
    for key in keys:
        s3.put_object(Bucket="corpora", Key=key, Body=b'{"text": "x"}\n')
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_text('{"text": "x"}\n')
    local = [(str(Path(f.uri).relative_to(tmp_path)), f.relative) for f in expand(str(tmp_path / pattern))]
    on_s3 = [(f.uri.removeprefix("s3://corpora/"), f.relative) for f in expand(f"s3://corpora/{pattern}")]
    assert local and on_s3 == local
