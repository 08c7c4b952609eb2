"""README.md, docs/*.md and deploy/production/README.md against the code: every config key they name is one the
loader accepts (with the default it documents), every path under KILN_HOME they name is one the code lays out,
every relative link reaches its file and heading, and the README's own-data config loads.

What is read from the pages:
- tables whose first header cell is `key`: a dotted config key per row (`dedup.near.threshold`, `sources[].kind`,
  `quality.rules.<source>.min_score`) and, in the second column, its default; a single `code` default must equal the
  pydantic default, `required` must be a required field, anything else (a sentence) is not compared;
- config keys in inline code anywhere outside fenced blocks (`training.launcher: ray` names `training.launcher`);
- tables whose first header cell starts with `path`, and inline code starting with `.kiln/`, `KILN_HOME/` or
  `$KILN_HOME/`: paths under KILN_HOME. `data/<asset>/<partition>/...` must name a dataset of the store, with the
  partition folders its partitioning gives (`<source>/<refresh>`, `<refresh>` or `_all`) and file names the code
  writes (a `prefix-*.ext` part of a known role, or a name that is a string in the code); anything else must start
  with a folder the code puts under KILN_HOME (`kiln_home() / "runs"`, the Makefile's `$(KILN_HOME)/dagster`);
- YAML blocks of the README that start from the default config (`extends:`): they must load.
"""

from __future__ import annotations

import ast
import re
import types
import typing
from functools import cache
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter

from kiln.common.config import ProjectConfig, load_config
from kiln.common.config.loading import MOVED_KEYS, REMOVED_KEYS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "production" / "README.md"]
CODE_PACKAGES = ("kiln", "assets", "resources", "orchestration", "training_jobs")
SECTIONS = tuple(ProjectConfig.model_fields)
# Inline code that names a file, not a key (`tokenizer.model`, `refresh.py`)
FILE_SUFFIXES = ("json", "jsonl", "model", "vocab", "md", "py", "yaml", "parquet", "bin", "idx", "txt", "db", "lock")
KEY_PART = r"(?:[A-Za-z_][A-Za-z0-9_]*|<[^<>\s]+>)(?:\[[^\]\s]*\])*"
INLINE_KEY = re.compile(rf"^(?:{'|'.join(SECTIONS)})(?:\[[^\]\s]*\])*(?:\.{KEY_PART})*$")
REFRESH_KEY = re.compile(r"^\d{4}-\d{2}-\d{2}(\.\d+)?$")


# ---------------------------------------------------------------------------------------------- reading the pages

