"""The Dagster UI in a real headless browser: the real `dagster dev` (webserver + daemon, the run queue), Debian's
chromium driven through Playwright; a materialization launched from the UI and followed to success.

Screenshots land in the test's tmp_path and, when `KILN_TEST_ARTIFACTS` is set, in `$KILN_TEST_ARTIFACTS/test_ui/`.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "package_licenses"  # one source of raw_documents: a few seconds for 20 documents
REFRESH = "2026-11-01"  # the one refresh, registered before `dagster dev` starts
GROUPS = ("curation", "dedup", "tokens", "training", "planning")
CURATION_ASSETS = ("raw_documents", "filtered_documents", "curated_documents")


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        reason = "Debian's chromium is not installed (apt-get install chromium; .ci/run does it)"
        if os.environ.get("KILN_REQUIRE_CHROMIUM") or os.environ.get("CI"):
            pytest.fail(reason)  # CI installs it: a missing browser there is a broken setup, not a skip
        pytest.skip(reason)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _register_refresh(home: Path, dagster_home: Path) -> None:
    """The first refresh, in both places a partition needs it: Kiln's registry in the store (raw_documents reads
    it) and Dagster's dynamic `refresh` partitions (the UI offers them), as `make demo` does."""
    import dagster as dg

    from kiln.common.storage import Store
    from kiln.governance.refresh import register_refresh

    register_refresh(Store(home / "data"), None, "initial", key=REFRESH)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.add_dynamic_partitions("refresh", [REFRESH])


