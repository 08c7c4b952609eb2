"""S3 as Kiln's durable store: a bucket and key prefix, reached through any boto3 S3 client.

Dagster-free: the Dagster resource (`resources.storage.KilnStorage`) builds the client from dagster-aws's
`S3Resource`; tests and scripts may pass any `boto3.client("s3")`. `kiln.common.storage.Store` uses these operations
to keep its local folders and S3 in step (and `kiln dedup migrate-index` to fetch an old index's S3 copy). Every download is checked
against the sha256 its manifest records, so a changed or truncated object is refused, never served. An audit that reads
a few columns of a dataset opens its files for ranged reads instead (`RangedObject`): those reads are checked against
the size the manifest records, since a sha256 of the whole object cannot be checked from a part of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRANSFER_THREADS = 8  # concurrent object transfers: S3 throughput comes from parallel requests
LEASE_S = 120.0  # a lock's holder renews it every LEASE_S / 4; one that stopped renewing (died) loses it after this


class StorageError(RuntimeError):
    """S3 storage cannot be used as configured; the message says what to change."""


class MissingBucket(StorageError):
    pass


class CorruptRemoteFile(StorageError):
    """An object on S3 does not match the sha256 its manifest records (changed or truncated after upload)."""


class MissingRemoteFile(StorageError):
    """A manifest lists an object that is not on S3."""


class LockHeld(StorageError):
    """`lock(..., wait=False)` found the lock held by a live holder."""


class LostLock(StorageError):
    """A lock's holder stalled past its lease and another process took the lock over."""


def _error_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


