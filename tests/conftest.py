"""Shared fixtures: tiny configs and corpora built in code, an isolated KILN_HOME per test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# Property tests draw the same examples on every run (CI is reproducible and bounded; a failure reruns as it was);
# HYPOTHESIS_PROFILE=explore draws new ones each run, to go looking for bugs.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

CLEAN_PROSE = (
    "The river town was built on the trade of salt and timber, and for two centuries its merchants "
    "kept careful ledgers of every barge that passed the lock. Historians have used those ledgers to "
    "reconstruct the prices of ordinary goods, which show that the cost of bread rose sharply in years "
    "when the river froze early. The town council met in a hall beside the market square, and its "
    "minutes record long debates about the width of the towpath and the fees charged to foreign boats. "
    "Today the old warehouses have become a museum, and visitors can still see the iron rings to which "
    "the barges were tied. The museum is open every day except Monday, and guided tours start at ten."
)


def prose(i: int) -> str:
    """A distinct clean prose document (the i makes each one a different text)."""
    return f"Chapter {i}. " + CLEAN_PROSE.replace("two centuries", f"{i + 2} centuries")


# Test-seconds per module, (tests not marked slow, tests marked slow), measured with --junitxml on the 2-core VM
# (stop 92's suite at 2cff682; modules of 15 s or more). `make test` and `make test-slow` run pytest-xdist with whole
# modules as work units handed out in collection order (--no-loadscope-reorder: xdist's own order is most tests first,
# which starts the longest modules last): each run starts its own longest modules first, so none is left to run alone
# at the end.
MODULE_SECONDS = {
    "tests/e2e/test_demo.py": (2, 293), "tests/training_jobs/test_train_cpu.py": (0, 268),
    "tests/kiln/engine/test_engine.py": (95, 150), "tests/training_jobs/test_launch_signals.py": (2, 230),
    "tests/assets/test_training_assets.py": (17, 169), "tests/training_jobs/test_ray_launcher.py": (0, 175),
    "tests/e2e/test_ui.py": (4, 138), "tests/kiln/quality/test_quality.py": (103, 0),
    "tests/training_jobs/test_parallel_cpu.py": (0, 89), "tests/assets/test_refresh.py": (59, 26),
    "tests/test_bench_scripts.py": (8, 74), "tests/assets/test_quality_assets.py": (25, 46),
    "tests/kiln/governance/test_forget.py": (64, 0), "tests/training_jobs/test_recipes_cpu.py": (0, 64),
    "tests/assets/test_s3_storage.py": (0, 60), "tests/assets/test_curation_assets.py": (43, 0),
    "tests/training_jobs/test_compile.py": (40, 0), "tests/kiln/curation/test_readers.py": (38, 0),
    "tests/assets/test_dedup_assets.py": (37, 0), "tests/kiln/dedup/test_dedup_buckets.py": (24, 0),
    "tests/training_jobs/test_loader.py": (21, 0), "tests/kiln/common/test_storage_s3.py": (21, 0),
}


@pytest.hookimpl(trylast=True)  # after `-m` has deselected the other run's tests
def pytest_collection_modifyitems(config, items):
    kinds: dict[str, set[bool]] = {}  # per module, whether its collected tests are slow
    for item in items:
        kinds.setdefault(item.nodeid.split("::")[0], set()).add(item.get_closest_marker("slow") is not None)

    def seconds(item) -> int:
        module = item.nodeid.split("::")[0]
        fast, slow = MODULE_SECONDS.get(module, (0, 0))
        return (fast if False in kinds[module] else 0) + (slow if True in kinds[module] else 0)

    items.sort(key=lambda item: -seconds(item))  # stable: unmeasured modules, and tests in a module, keep their order


@pytest.fixture(autouse=True)
def pristine_linear():
    """torch.nn.functional.linear put back after each test. DeepSpeed's zero.Init replaces it for the whole process
    with its memory-efficient ZeRO-3 linear and leaves it so ("This will persist unless manually reset", says its
    log; it keeps the original as linear_bk): after a test that built a ZeRO-3 engine in this process, every later
    test's Linear layers would save other tensors for backward (test_layout's count of them failed so)."""
    yield
    zero = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    original = getattr(getattr(zero, "InsertPostInitMethodToModuleSubClasses", None), "linear_bk", None)
    if original is not None:
        sys.modules["torch.nn.functional"].linear = original


@pytest.fixture
def kiln_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "kiln"
    monkeypatch.setenv("KILN_HOME", str(home))
    return home


def write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def in_fresh_process(code: str):
    """Run `code` in a new interpreter and return what it prints (as JSON, on its last line): tracemalloc is
    process-wide, so a peak measured in the test worker also counts other tests' leftover threads (CI once read
    +14 MiB there that the code under test never allocated)."""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.splitlines()[-1])


# Most tests run the stages in their own process, one part after another: fast and simple to debug. The Ray
# engine is tested on its own (tests/kiln/engine/test_engine.py, tests/e2e): same output, by construction and by test.
SERIAL_ENGINE = {"backend": "processes", "workers": 1}


def web_and_ref_sources(root: Path, web_license: str = "CC-BY", ref_license: str = "CC0",
                        web_profile: str = "none") -> list[dict]:
    """The two-source config most asset tests use: JSONL `web` (tier 3) and `ref` (domain reference, tier 1)
    under `root/web` and `root/ref`; profile `none` must be declared by the caller."""
    return [{"name": "web", "kind": "jsonl", "path": str(root / "web"), "license": web_license, "domain": "web",
             "quality_tier": 3, "profile": web_profile},
            {"name": "ref", "kind": "jsonl", "path": str(root / "ref"), "license": ref_license, "domain": "reference",
             "quality_tier": 1, "profile": "none"}]