@pytest.fixture
def dagster_dev(tmp_path):
    """`dagster dev` on a free loopback port, with its own DAGSTER_HOME, KILN_HOME and a tiny KILN_CONFIG."""
    config = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    for source in config["sources"]:
        source["max_documents"] = 20
    # no landing sensor, refresh schedule or automation: the daemon must launch only the run the browser asks for
    config["refresh"] = {"sensor": {"enabled": False}, "schedule": {"enabled": False}, "automation": False}
    config_path = tmp_path / "kiln.yaml"
    config_path.write_text(yaml.safe_dump(config))
    home = tmp_path / "kiln"
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True)
    # the Makefile's instance (a run queue worked by the daemon), without the first-visit newsletter dialog
    (dagster_home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"
        "concurrency:\n  runs:\n    max_concurrent_runs: 4\n  pools:\n    default_limit: 1\n")
    _register_refresh(home, dagster_home)
    port = _free_port()
    env = {**os.environ, "KILN_CONFIG": str(config_path), "KILN_HOME": str(home), "DAGSTER_HOME": str(dagster_home),
           "KILN_DEPLOYMENT": "local", "MLFLOW_DISABLE_TELEMETRY": "true",
           "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"), "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "dagster_dev.log"
    with open(log_path, "wb") as log:  # as `make ui` starts it: `dagster dev` with one Ray for every step
        proc = subprocess.Popen([sys.executable, "-m", "orchestration.ui", "-m", "orchestration.definitions",
                                 "-h", "127.0.0.1", "-p", str(port)],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_ctrl_c_as_in_a_terminal)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dagster dev did not answer on {url}/server_info:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield {"url": url, "home": home, "log": log_path}
    finally:
        # Ctrl-C for the whole group (webserver, daemon, code servers, run workers), then make sure of it.
        stopped_by_ctrl_c = proc.poll() is not None
        for sig, wait_s in ((signal.SIGINT, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
            if sig is signal.SIGINT:
                stopped_by_ctrl_c = proc.poll() is not None
                continue  # children may outlive the parent: SIGKILL whatever is left of the group
        assert stopped_by_ctrl_c, "`make ui` (dagster dev, then its Ray) did not stop on Ctrl-C within 20 s"


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT back to its default in the child: a shell that starts the test suite in the background (`make test &`
    in a script) leaves SIGINT ignored, and an ignored signal stays ignored across exec, so Ctrl-C would never reach
    `make ui`. In a terminal it is not ignored; this makes the test see what a user sees."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _graphql(url: str, query: str) -> dict:
    request = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["data"]


RUNS_QUERY = "{ runsOrError { ... on Runs { results { runId status tags { key value } } } } }"
ENGINE_QUERY = ('{ assetOrError(assetKey: {path: ["raw_documents"]}) { ... on Asset { assetMaterializations(limit: 1) '
                '{ metadataEntries { label ... on JsonMetadataEntry { jsonString } } } } } }')


def _save(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / "screenshots" / f"{name}.png"
    path.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("KILN_TEST_ARTIFACTS"):
        target = Path(os.environ["KILN_TEST_ARTIFACTS"]) / "test_ui"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / path.name)
    return path


def _pick_partition(page, dialog, dimension: str, key: str) -> None:
    """Select one key in the launch dialog's selector for this dimension (one selector per dimension)."""
    from playwright.sync_api import expect

    section = dialog.locator("div").filter(has=page.get_by_text(dimension, exact=True)).filter(
        has=page.locator("[aria-haspopup='dialog']")).last  # the innermost: this dimension's name and selector
    selector = section.locator("[aria-haspopup='dialog']")
    for attempt in range(3):  # on a loaded host a click can land before the selector listens: the list never opened
        if selector.get_attribute("aria-expanded") != "true":
            selector.click()
        # the list opens in a popover the selector names; its options show the key twice, once as their title
        options = page.locator(f'[id="{selector.get_attribute("aria-controls")}"]')
        try:
            expect(options.get_by_placeholder("Filter partitions")).to_be_visible(timeout=15_000)
            break
        except AssertionError:
            if attempt == 2:
                raise
    options.get_by_placeholder("Filter partitions").fill(key)
    options.get_by_role("menuitem").filter(has=page.get_by_title(key, exact=True)).click()
    # the selector again closes the list (it may open upwards, over anything else one could click) ...
    selector.click()
    expect(options).to_be_hidden()  # ... once it has faded out (else it would cover the screenshot)
    expect(section).to_contain_text(key)  # the selection, as a tag in the selector


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_materialize_a_partition_from_the_ui(dagster_dev, tmp_path):
    chromium = _chromium()
    from playwright.sync_api import expect, sync_playwright

    url = dagster_dev["url"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True,
                                             args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(30_000)

            # the asset graph: every Kiln group, then the curation group's asset nodes
            page.goto(f"{url}/asset-groups")
            for group in GROUPS:
                expect(page.get_by_text(group, exact=True).first).to_be_visible(timeout=60_000)
            _save(page, tmp_path, "1_asset_graph")
            page.goto(f"{url}/locations/orchestration.definitions/asset-groups/curation/lineage")
            for asset in CURATION_ASSETS:
                expect(page.get_by_text(asset, exact=True).first).to_be_visible()
            _save(page, tmp_path, "2_curation_group")

            # asset page -> Materialize… -> one (refresh, source) partition -> Launch 1 run
            page.goto(f"{url}/assets/raw_documents")
            page.locator("button", has_text="Materialize…").first.click()
            title = "Launch runs to materialize raw_documents"
            # each dimension's partition list is a popover with role=dialog too: pick the launch dialog by its title
            dialog = page.get_by_role("dialog").filter(has_text=title)
            expect(dialog.get_by_text(title)).to_be_visible()
            for dimension, key in (("refresh", REFRESH), ("source", SOURCE)):
                _pick_partition(page, dialog, dimension, key)
            expect(dialog.get_by_text("1 partition", exact=True)).to_be_visible()
            _save(page, tmp_path, "3_launch_dialog")
            dialog.get_by_role("button", name="Launch 1 run").click()
            expect(dialog).to_be_hidden()

            # the run, as the Runs page lists it, followed on its own page until it succeeds
            page.goto(f"{url}/runs")
            run_link = page.locator("a[href^='/runs/']").filter(has_text=re.compile(r"^[0-9a-f]{8}$")).first
            expect(run_link).to_be_visible(timeout=60_000)
            run_path = run_link.get_attribute("href")
            page.goto(f"{url}{run_path}")
            status = page.get_by_text(re.compile(r"^(Success|Failure|Canceled)$")).first
            expect(status).to_be_visible(timeout=150_000)
            expect(page.get_by_text(f"partition: {REFRESH}|{SOURCE}").first).to_be_visible()
            _save(page, tmp_path, "4_finished_run")
            assert status.inner_text() == "Success", \
                f"run {run_path} ended {status.inner_text()}:\n{dagster_dev['log'].read_text()[-4000:]}"

            # the asset's partitions: refreshes × sources, this one materialized, the other sources missing
            page.goto(f"{url}/assets/raw_documents?view=partitions")
            expect(page.get_by_text("Materialized (1)")).to_be_visible()
            expect(page.get_by_text(REFRESH, exact=True).first).to_be_visible()
            expect(page.get_by_text(SOURCE, exact=True).first).to_be_visible()
            _save(page, tmp_path, "5_partitions")
        finally:
            browser.close()

    # the same run through the GraphQL API, and its output on disk
    [run] = _graphql(url, RUNS_QUERY)["runsOrError"]["results"]
    assert run_path.endswith(run["runId"]) and run["status"] == "SUCCESS"
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags["dagster/partition/refresh"] == REFRESH and tags["dagster/partition/source"] == SOURCE
    assert tags["dagster/partition"] == f"{REFRESH}|{SOURCE}"  # Dagster's MultiPartitionKey string
    # the step ran on the one Ray that `make ui` started for every run (RAY_ADDRESS), not on a Ray of its own
    [materialization] = _graphql(url, ENGINE_QUERY)["assetOrError"]["assetMaterializations"]
    engine = json.loads(next(e["jsonString"] for e in materialization["metadataEntries"] if e["label"] == "engine"))
    assert engine["engine"] == "ray" and engine["address"] == engine["gcs_address"] != "embedded"
    manifest_path = dagster_dev["home"] / "data" / "raw_documents" / SOURCE / REFRESH / "_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["counts"]["records"] == 20  # the bound the fixture sets (max_documents), exactly
    assert sorted(p.name for p in (tmp_path / "screenshots").iterdir()) == [
        "1_asset_graph.png", "2_curation_group.png", "3_launch_dialog.png", "4_finished_run.png",
        "5_partitions.png"]


@pytest.mark.slow
def test_make_ui_stops_everything_it_started_on_sigterm(tmp_path):
    """`docker stop`, systemd and CI runners send SIGTERM to `make ui` alone, not to its process group as a
    terminal's Ctrl-C does: every process it started (dagster dev, webserver, daemon, code servers, Ray) must still
    stop, runs in flight included: the landing sensor of a fresh store starts the first refresh's runs. The
    processes are collected while it runs: its descendants, and the Ray daemons of the session its driver started
    (Ray names a session after the driver's pid)."""
    import psutil

    config = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    for source in config["sources"]:
        source["max_documents"] = 20
    (tmp_path / "kiln.yaml").write_text(yaml.safe_dump(config))
    port = _free_port()
    env = {**os.environ, "KILN_CONFIG": str(tmp_path / "kiln.yaml"), "KILN_HOME": str(tmp_path / "kiln")}
    env.pop("DAGSTER_HOME", None)  # the Makefile's: $(KILN_HOME)/dagster, with the dagster.yaml it writes
    log = open(tmp_path / "make_ui.log", "wb")
    make = subprocess.Popen(["make", "--no-print-directory", "ui", f"UI_PORT={port}"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_stop_signals_as_in_a_shell)
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while not (_answers(f"http://127.0.0.1:{port}/server_info")
                   and any("code-server" in c or "api grpc" in c for c in started.values())
                   and any("spawn_main" in c for c in started.values())):  # a run worker
            assert make.poll() is None and time.monotonic() < deadline, "make ui did not start a run"
            time.sleep(1)
            tree = {p.pid: _command(p) for p in psutil.Process(make.pid).children(recursive=True)}
            drivers = {pid for pid, command in tree.items() if "orchestration.ui" in command}
            ray = {p.pid: " ".join(p.info["cmdline"]) for p in psutil.process_iter(["cmdline"])
                   if any(a.startswith("--session-name=") and int(a.rsplit("_", 1)[-1]) in drivers
                          for a in p.info["cmdline"] or [] if a.rsplit("_", 1)[-1].isdigit())}
            started = {pid: c for pid, c in (tree | ray).items() if c}  # "": it ended while being listed
        assert any("gcs_server" in c for c in started.values()), started  # the UI's embedded Ray
        make.send_signal(signal.SIGTERM)  # to make alone
        asked = time.monotonic()
        try:
            make.wait(timeout=60)  # orchestration/ui.py SIGKILLs what is left of Dagster after 15 s, then stops Ray
        except subprocess.TimeoutExpired:
            alive = {pid: c[:120] for pid, c in started.items() if _alive(pid)}
            pytest.fail(f"make ui still running 60 s after SIGTERM; alive: {alive}\n"
                        + (tmp_path / "make_ui.log").read_text(errors="replace")[-3000:])
        print(f"\n[make ui] exited {time.monotonic() - asked:.1f} s after SIGTERM")
        deadline = time.monotonic() + 10  # a code server left alone would stop on its own only after its heartbeat
        while (left := {pid: c for pid, c in started.items() if _alive(pid)}) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"still running after make ui got SIGTERM: {left}"
    finally:
        log.close()
        try:
            started |= {p.pid: "" for p in psutil.Process(make.pid).children(recursive=True)}
        except psutil.Error:
            pass
        for pid in [make.pid, *started]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _command(process) -> str:
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # ended (or became a zombie) between the listing and the read
        return ""


def _stop_signals_as_in_a_shell() -> None:
    """SIGTERM and SIGINT back to their defaults for make: an ignored signal stays ignored across exec, and GNU
    make keeps a signal it starts with ignored (so it neither stops nor forwards it). An earlier test in the same
    pytest worker may have left SIGTERM ignored; a shell, docker or systemd starts `make ui` with the defaults."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


FAKE_DAGSTER = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(signum, frame):
    out.with_suffix(".signal").write_text(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
out.write_text(str(os.getpid()))
time.sleep(60)
"""

UI_WITH_FAKE_DAGSTER = """
import subprocess, sys, types
import orchestration.ui as ui
popen = subprocess.Popen
ui.subprocess = types.SimpleNamespace(Popen=lambda command, **kw: popen([sys.executable, sys.argv[1], sys.argv[2]], **kw))
sys.exit(ui.main([]))
"""


@pytest.mark.parametrize("stop", [signal.SIGHUP, signal.SIGTERM])
def test_make_ui_stops_dagster_when_its_terminal_goes(tmp_path, stop):
    """A closed terminal or a dropped ssh session sends SIGHUP to `make ui`'s foreground group, which does not hold
    Dagster's own process group: Dagster must still get its graceful stop (SIGTERM), as for SIGTERM, not be left
    running on its port while the embedded Ray goes."""
    (tmp_path / "kiln.yaml").write_text(f"extends: {ROOT / 'configs' / 'default.yaml'}\nengine:\n  backend: processes\n")
    (tmp_path / "fake_dagster.py").write_text(FAKE_DAGSTER)
    ready = tmp_path / "dagster.pid"
    env = {**os.environ, "KILN_CONFIG": str(tmp_path / "kiln.yaml"), "KILN_HOME": str(tmp_path / "kiln"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    ui = subprocess.Popen([sys.executable, "-c", UI_WITH_FAKE_DAGSTER, str(tmp_path / "fake_dagster.py"), str(ready)],
                          cwd=ROOT, env=env, start_new_session=True, preexec_fn=_stop_signals_as_in_a_shell)
    fake = None
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text()):
            assert ui.poll() is None and time.monotonic() < deadline, "orchestration.ui did not start dagster"
            time.sleep(0.1)
        fake = int(ready.read_text())
        ui.send_signal(stop)
        ui.wait(timeout=10)
        assert ready.with_suffix(".signal").exists(), f"dagster got no stop signal when make ui got {stop.name}"
        assert ready.with_suffix(".signal").read_text() == "SIGTERM"
        assert not _alive(fake)
    finally:
        for pid in (fake, ui.pid):
            try:
                if pid is not None:
                    os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
