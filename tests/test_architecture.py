"""The library's import rules (docs/ARCHITECTURE.md, "Packages"): a stage imports kiln.common, kiln.engine and the
stages upstream of it; kiln.governance reads every stage and kiln.cli may import anything. The exceptions are
listed here and in the docs, and no other may creep in unseen. A leading underscore marks a name private to its
package: no other package imports it."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Upstream first: a package may import those before it.
ORDER = ["common", "engine", "curation", "dedup", "quality", "tokens", "planning", "governance", "cli"]
EXCEPTIONS = {  # importing module -> what it imports against the order (docs/ARCHITECTURE.md lists each, and why)
    "kiln.common.config.curation": {"kiln.curation.filters.registry"},
    "kiln.common.config.dedup": {"kiln.dedup.lsh"},
    "kiln.common.config.project": {"kiln.curation.filters.language", "kiln.curation.filters.registry",
                                   "kiln.planning.plan", "training_jobs.settings", "training_jobs.span_lengths"},
    "kiln.common.removals": {"kiln.curation.pii"},
    "kiln.common.run_folders": {"training_jobs.checkpoint", "training_jobs.launch", "training_jobs.settings"},
    "kiln.common.run_mirror": {"training_jobs.checkpoint", "training_jobs.settings"},
    "kiln.common.storage": {"kiln.tokens.shard_format"},
    "kiln.curation.exact_dedup": {"kiln.dedup.shuffle"},
    "kiln.curation.intake_hashes": {"kiln.dedup.shuffle"},
    "kiln.dedup.bucket_index": {"kiln.governance.refresh"},
    "kiln.dedup.migrate": {"kiln.governance.refresh"},
    "kiln.planning.fits": {"training_jobs"},
    "kiln.quality.classifier": {"kiln.tokens.mixture"},
    "kiln.quality.rules": {"kiln.tokens.mixture"},
    "kiln.quality.perplexity": {"kiln.tokens.tokenizer", "training_jobs.export", "training_jobs.tokenizer_files"},
    "kiln.tokens.shard_writer": {"kiln.governance.document_facts", "kiln.governance.forget"},
    "kiln.tokens.tokenizer": {"kiln.governance.forget", "training_jobs.tokenizer_files"},
}


def _package(module: str) -> str:
    parts = module.split(".")
    if parts == ["kiln"]:  # the package itself: its version
        return "common"
    return parts[1] if parts[0] == "kiln" else parts[0]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n.split(".")[0] in ("kiln", "training_jobs", "assets", "orchestration", "resources")}


def test_the_library_imports_only_what_the_architecture_allows():
    against = {}
    for path in sorted((REPO / "kiln").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        importer = _package(module)
        for name in _imports(path):
            imported = _package(name)
            if importer == imported or imported in ("common", "engine") or importer in ("governance", "cli"):
                continue
            if imported in ORDER and importer in ORDER and ORDER.index(imported) < ORDER.index(importer):
                continue
            against.setdefault(module, set()).add(name)
    assert against == EXCEPTIONS


def test_no_package_imports_another_packages_private_names():
    crossing = []
    for path in sorted((REPO / "kiln").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kiln.") \
                    and _package(node.module) != _package(module):
                crossing += [f"{module} imports {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert crossing == []
