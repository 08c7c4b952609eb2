"""Corpus refreshes: each arrival of new raw data is a *refresh*, and every document dataset is kept per
(source, refresh), so a refresh flows through the same gates without reprocessing what came before.

- The first refresh reads the sources as configured (`sources[].path` or the builtin corpus).
- Later refreshes read the files that landed under `<landing>/<source>/` (a local folder or an S3 prefix)
  since the previous one. `pending_files` lists them; `register_refresh` records them as a new refresh
  (`next_refresh` does both, for the landing sensor, the refresh schedule and the demo).
- The registry is a dataset of the store (`refreshes/_all/refreshes.json`, written atomically with a
  manifest like every dataset), so which files made up a refresh is part of the lineage, on S3 too.
  Dagster's dynamic `refresh` partitions mirror it; the store is the source of truth.

A dataset of one source in one refresh lives at `<asset>/<source>/<refresh>/` (`partition(...)`);
datasets of one refresh over every source (the dedup index, the token shards) at `<asset>/<refresh>/`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pyarrow import fs as pafs

from kiln.common.config import ProjectConfig, Source
from kiln.common.manifest import Manifest, now_utc, sha256_file
from kiln.common.storage import IncompleteDataset, Snapshot, Store
from kiln.curation.readers.paths import SourceFile, expand

REFRESHES, REFRESHES_FILE = "refreshes", "refreshes.json"
KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
TRIGGERS = ("initial", "sensor", "schedule", "cli", "ui")


class RefreshError(ValueError):
    """A refresh that cannot be registered or found; the message says why and what to do."""


@dataclass(frozen=True)
class LandedFile:
    """A file under `<landing>/<source>/`: its identity is (uri, bytes, modified), so a file replaced in
    place with new content lands again as part of the next refresh."""

    uri: str
    relative: str  # below <landing>/<source>/: the locator of its records
    bytes: int
    modified: str  # ISO time of the last modification (local mtime or S3 LastModified)
    sha256: str | None = None  # recorded for the first refresh's local files (see `pin_sources`)

    @property
    def identity(self) -> tuple[str, int, str]:
        return self.uri, self.bytes, self.modified


@dataclass(frozen=True)
class Refresh:
    key: str
    created_at: str
    trigger: str  # initial | sensor | schedule | cli
    files: dict[str, list[LandedFile]] | None  # source -> landed files; None: the sources as configured
    # The first refresh: the configured sources' files as they were when it was registered (`pin_sources`), so
    # re-reading it later reads the same data or fails naming the file that changed. None: builtin sources only,
    # or a registry written before pins existed.
    pinned: dict[str, list[LandedFile]] | None = None

    @property
    def is_initial(self) -> bool:
        return self.files is None

    def files_of(self, source: str) -> list[LandedFile]:
        return [] if self.files is None else self.files.get(source, [])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Refresh:
        files, pinned = data.get("files"), data.get("pinned")
        return cls(data["key"], data["created_at"], data["trigger"],
                   None if files is None else {s: [LandedFile(**f) for f in fs] for s, fs in files.items()},
                   None if pinned is None else {s: [LandedFile(**f) for f in fs] for s, fs in pinned.items()})


def partition(source: str, refresh: str) -> str:
    """The store partition of one source's dataset in one refresh."""
    return f"{source}/{refresh}"


# ------------------------------------------------------------------------------------------- registry

def load_refreshes(store: Store) -> list[Refresh]:
    """Every registered refresh, oldest first (empty before the first one)."""
    snap = store.snapshot_or_none(REFRESHES)  # one pinned version (a registration meanwhile swaps the link)
    if snap is None:
        return []
    data = json.loads((snap.folder / REFRESHES_FILE).read_text(encoding="utf-8"))
    return [Refresh.from_dict(r) for r in data["refreshes"]]


def get_refresh(store: Store, key: str, refreshes: list[Refresh] | None = None) -> Refresh:
    refreshes = load_refreshes(store) if refreshes is None else refreshes
    for r in refreshes:
        if r.key == key:
            return r
    known = ", ".join(r.key for r in refreshes) or "none yet"
    raise RefreshError(f"no refresh {key!r} in {store.root}; registered refreshes: {known} (a refresh is registered "
                       f"by the landing sensor, the refresh schedule, `make demo`, or a partition added in the UI)")


