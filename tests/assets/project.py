"""A tiny Kiln project for asset tests: config written to disk, code location re-imported to follow it."""

import importlib
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import yaml

from kiln.common.config import load_config
from kiln.common.storage import Store  # noqa: F401 (the type of Project.store)
from kiln.governance.refresh import Refresh, load_refreshes, next_refresh
from kiln.governance.refresh import partition as store_partition


@dataclass
class Project:
    definitions: object  # the reloaded orchestration.definitions module
    resources: dict
    home: Path
    config_path: Path
    instance: dg.DagsterInstance  # a real (temporary) instance: dynamic partitions, schedules and sensors need one
    refresh_key: str | None = None  # the refresh `materialize` works on; None: the newest registered one

    @property
    def assets(self) -> list:
        return list(self.definitions.defs.assets)

    @property
    def store(self) -> Store:
        return self.resources["storage"].store()  # local, or S3 with the local cache, as the config says

    def refresh(self, trigger: str = "cli") -> Refresh | None:
        """Register what is new, as the landing sensor does (the first call: the configured sources), and make
        it the refresh later calls work on."""
        new, _ = next_refresh(self.store, load_config(self.config_path), trigger)
        self._mirror()
        if new is not None:
            self.refresh_key = new.key
        return new

    def _mirror(self) -> None:
        keys = [r.key for r in load_refreshes(self.store)]
        known = set(self.instance.get_dynamic_partitions("refresh"))
        self.instance.add_dynamic_partitions("refresh", [k for k in keys if k not in known])

    def current(self) -> str:
        if self.refresh_key is None:
            self.refresh()
        return self.refresh_key

    def partition(self, source: str) -> str:
        """The store partition of a source in the current refresh."""
        return store_partition(source, self.current())

    def materialize(self, selection: list[str], partition: str | None = None, raise_on_error: bool = True,
                    refresh: str | None = None, run_config: dict | None = None):
        """`partition` is a source name for (source, refresh) assets; per-refresh assets take the refresh."""
        refresh = refresh or self.current()
        definition = next(a for a in self.assets if selection[0] in {k.to_user_string() for k in a.keys})
        if partition is not None:
            key = dg.MultiPartitionKey({"refresh": refresh, "source": partition})
        elif definition.partitions_def is not None:
            key = refresh
        else:
            key = None
        return dg.materialize(self.assets, selection=selection, partition_key=key, resources=self.resources,
                              raise_on_error=raise_on_error, instance=self.instance, run_config=run_config)

    def automation_tick(self, cursor=None) -> tuple[object, dict[str, list]]:
        """One evaluation of the automation sensor: its cursor and what it requests, {asset: [partition keys]}."""
        result = dg.evaluate_automation_conditions(defs=self.definitions.defs, instance=self.instance, cursor=cursor)
        keys = self.definitions.defs.resolve_asset_graph().toposorted_asset_keys
        return result.cursor, {k.to_user_string(): sorted(parts, key=str) for k in keys
                               if (parts := result.get_requested_partitions(k))}

    def run_requested(self, requested: dict[str, list]) -> dict[str, list]:
        """Materialize what a tick requested, one run per asset and partition in graph order (the daemon starts them
        together); {asset: [partition keys whose run failed]} for the runs that failed."""
        failed = {}
        for asset, keys in requested.items():
            for key in keys:
                if not dg.materialize(self.assets, selection=[asset], partition_key=key, resources=self.resources,
                                      instance=self.instance, raise_on_error=False).success:
                    failed.setdefault(asset, []).append(key)
        return failed

    def automate(self, cursor=None, ticks: int = 20) -> tuple[object, list[dict[str, list]]]:
        """Tick after tick, run what automation requests until a tick requests nothing: the cursor and every tick's
        requests."""
        log = []
        for _ in range(ticks):
            cursor, requested = self.automation_tick(cursor)
            if not requested:
                return cursor, log
            log.append(requested)
            assert not self.run_requested(requested), f"a requested run failed in tick {len(log)}: {requested}"
        raise AssertionError(f"automation still requesting after {ticks} ticks: {log[-3:]}")

    def materialize_refresh(self, refresh: str | None = None, sources: list[str] | None = None) -> bool:
        """Every data asset of a refresh, in the demo's waves."""
        from orchestration.demo import materialize_refresh

        sources = sources or [s.name for s in load_config(self.config_path).sources]
        refresh = refresh or self.current()
        return materialize_refresh(lambda assets, key: dg.materialize(
            self.assets, selection=assets, partition_key=key, resources=self.resources,
            instance=self.instance).success, self.store, refresh, sources)


def load_project(config: dict, tmp_path: Path, kiln_home: Path, monkeypatch, in_memory: bool = False) -> Project:
    """Partitions are read from the config at import, so every asset module is reloaded after writing it.
    `in_memory`: Dagster's runs and events in memory, for tests about Kiln's data and not Dagster's storage (a
    SQLite instance spends two thirds of a small materialization opening its per-run databases)."""
    path = tmp_path / "kiln.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KILN_CONFIG", str(path))
    import assets.curation
    import assets.dedup
    import assets.governance
    import assets.partitions
    import assets.quality
    import assets.tokens
    import assets.training
    import orchestration.definitions
    import orchestration.refresh

    for module in (assets.partitions, assets.curation, assets.dedup, assets.quality, assets.tokens, assets.training,
                   assets.governance, orchestration.refresh):
        importlib.reload(module)
    definitions = importlib.reload(orchestration.definitions)
    kiln_config = definitions.KilnConfig(path=str(path))
    resources = {"kiln_config": kiln_config,
                 "storage": definitions.KilnStorage(root=str(kiln_home / "data"), kiln_config=kiln_config),
                 "engine": definitions.KilnEngine(),
                 "training_launcher": definitions.TrainingLauncher(),
                 "mlflow_tracking": definitions.MlflowTracking(tracking_uri=f"sqlite:///{kiln_home / 'mlflow.db'}",
                                                               artifact_location=str(kiln_home / "mlartifacts")),
                 "pipes_subprocess_client": dg.PipesSubprocessClient()}
    (tmp_path / "dagster_home").mkdir(exist_ok=True)
    instance = (dg.DagsterInstance.ephemeral if in_memory else dg.DagsterInstance.local_temp)(
        tempdir=str(tmp_path / "dagster_home"))
    return Project(definitions, resources, kiln_home, path, instance)