@dataclass(frozen=True)
class S3Remote:
    """Keys `<prefix>/<parts...>` in one bucket. Open it with `connect`, which checks the bucket first."""

    client: Any
    bucket: str
    prefix: str = "kiln"

    @classmethod
    def connect(cls, client: Any, bucket: str, prefix: str = "kiln", create_bucket: bool = False) -> S3Remote:
        """Check that the bucket exists (creating it when `create_bucket`), so a wrong name fails when storage
        is opened, not halfway through a write."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        endpoint = client.meta.endpoint_url
        try:
            client.head_bucket(Bucket=bucket)
        except ClientError as exc:
            code = _error_code(exc)
            if code not in ("404", "NoSuchBucket", "NotFound"):
                hint = "; check the credentials' permissions (s3:ListBucket, GetObject, PutObject, DeleteObject)" \
                    if code in ("403", "AccessDenied") else ""
                raise StorageError(f"storage: S3 bucket {bucket!r} at {endpoint}: {code or exc}{hint}") from None
            if not create_bucket:
                raise MissingBucket(
                    f"storage: S3 bucket {bucket!r} does not exist at {endpoint}. Create it (`aws s3 mb "
                    f"s3://{bucket}`), or set `storage.create_bucket: true` in KILN_CONFIG to let Kiln create it, "
                    f"or fix `storage.bucket`") from None
            region = client.meta.region_name
            extra = {"CreateBucketConfiguration": {"LocationConstraint": region}} \
                if region and region != "us-east-1" else {}
            try:
                client.create_bucket(Bucket=bucket, **extra)
            except ClientError as create_exc:
                if _error_code(create_exc) not in ("BucketAlreadyOwnedByYou",):  # a concurrent create is fine
                    raise StorageError(f"storage: cannot create S3 bucket {bucket!r} at {endpoint}: "
                                       f"{create_exc}") from None
        except NoCredentialsError:
            raise StorageError(f"storage: no AWS credentials for S3 bucket {bucket!r}: set AWS_ACCESS_KEY_ID and "
                               f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the S3 resource's credentials") from None
        except BotoCoreError as exc:
            raise StorageError(f"storage: cannot reach S3 at {endpoint} for bucket {bucket!r} ({exc}); check "
                               f"AWS_ENDPOINT_URL or the S3 resource's endpoint_url") from None
        return cls(client, bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p and p.strip("/"))

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def get_bytes(self, key: str) -> bytes | None:
        """A small object's bytes (a manifest), or None when there is no such key."""
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if _error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    @contextmanager
    def lock(self, key: str, lease_s: float = LEASE_S, wait: bool = True) -> Iterator[Callable[[], None]]:
        """Hold the lock at `key` for every process on every machine that uses the bucket: an object created only
        where there is none (S3 conditional writes: PutObject If-None-Match), renewed while held (If-Match its
        ETag), taken over once its holder has not renewed it for `lease_s` (by S3's clock: no two machines' clocks
        are compared). A live holder is waited for however long it holds, or with `wait=False` refused at once
        (`LockHeld`, naming its host). Yields a check that raises `LostLock` when the lease was lost (this process
        stalled past `lease_s`): call it right before the write it guards."""
        self._check_conditional_writes()
        body = json.dumps({"owner": uuid.uuid4().hex, "host": socket.gethostname()}).encode()
        etag, waited = None, False
        while etag is None:
            etag = self._put_if(key, body, IfNoneMatch="*")
            if etag is None:
                held = self._lock_holder(key)
                if held is not None and held[1] > lease_s:  # its holder stopped renewing it: take it over
                    etag = self._put_if(key, body, IfMatch=held[0])
                if etag is None and not wait and held is not None:
                    holder = json.loads(self.get_bytes(key) or b"{}").get("host", "an unknown host")
                    raise LockHeld(f"{self.url(key)} is held by a process on {holder} (renewed {held[1]:.0f} s "
                                   f"ago; a holder that stops renewing it loses it after {lease_s:.0f} s)")
                if etag is None:
                    if not waited:  # a step that waits says why (in Dagster, its captured stderr)
                        print(f"kiln: waiting for {self.url(key)}: another process is publishing this dataset",
                              file=sys.stderr, flush=True)
                        waited = True
                    time.sleep(min(1.0, lease_s / 8))
        from botocore.exceptions import BotoCoreError, ClientError

        state = {"etag": etag, "lost": False, "renewed": time.monotonic()}
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(lease_s / 4):
                try:
                    renewed = self._put_if(key, body, IfMatch=state["etag"])
                except (BotoCoreError, ClientError):
                    continue  # a network error: tried again, and the lease counts as lost once it is near its end
                if renewed is None:  # another process holds it now
                    state["lost"] = True
                    return
                state["etag"], state["renewed"] = renewed, time.monotonic()

        def check() -> None:
            if state["lost"] or time.monotonic() - state["renewed"] > 0.75 * lease_s:
                raise LostLock(f"{self.url(key)}: this process's hold on the lock lapsed (no renewal within its "
                               f"{lease_s:.0f} s lease) and another may hold it now; nothing more was written. Run "
                               f"the step again")

        renewer = threading.Thread(target=renew, daemon=True, name="kiln-s3-lock")
        renewer.start()
        try:
            yield check
        finally:
            stop.set()
            renewer.join()
            with contextlib.suppress(BotoCoreError, ClientError):  # else it lapses after its lease
                held = self._lock_holder(key)
                if held is not None and held[0] == state["etag"]:  # still ours (not taken over after a stall)
                    self.client.delete_object(Bucket=self.bucket, Key=key)

    def _check_conditional_writes(self) -> None:
        """Refuse an S3-compatible store that ignores conditional writes (every writer would think it holds the
        lock): a second create-if-absent of one key must fail. Once per process and bucket."""
        where = (self.client.meta.endpoint_url, self.bucket)
        if where in _CONDITIONAL_WRITES:
            return
        probe = self.key(f".kiln-probe-{uuid.uuid4().hex}")
        try:
            first, second = (self._put_if(probe, b"", IfNoneMatch="*") for _ in range(2))
        finally:
            self.client.delete_object(Bucket=self.bucket, Key=probe)
        if first is None or second is not None:
            raise StorageError(f"storage: the S3 endpoint {where[0]} ignores conditional writes (PutObject "
                               f"If-None-Match), which Kiln's commit lock needs so that two writers of a dataset on "
                               f"different machines take turns; use AWS S3 or an S3-compatible store that supports "
                               f"them")
        _CONDITIONAL_WRITES.add(where)

    def _put_if(self, key: str, data: bytes, **condition: str) -> str | None:
        """Put `data` at `key` if the condition holds (IfNoneMatch="*", IfMatch=etag): the new ETag, else None."""
        from botocore.exceptions import ClientError

        try:
            return self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **condition)["ETag"]
        except ClientError as exc:
            # 412: the condition failed; 409: a concurrent conditional write to the key won; 404: IfMatch on none
            if _error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey",
                                    "404"):
                return None
            raise

    def _lock_holder(self, key: str) -> tuple[str, float] | None:
        """The lock object's ETag and how many seconds ago it was last renewed (S3's Date less its Last-Modified),
        or None when there is none."""
        from botocore.exceptions import ClientError
        from email.utils import parsedate_to_datetime

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        now = parsedate_to_datetime(head["ResponseMetadata"]["HTTPHeaders"]["date"])
        return head["ETag"], (now - head["LastModified"]).total_seconds()

    def upload_files(self, items: list[tuple[Path, str]]) -> None:
        """Upload (local path, key) pairs in parallel (large files as multipart uploads)."""
        _parallel(lambda item: self.client.upload_file(str(item[0]), self.bucket, item[1]), items)

    def download_files(self, items: list[tuple[str, Path, str]]) -> None:
        """Download (key, local path, sha256) triples in parallel, each verified while it streams."""
        _parallel(lambda item: self._download_verified(*item), items)

    def _download_verified(self, key: str, dest: Path, sha256: str) -> None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except ClientError as exc:
            if _error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                raise MissingRemoteFile(f"{self.url(key)} is listed in its manifest but is not on S3") from None
            raise
        h = hashlib.sha256()
        dest.parent.mkdir(parents=True, exist_ok=True)  # a dataset's subfolders, an old index's segments
        with open(dest, "wb") as f:
            for chunk in body.iter_chunks(1 << 20):
                h.update(chunk)
                f.write(chunk)
        if h.hexdigest() != sha256:
            dest.unlink(missing_ok=True)
            raise _changed(f"{self.url(key)}: sha256 {h.hexdigest()} does not match the manifest's {sha256}")

    def open_ranged(self, key: str, size: int, sha256: str) -> RangedObject:
        """The object at `key`, which its manifest says is `size` bytes with this sha256, opened for ranged reads
        (nothing is fetched until read)."""
        return RangedObject(self, key, size, sha256)

    def get_range(self, key: str, start: int, length: int, size: int) -> bytes:
        """`length` bytes of the object at `key` from `start`, one GET; refused when the object is not the `size`
        bytes its manifest records (truncated or replaced) or is gone (MissingRemoteFile: a newer version replaced
        it)."""
        from botocore.exceptions import ClientError

        try:
            reply = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")
        except ClientError as exc:
            if _error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                raise MissingRemoteFile(f"{self.url(key)} is listed in its manifest but is not on S3") from None
            if _error_code(exc) != "InvalidRange":  # past the end: a shorter object than the manifest's
                raise
            reply = None
        total = reply and reply.get("ContentRange", "").rpartition("/")[2]
        data = reply["Body"].read() if reply else b""
        if total != str(size) or len(data) != length:
            raise _changed(f"{self.url(key)} is not the {size} bytes its manifest records (S3 says {total or 'fewer'})")
        return data

    def list_keys(self, prefix: str) -> list[str]:
        """Every key below `prefix/` (a folder: `a/b` never matches `a/bc/...`)."""
        keys = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                          Prefix=prefix.rstrip("/") + "/"):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def listing(self, prefix: str) -> tuple[list[str], list[str]]:
        """The names of the objects and of the folders right below `prefix/` (S3's delimiter listing: nothing deeper
        is listed)."""
        files, folders = [], []
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix.rstrip("/") + "/" if prefix.strip("/") else "", Delimiter="/"):
            files += [o["Key"].rsplit("/", 1)[-1] for o in page.get("Contents", [])]
            folders += [p["Prefix"].rstrip("/").rsplit("/", 1)[-1] for p in page.get("CommonPrefixes", [])]
        return files, folders

    def delete_keys(self, keys: Iterable[str], before_each: Callable[[], None] | None = None) -> None:
        """Delete `keys`; `before_each` is called before each request (a lock's check, which raises once it lapsed)."""
        keys = list(keys)
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            if before_each is not None:
                before_each()
            reply = self.client.delete_objects(Bucket=self.bucket, Delete={
                "Objects": [{"Key": k} for k in keys[start:start + 1000]], "Quiet": True})
            if reply.get("Errors"):
                raise StorageError(f"storage: could not delete {len(reply['Errors'])} stale object(s) from "
                                   f"s3://{self.bucket}: {reply['Errors'][:3]}")