def upto(refreshes: list[Refresh], key: str) -> list[Refresh]:
    """The refreshes up to and including `key`, oldest first: what a refresh's token shards are built from."""
    keys = [r.key for r in refreshes]
    if key not in keys:
        raise RefreshError(f"no refresh {key!r}; registered refreshes: {', '.join(keys) or 'none yet'}")
    return refreshes[:keys.index(key) + 1]


def new_key(refreshes: list[Refresh], today: dt.date | None = None) -> str:
    """The UTC date, with `.2`, `.3`, ... for further refreshes on the same day: keys that read well in the UI."""
    base = (today or dt.datetime.now(dt.timezone.utc).date()).isoformat()
    taken = {r.key for r in refreshes}
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}.{n}"
    return key


def register_refresh(store: Store, files: dict[str, list[LandedFile]] | None, trigger: str,
                     key: str | None = None, pinned: dict[str, list[LandedFile]] | None = None) -> Refresh:
    """Append a refresh to the registry (rewritten atomically, under the registry's lock). `files=None` registers
    the first refresh: the sources as configured (their files as `pinned`)."""
    with store.registry_lock(REFRESHES):
        return _register(store, files, trigger, key, pinned)


def _register(store: Store, files: dict[str, list[LandedFile]] | None, trigger: str, key: str | None,
              pinned: dict[str, list[LandedFile]] | None = None) -> Refresh:
    """register_refresh, with the registry's lock held by the caller."""
    if trigger not in TRIGGERS:
        raise RefreshError(f"unknown trigger {trigger!r}; expected one of {', '.join(TRIGGERS)}")
    refreshes = load_refreshes(store)
    if files is None and refreshes:
        raise RefreshError(f"the first refresh ({refreshes[0].key}) is already registered; later refreshes read "
                           f"landed files")
    if files is not None and not refreshes:
        raise RefreshError("no first refresh yet: register the configured sources first (`make demo`, or the "
                           "landing sensor's first tick)")
    if files is not None and not any(files.values()):
        raise RefreshError("a refresh needs at least one landed file")
    key = key or new_key(refreshes)
    if not KEY_PATTERN.match(key):
        raise RefreshError(f"refresh key {key!r}: use 1-63 letters, digits, '.', '_' or '-', starting with a letter "
                           f"or digit")
    if any(r.key == key for r in refreshes):
        raise RefreshError(f"refresh {key!r} is already registered; choose another key")
    refresh = Refresh(key, now_utc(), trigger, files, pinned if files is None else None)
    _write(store, refreshes + [refresh])
    return refresh


def _write(store: Store, refreshes: list[Refresh]) -> None:
    with store.staging(REFRESHES) as writer:
        (writer.dir / REFRESHES_FILE).write_text(
            json.dumps({"refreshes": [r.to_dict() for r in refreshes]}, indent=2, ensure_ascii=False), encoding="utf-8")
        writer.commit(code_version="kiln.refresh", config={}, inputs={},
                      counts={"refreshes": len(refreshes),
                              "landed_files": sum(len(fs) for r in refreshes for fs in (r.files or {}).values())})


READ = "raw_documents"  # a source's documents as a refresh read them: there once its intake ran


def materialized(store: Store, asset: str, sources: list[str], refreshes: list[Refresh] | None = None,
                 ) -> dict[str, Snapshot]:
    """Store partition -> the current version of `asset` (pinned: its manifest and files of one version) for each
    source in each refresh (default: every registered one), source by source, oldest refresh first; datasets not
    materialized are left out."""
    refreshes = load_refreshes(store) if refreshes is None else refreshes
    return {p: m for s in sources for r in refreshes
            if (m := store.snapshot_or_none(asset, p := partition(s, r.key))) is not None}


def unmaterialized(store: Store, asset: str, sources: list[str], refreshes: list[Refresh]) -> list[str]:
    """The partitions of a per-source `asset` these refreshes should hold and do not: each source the first refresh
    pinned, each source with files landed in a later one (its intake failed, or never ran), and each source a
    refresh read (its raw documents are there: a builtin source, which is not pinned). Sources outside `sources` (no
    longer configured, or configured after a refresh) and sources with nothing in a refresh are not expected."""
    missing = []
    for r in refreshes:
        registered = set(r.pinned or {}) if r.is_initial else {s for s in sources if r.files_of(s)}
        missing += [p for s in sources if store.manifest_or_none(asset, p := partition(s, r.key)) is None
                    and (s in registered or store.manifest_or_none(READ, p) is not None)]
    return missing