def fenced_split(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The page's lines outside fenced blocks, and its fenced blocks as (info string, body)."""
    prose, blocks, fence, body = [], [], None, []
    for line in text.splitlines():
        marker = re.match(r"^\s*(```+|~~~+)(.*)$", line)
        if fence is None and marker:
            fence, info, body = marker.group(1), marker.group(2).strip(), []
        elif fence is not None and line.strip().startswith(fence):
            blocks.append((info, "\n".join(body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
    return prose, blocks


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def tables(lines: list[str]) -> list[tuple[list[str], list[list[str]]]]:
    """Markdown tables: (header cells, rows of cells)."""
    out, i = [], 0
    while i < len(lines) - 1:
        if lines[i].lstrip().startswith("|") and re.match(r"^\s*\|?\s*:?-{3,}", lines[i + 1]):
            header, rows, i = _cells(lines[i]), [], i + 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def key_rows(lines: list[str]) -> list[tuple[str, str]]:
    """(key, default cell) of every row of every `key` table."""
    out = []
    for header, rows in tables(lines):
        if header and header[0].lower() == "key":
            for row in rows:
                spans = code_spans(row[0])
                assert len(spans) == 1, f"a key table's first cell holds one `key`: {row[0]!r}"
                out.append((spans[0], row[1] if len(row) > 1 else ""))
    return out


def inline_keys(lines: list[str]) -> list[str]:
    """Config keys named in inline code outside tables' key column: `dedup.near.scheme: affine32` -> the key."""
    keys = []
    for line in lines:
        for span in code_spans(line):
            candidate = re.split(r"[\s:=]", span.strip(), maxsplit=1)[0]
            if "." not in candidate and "[" not in candidate:
                continue  # a bare section name (`training`) or a word
            if candidate.rsplit(".", 1)[-1] in FILE_SUFFIXES:
                continue
            if INLINE_KEY.match(candidate):
                keys.append(candidate)
    return keys


def path_mentions(lines: list[str]) -> list[str]:
    """Paths under KILN_HOME: the first column of `path` tables, and inline code starting with the home's name."""
    paths = []
    for header, rows in tables(lines):
        if header and header[0].lower().startswith("path"):
            for row in rows:
                spans = code_spans(row[0])
                assert spans, f"a path table's first cell holds a `path`: {row[0]!r}"
                paths.extend(spans)
    for line in lines:
        for span in code_spans(line):
            for prefix in ("$KILN_HOME/", "KILN_HOME/", ".kiln/"):
                if span.startswith(prefix) and " " not in span:
                    paths.append(span.removeprefix(prefix))
    return paths


# ---------------------------------------------------------------------------------------------- config keys

def _parts(key: str) -> list[tuple[str, int]]:
    """`sources[].name` -> [("sources", 1), ("name", 0)]: each name with the number of [..] after it."""
    out = []
    for part in key.split("."):
        m = re.fullmatch(r"([^\[\]]+)((?:\[[^\]]*\])*)", part)
        if not m:
            raise ValueError(f"{key}: cannot read {part!r} as a key")
        out.append((m.group(1), m.group(2).count("[")))
    return out


def _inner(annotation) -> list:
    """The types a value of this annotation may have (Optional and unions opened)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _inner(arg)]
    return [annotation]


def _step(annotation, what: str):
    """Go one level into `annotation`: `what` is 'item' (a list or tuple element) or 'value' (a dict value)."""
    for t in _inner(annotation):
        origin = typing.get_origin(t)
        if what == "item" and origin in (list, tuple, set):
            return typing.get_args(t)[0]
        if what == "value" and origin is dict:
            return typing.get_args(t)[1]
    return None


def _model(annotation) -> type[BaseModel] | None:
    return next((t for t in _inner(annotation) if isinstance(t, type) and issubclass(t, BaseModel)), None)


def _field(model: type[BaseModel], name: str):
    for field_name, info in model.model_fields.items():
        by_name = info.alias is None or model.model_config.get("populate_by_name", False)
        if (info.alias == name) or (by_name and field_name == name):
            return info
    return None


def resolve_key(key: str):
    """The pydantic field a dotted key names (None where it ends in a free-form mapping, e.g. a dict of step
    parameters). Raises KeyError naming the part the loader would refuse."""
    annotation, info = ProjectConfig, None
    for name, brackets in _parts(key):
        if annotation is typing.Any:
            return None  # a free-form mapping (step parameters): the step validates them, not the model tree
        model = _model(annotation)
        if model is not None:
            info = _field(model, name)
            if info is None:
                raise KeyError(f"{key}: {model.__name__} has no key {name!r} (keys: {', '.join(model.model_fields)})")
            annotation = info.annotation
        elif (value := _step(annotation, "value")) is not None:
            info, annotation = None, value  # a dict key: a source name, a profile name, a <placeholder>
        else:
            raise KeyError(f"{key}: {name!r} is below a value that has no keys ({annotation})")
        for _ in range(brackets):
            item = _step(annotation, "item")
            if item is None:
                raise KeyError(f"{key}: {name!r} is not a list")
            info, annotation = None, item
    return info


def refused_on_purpose(key: str) -> bool:
    """Keys the loader names when it refuses them (moved or removed): a page may say so."""
    parts = tuple(p for p, _ in _parts(key))
    return any(parts[:len(k)] == k for k in [*MOVED_KEYS, *REMOVED_KEYS])


def default_problem(key: str, cell: str) -> str | None:
    """What is wrong with a documented default, or None."""
    info = resolve_key(key)
    spans, text = code_spans(cell), cell.strip().lower()
    if text == "required":
        return None if info is not None and info.is_required() else f"{key}: documented as required, it is not"
    if len(spans) != 1 or cell.strip() != f"`{spans[0]}`":
        return None  # a sentence ("the shard set's", "—"): not compared
    if info is None:
        return f"{key}: a default `{spans[0]}` is documented, but the key has no default of its own"
    if info.is_required():
        return f"{key}: documented default `{spans[0]}`, but the loader requires the key"
    default = info.get_default(call_default_factory=True)
    actual = TypeAdapter(info.annotation).dump_python(default, mode="json")
    documented = yaml.safe_load(spans[0])
    if isinstance(actual, float) and isinstance(documented, str):  # YAML 1.1 reads `1e-05` as a string
        try:
            documented = float(documented)
        except ValueError:
            pass
    if documented != actual:
        return f"{key}: documented default `{spans[0]}`, the loader's is {actual!r}"
    return None


def key_problems(text: str) -> list[str]:
    lines, _ = fenced_split(text)
    problems = []
    for key, cell in key_rows(lines):
        try:
            problem = default_problem(key, cell)
        except (KeyError, ValueError) as exc:
            problem = str(exc).strip("'\"")
        if problem:
            problems.append(problem)
    in_tables = {key for key, _ in key_rows(lines)}
    for key in inline_keys(lines):
        if key in in_tables or refused_on_purpose(key):
            continue
        try:
            resolve_key(key)
        except (KeyError, ValueError) as exc:
            problems.append(f"inline `{key}`: " + str(exc).strip("'\""))
    return problems


# ---------------------------------------------------------------------------------------------- paths

@cache
def code_layout() -> dict:
    """What the code writes: dataset names and their partitioning, part-file prefixes, string constants, and the
    folders directly under KILN_HOME."""
    from kiln.common.storage import ROLE_PREFIX
    from kiln.governance.refresh import REFRESHES
    from orchestration.definitions import defs

    graph = defs.resolve_asset_graph()
    partitions = {}
    for asset_key in graph.get_all_asset_keys():
        pdef = graph.get(asset_key).partitions_def
        kind = type(pdef).__name__ if pdef else None
        partitions[asset_key.to_user_string()] = {
            None: ["_all"], "MultiPartitionsDefinition": ["<source>", "<refresh>"],
            "DynamicPartitionsDefinition": ["<refresh>"]}[kind]
    partitions[REFRESHES] = ["_all"]  # the refresh registry: a dataset of the store, not a Dagster asset

    strings, home = set(), set()
    for package in CODE_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    strings.add(node.value)
                    strings.update(node.value.split("/"))
                if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.left, ast.Call)
                        and getattr(node.left.func, "id", None) == "kiln_home"
                        and isinstance(node.right, ast.Constant)):
                    home.add(node.right.value)
    makefile = (ROOT / "Makefile").read_text()
    home.update(re.findall(r"\$\(KILN_HOME\)/([A-Za-z0-9_.-]+)", makefile))
    strings.update(re.findall(r"\$\(DAGSTER_HOME\)/([A-Za-z0-9_.-]+)", makefile))  # DAGSTER_HOME is KILN_HOME/dagster
    return {"partitions": partitions, "prefixes": set(ROLE_PREFIX.values()), "strings": strings, "home": home}


def _sources() -> set[str]:
    return {s.name for s in load_config(ROOT / "configs" / "default.yaml").sources}


def _segment_ok(segment: str, layout: dict) -> bool:
    if re.fullmatch(r"<[^<>]+>", segment):
        return True  # a placeholder inside a folder the code names (runs/<key>/, step folders)
    glob = re.fullmatch(r"([a-z_]+)-\*\.(parquet|bin)", segment)
    if glob:
        return glob.group(1) in layout["prefixes"]
    return segment in layout["strings"]


def path_problem(path: str) -> str | None:
    layout = code_layout()
    segments = [s for s in path.strip().rstrip("/").split("/") if s]
    if not segments:
        return None  # KILN_HOME itself (`.kiln/`)
    top, rest = segments[0], segments[1:]
    if top not in layout["home"]:
        known = ", ".join(sorted(layout["home"]))
        return f"{path}: nothing in the code puts {top!r} directly under KILN_HOME ({known})"
    if top != "data":
        bad = [s for s in rest if not (_segment_ok(s, layout) or s in _sources())]
        return f"{path}: {bad[0]!r} is no name the code writes" if bad else None
    if not rest:
        return None
    asset, rest = rest[0], rest[1:]
    if asset not in layout["partitions"]:
        return f"{path}: {asset!r} is no dataset of the store ({', '.join(sorted(layout['partitions']))})"
    expected = layout["partitions"][asset]
    given = rest[:len(expected)]
    for want, got in zip(expected, given, strict=False):
        concrete = (want == "<source>" and got in _sources()) or (want == "<refresh>" and REFRESH_KEY.match(got))
        if got != want and not concrete:
            return f"{path}: {asset} is partitioned as {'/'.join(expected)}, not {'/'.join(given)}"
    bad = [s for s in rest[len(expected):] if not _segment_ok(s, layout)]
    return f"{path}: {bad[0]!r} is no file or folder the code writes" if bad else None


def page_path_problems(text: str) -> list[str]:
    lines, _ = fenced_split(text)
    return [p for p in map(path_problem, path_mentions(lines)) if p]


# ---------------------------------------------------------------------------------------------- the tests

def test_the_pages_exist_and_the_readme_links_each():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in ("curation", "dedup", "quality", "tokens", "training", "governance", "cluster", "operations", "scale"):
        assert (ROOT / "docs" / f"{page}.md").is_file(), page
        assert f"(docs/{page}.md)" in readme, f"README.md does not link docs/{page}.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_config_key_a_page_names_is_accepted_with_its_default(page):
    assert key_problems(page.read_text(encoding="utf-8")) == []


def test_every_section_of_the_config_has_a_key_table():
    documented = {re.split(r"[.\[]", key)[0] for page in PAGES
                  for key, _ in key_rows(fenced_split(page.read_text(encoding="utf-8"))[0])}
    assert set(SECTIONS) - documented == set()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_under_kiln_home_a_page_names_is_one_the_code_writes(page):
    assert page_path_problems(page.read_text(encoding="utf-8")) == []


def test_the_readmes_own_data_config_loads(tmp_path):
    _, blocks = fenced_split((ROOT / "README.md").read_text(encoding="utf-8"))
    configs = [body for info, body in blocks if info == "yaml" and body.lstrip().startswith("extends:")]
    assert configs, "README.md has no ```yaml block that extends the default config"
    for i, body in enumerate(configs):
        raw = yaml.safe_load(body)
        raw["extends"] = str(ROOT / "configs" / raw["extends"])  # the README's file sits in configs/
        path = tmp_path / f"own_{i}.yaml"
        path.write_text(yaml.safe_dump(raw))
        config = load_config(path)
        assert {s.kind for s in config.sources} >= {"jsonl", "parquet", "warc"}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def link_problems(page: Path) -> list[str]:
    """Relative links whose file, or whose #anchor in a markdown file, does not exist."""
    problems = []
    lines, _ = fenced_split(page.read_text(encoding="utf-8"))
    for target in re.findall(r"\]\(([^)\s]+)\)", "\n".join(lines)):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif anchor and file.suffix == ".md":
            headings = [slug(m) for m in re.findall(r"^#+\s+(.*)$", "\n".join(fenced_split(
                file.read_text(encoding="utf-8"))[0]), re.M)]
            if anchor not in headings:
                problems.append(f"{page.name}: {target}: no heading #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_its_file_and_heading(page):
    assert link_problems(page) == []


def test_the_production_image_installs_what_its_readme_runs():
    """deploy/production/README.md runs `kiln dedup migrate-index --redis` in the production image, which installs
    Kiln with the `production` extra: the Redis client must come with it (kiln.dedup.migrate imports `redis`)."""
    import tomllib

    readme = (ROOT / "deploy" / "production" / "README.md").read_text(encoding="utf-8")
    assert '.[production]"' in readme and "migrate-index --redis" in readme
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["production"]
    assert any(re.match(r"redis\b", requirement) for requirement in extra)


# The checks themselves, on pages made up to be wrong (each line below names something the code refuses).

WRONG_TABLE = """
| key | default | meaning |
|---|---|---|
| `dedup.near.threshold` | `0.8` | right |
| `dedup.near.treshold` | `0.8` | misspelt |
| `dedup.near.num_perm` | `256` | wrong default |
| `sources[].kind` | `jsonl` | required, no default |
| `sources[].license` | required | right |
| `quality.rules.<source>.min_score` | `null` | right, below a mapping |
| `quality.rules.<source>.top_fraction` | `null` | misspelt below a mapping |
| `mixture.replay.from` | `null` | right, an alias |
| `training.launcher` | `ray` | wrong default |
| `storage.backend` | `local` | right |
"""


def test_a_wrong_key_or_default_in_a_table_is_reported():
    problems = key_problems(WRONG_TABLE)
    assert len(problems) == 5, problems
    assert any("treshold" in p for p in problems) and any("top_fraction" in p for p in problems)
    assert any("num_perm" in p and "128" in p for p in problems)
    assert any("launcher" in p and "torchrun" in p for p in problems)
    assert any("sources[].kind" in p and "requires" in p for p in problems)


def test_a_wrong_key_in_running_text_is_reported():
    text = ("Set `dedup.near.threshold: 0.9` or `training.launcher: ray`, `tokenizer.vocab_sise` or "
            "`quality.classifer.folds`; `tokenizer.json` is a file and `dedup.near.index` is refused on purpose.\n"
            "```yaml\ndedup: {near: {not_checked_in_a_fenced_block: 1}}\n```\n")
    problems = key_problems(text)
    assert len(problems) == 2, problems
    assert "vocab_sise" in problems[0] and "classifer" in problems[1]


def test_a_path_the_code_does_not_write_is_reported():
    page = """
| path | what |
|---|---|
| `data/dedup_index/<refresh>/index/_index.json` | right |
| `data/raw_documents/<source>/<refresh>/quarantine-*.parquet` | right |
| `data/tokenizer/_all/tokenizer.model` | right |
| `runs/<key>/checkpoints/` | right |
| `dedup_index/` | no such folder under KILN_HOME |
| `data/token_shards/<source>/<refresh>/shard-*.bin` | wrong partitioning |
| `data/tokenizer/_all/tokeniser.model` | no such file |
| `data/raw_documents/<source>/<refresh>/records-*.parquet` | no such part role |
| `data/dedup_indexes/<refresh>/` | no such dataset |

The index was in `$KILN_HOME/dedup_index`; the card is `.kiln/data/data_card/_all/data_card.md`.
"""
    problems = page_path_problems(page)
    assert len(problems) == 6, problems
    for wrong in ("'dedup_index'", "partitioned as <refresh>", "tokeniser.model", "records-*.parquet",
                  "dedup_indexes"):
        assert any(wrong in p for p in problems), (wrong, problems)


def test_a_broken_link_is_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Config keys: `a.b`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#config-keys-ab) [ok](https://example.com/x) [file](missing.md) "
                    "[heading](other.md#config) [self](#nothing-here)\n")
    problems = link_problems(page)
    assert len(problems) == 3 and "missing.md" in problems[0], problems