def _changed(what: str) -> CorruptRemoteFile:
    return CorruptRemoteFile(f"{what}; the object was changed or truncated after Kiln wrote it. Restore it, or "
                             f"materialize that dataset again")


class RangedObject(io.RawIOBase):
    """An S3 object read by ranged GETs, as a file (seek and read) that pyarrow's Parquet reader opens: it reads the
    footer, then only the column chunks asked for, so a reader of the doc_id column fetches about 32 bytes a
    document and leaves the texts on S3. Each read is one GET (S3Remote.get_range: checked against the manifest's
    size). An object of at most WHOLE_BYTES (a Parquet reader's first read of the footer is 64 kB) comes whole at
    the first read, in one GET, checked against its sha256. `fetched` counts the bytes read."""

    WHOLE_BYTES = 256 * 1024

    def __init__(self, remote: S3Remote, key: str, size: int, sha256: str):
        super().__init__()
        self.remote, self.key, self.size, self.sha256 = remote, key, size, sha256
        self.position = self.fetched = 0
        self._whole: bytes | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence] + offset
        return self.position

    def readall(self) -> bytes:
        """The rest of the object in one read (not io's default of 8 kB reads: a GET each)."""
        buffer = bytearray(max(0, self.size - self.position))
        return bytes(buffer[:self.readinto(buffer)])

    def readinto(self, buffer) -> int:
        length = max(0, min(len(buffer), self.size - self.position))
        if not length:
            return 0
        if self._whole is None and self.size <= self.WHOLE_BYTES:
            whole = self.remote.get_range(self.key, 0, self.size, self.size)
            self.fetched += self.size
            if (found := hashlib.sha256(whole).hexdigest()) != self.sha256:  # never served, not on a second read either
                raise _changed(f"{self.remote.url(self.key)}: sha256 {found} does not match the manifest's "
                               f"{self.sha256}")
            self._whole = whole
        if self._whole is not None:
            buffer[:length] = self._whole[self.position:self.position + length]
        else:
            buffer[:length] = self.remote.get_range(self.key, self.position, length, self.size)
            self.fetched += length
        self.position += length
        return length


_CONDITIONAL_WRITES: set[tuple[str, str]] = set()  # (endpoint, bucket) found to honour conditional writes


def in_order(fn: Callable[[Any], Any], items: Iterable, threads: int = TRANSFER_THREADS) -> Iterator[Any]:
    """`fn` of each item, yielded in the items' order, computed `threads` items ahead: reads of many S3 objects overlap
    their latency, and a reader that stops early (found what it looked for) leaves at most `threads` reads behind."""
    with ThreadPoolExecutor(threads) as pool:
        pending = []
        items = iter(items)
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= threads:
                    yield pending.pop(0).result()
            while pending:
                yield pending.pop(0).result()
        finally:
            for future in pending:
                future.cancel()


def _parallel(fn: Callable[[Any], None], items: list) -> None:
    """Run `fn` on every item on a few threads; the first failure is raised once the others stop."""
    if len(items) <= 1:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(min(TRANSFER_THREADS, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