def never_read(store: Store, sources: list[str], refreshes: list[Refresh]) -> list[Refresh]:
    """The refreshes no source of which has raw documents: registered, but their intake never started (a sensor tick
    evaluated and not submitted, a submission that failed), or not yet."""
    return [r for r in refreshes if not any(store.manifest_or_none(READ, partition(s, r.key)) for s in sources)]


def require_earlier(asset: str, decided: str, missing: list[str]) -> None:
    """Refuse to decide `asset`[`decided`] while `missing`, its datasets in earlier refreshes, are not materialized:
    a refresh is compared with the refreshes before it only, so an earlier one decided later would never be compared
    with this one, and a document in both would be kept twice (Dagster runs refresh partitions in any order)."""
    if missing:
        names = ", ".join(f"{asset}[{p}]" for p in missing)
        raise IncompleteDataset(f"{asset}[{decided}] is decided against every earlier refresh, but {names} "
                                f"{'has' if len(missing) == 1 else 'have'} not been materialized: materialize "
                                f"{'it' if len(missing) == 1 else 'them'} first (refreshes in order), then "
                                f"{asset}[{decided}] again")


def latest(store: Store, asset: str, refreshes: list[Refresh] | None = None,
           manifest_of: Callable[[str, str], Manifest | None] | None = None) -> tuple[str, Manifest]:
    """The newest refresh with a materialized per-refresh `asset` (e.g. token_shards), and its manifest: the store's
    copy (`Store.manifest_or_none`: with S3 storage, fetched to be read), or `manifest_of`'s (an audit's Catalog,
    which reads S3's manifests alone)."""
    refreshes = load_refreshes(store) if refreshes is None else refreshes
    for r in reversed(refreshes):
        if (m := (manifest_of or store.manifest_or_none)(asset, r.key)) is not None:
            return r.key, m
    raise IncompleteDataset(f"{asset} has not been materialized for any refresh "
                            f"({', '.join(r.key for r in refreshes) or 'none registered'}); materialize it first")


def trained_refresh(run: Manifest | None) -> str | None:
    """The refresh whose token shards a training run read (its manifest's `token_shards/<refresh>` input; not the
    one it replayed, `stats.replay.input`, unless it is the same)."""
    keys = [key for key in (run.inputs if run else {}) if key.startswith("token_shards/")]
    replayed = ((run.stats.get("replay") or {}).get("input")) if run else None
    key = next((k for k in keys if k != replayed), keys[0] if keys else None)
    return key.split("/", 1)[1] if key else None


# -------------------------------------------------------------------------------------------- landing

@dataclass
class Landing:
    """What a scan of the landing area found: new files per source, and what it could not use."""

    files: dict[str, list[LandedFile]]  # source -> files not in any refresh yet
    unknown_sources: list[str]  # folders that name no declared source: left alone, reported
    settling: int  # files modified too recently (maybe still being written): left for the next scan

    @property
    def count(self) -> int:
        return sum(len(fs) for fs in self.files.values())


def pending_files(landing: str, sources: list[str], refreshes: list[Refresh], settle_seconds: int = 0,
                  now: dt.datetime | None = None) -> Landing:
    """Files under `<landing>/<source>/` that no refresh holds yet. Hidden files (`.name`, `_name`: uploads in
    progress, `_SUCCESS` markers) are skipped, as are files modified less than `settle_seconds` ago."""
    filesystem, root = _filesystem(landing)
    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        return Landing({}, [], 0)
    if info.type != pafs.FileType.Directory:
        raise RefreshError(f"refresh.landing {landing!r} is not a folder (or S3 prefix) of <source>/ folders")
    seen = {f.identity for r in refreshes for fs in (r.files or {}).values() for f in fs}
    now = now or dt.datetime.now(dt.timezone.utc)
    found: dict[str, list[LandedFile]] = {}
    unknown, settling = set(), 0
    for entry in filesystem.get_file_info(pafs.FileSelector(root, recursive=True)):
        if entry.type != pafs.FileType.File:
            continue
        relative = entry.path[len(root):].lstrip("/")
        parts = relative.split("/")
        if any(p.startswith((".", "_")) for p in parts):
            continue
        if len(parts) < 2 or parts[0] not in sources:
            unknown.add(parts[0] if len(parts) > 1 else relative)
            continue
        uri = f"s3://{entry.path}" if landing.startswith("s3://") else entry.path
        f = _landed(uri, "/".join(parts[1:]), entry, now)
        if f.identity in seen:
            continue
        if (now - dt.datetime.fromisoformat(f.modified)).total_seconds() < settle_seconds:
            settling += 1
            continue
        found.setdefault(parts[0], []).append(f)
    return Landing({s: sorted(fs, key=lambda f: f.relative) for s, fs in sorted(found.items())}, sorted(unknown),
                   settling)


def next_refresh(store: Store, config: ProjectConfig, trigger: str, settle_seconds: int = 0,
                 waiting: Sequence[str] = ()) -> tuple[Refresh | None, Landing | None]:
    """Register what is new, if anything: the configured sources when no refresh exists yet, else the files
    landed since the last refresh. Returns the new refresh (None: nothing new) and the landing scan. The registry's
    lock covers the scan too: a sensor tick and a CLI run at once must not register the same files twice.

    `waiting`: refresh keys added by hand (Dagster partitions added in the UI) not registered yet, oldest first; the
    first of them names what is new, as its own run would have (`ensure_refresh`). Registered under a new key
    instead, the landed files would leave that partition nothing to read, and it would stay before every later
    refresh, which automation decides in order, for ever."""
    with store.registry_lock(REFRESHES):
        refreshes = load_refreshes(store)
        key = next((k for k in waiting if k not in {r.key for r in refreshes}), None)
        if not refreshes:
            return _register(store, None, "initial", key, pin_sources(config)), None
        landing = pending_files(config.refresh.landing_path(), [s.name for s in config.sources], refreshes,
                                settle_seconds)
        if not landing.count:
            return None, landing
        return _register(store, landing.files, trigger, key), landing


def ensure_refresh(store: Store, config: ProjectConfig, key: str, added: Sequence[str] = ()) -> Refresh:
    """The registered refresh `key`. A key nobody registered (a partition added by hand in the Dagster UI) is
    registered now with what has landed (or as the first refresh on an empty store); runs of several sources
    racing to do so register the same files under the same key.

    `added`: every refresh partition in the order they were added (Dagster's order, which automation decides
    refreshes in). A key added after another that is not registered yet is refused, naming it: registered first, it
    would come before that one in the registry (the order curation and dedup compare refreshes in) and after it in
    Dagster's, and each would wait for the other for ever."""
    try:
        return get_refresh(store, key)
    except RefreshError:
        pass
    with store.registry_lock(REFRESHES):
        refreshes = load_refreshes(store)
        if any(r.key == key for r in refreshes):  # another source's run registered it meanwhile
            return get_refresh(store, key)
        registered = {r.key for r in refreshes}
        before = [k for k in added[:list(added).index(key)] if k not in registered] if key in added else []
        if before:
            raise RefreshError(f"refresh {key!r} was added after {', '.join(map(repr, before))}, which "
                               f"{'holds' if len(before) == 1 else 'hold'} no refresh yet; refreshes take what has "
                               f"landed in the order their partitions were added: run the intake (raw_documents) of "
                               f"{before[0]!r} first, or delete the partition{'s' if len(before) > 1 else ''} "
                               f"{', '.join(map(repr, before))} if unwanted")
        if not refreshes:
            return _register(store, None, "initial", key, pin_sources(config))
        landing = pending_files(config.refresh.landing_path(), [s.name for s in config.sources], refreshes)
        if not landing.count:
            raise RefreshError(f"refresh {key!r} is not registered and nothing new landed under "
                               f"{config.refresh.landing_path()}/<source>/: drop the new files there first (a refresh "
                               f"added by hand takes what has landed)")
        return _register(store, landing.files, "ui", key)


def pin_sources(config: ProjectConfig) -> dict[str, list[LandedFile]] | None:
    """The files each configured (non-builtin) source names now, with size, modification time and, for local
    files, sha256: what the first refresh reads, whenever it is materialized."""
    pinned = {s.name: [_pin(f) for f in expand(s.path)] for s in config.sources if s.kind != "builtin"}
    return pinned or None


def _landed(uri: str, relative: str, info: pafs.FileInfo, now: dt.datetime | None = None,
            sha256: str | None = None) -> LandedFile:
    """A file as a refresh records it: where, its size, its modification time (UTC, to the microsecond; `now`
    where the filesystem has none) and, for a pinned local file, its sha256."""
    modified = info.mtime.astimezone(dt.timezone.utc) if info.mtime else (now or dt.datetime.now(dt.timezone.utc))
    return LandedFile(uri, relative, info.size, modified.isoformat(timespec="microseconds"), sha256)


def _pin(f: SourceFile, with_hash: bool = True) -> LandedFile:
    filesystem, path = _filesystem(f.uri)
    local = not f.uri.startswith("s3://")  # an S3 object is pinned by size and time: hashing it means reading it
    return _landed(f.uri, f.relative, filesystem.get_file_info(path),
                   sha256=sha256_file(Path(f.uri)) if with_hash and local else None)


def check_unchanged(refresh: Refresh, source: Source) -> None:
    """A refresh re-read must read what it read when registered, or its documents change under the same key: the
    first refresh's source must name exactly the files it named then, unchanged (same size, and same sha256 when the
    modification time moved); a later refresh's landed files must still be there with their size and time (one
    replaced in place lands again: it belongs to the next refresh). Else an error that names every difference."""
    if not refresh.is_initial:
        problems = []
        for was in refresh.files_of(source.name):
            filesystem, path = _filesystem(was.uri)
            info = filesystem.get_file_info(path)
            now = None if info.type == pafs.FileType.NotFound else _landed(was.uri, was.relative, info)
            if now is None:
                problems.append(f"{was.uri}: gone")
            elif (now.bytes, now.modified) != (was.bytes, was.modified):
                problems.append(f"{was.uri}: {now.bytes:,} bytes modified {now.modified}, landed as {was.bytes:,} "
                                f"bytes modified {was.modified}")
        _refuse(problems, f"the files refresh {refresh.key!r} landed for source {source.name!r} changed since",
                "a file replaced in place is part of the next refresh (the landing sensor registers it)")
        return
    if refresh.pinned is None or source.name not in refresh.pinned or source.kind == "builtin":
        return  # unpinned: builtin, a registry from before pins, or a source configured after the first refresh
    was = {f.relative: f for f in refresh.pinned[source.name]}
    now = {f.relative: f for f in expand(source.path)}
    problems = [f"{was[r].uri}: gone" for r in sorted(was.keys() - now.keys())]
    problems += [f"{now[r].uri}: new" for r in sorted(now.keys() - was.keys())]
    for r in sorted(was.keys() & now.keys()):
        pin, current = was[r], _pin(now[r], with_hash=False)
        if current.bytes != pin.bytes:
            problems.append(f"{current.uri}: {current.bytes:,} bytes, was {pin.bytes:,}")
        elif current.modified != pin.modified and pin.sha256 and sha256_file(Path(current.uri)) != pin.sha256:
            problems.append(f"{current.uri}: content changed (sha256)")
    _refuse(problems, f"source {source.name!r} no longer holds the files refresh {refresh.key!r} (the first "
                      f"refresh) read", f"new data goes under <landing>/{source.name}/ and becomes the next refresh")


def _refuse(problems: list[str], what: str, instead: str) -> None:
    if problems:
        raise RefreshError(f"{what}: {'; '.join(problems[:10])}{' …' if len(problems) > 10 else ''}. Restore them "
                           f"to re-read that refresh; {instead}")


def _filesystem(landing: str) -> tuple[pafs.FileSystem, str]:
    if landing.startswith("s3://"):
        from kiln.curation.readers.paths import s3_filesystem

        filesystem, path = s3_filesystem(landing)
        return filesystem, path.rstrip("/")
    return pafs.LocalFileSystem(), str(Path(landing).expanduser().resolve())


__all__ = ["LandedFile", "Landing", "Refresh", "RefreshError", "REFRESHES", "check_unchanged", "ensure_refresh", "get_refresh",
           "latest", "load_refreshes", "pin_sources",
           "materialized", "never_read", "new_key", "next_refresh", "partition", "pending_files", "register_refresh",
           "require_earlier", "trained_refresh", "unmaterialized", "upto"]
