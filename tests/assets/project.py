"""A tiny Kiln project for asset tests: config written to disk, code location re-imported to follow it."""

import importlib
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import yaml


@dataclass
class Project:
    definitions: object  # the reloaded orchestration.definitions module
    resources: dict
    home: Path

    @property
    def assets(self) -> list:
        return list(self.definitions.defs.assets)

    def materialize(self, selection: list[str], partition: str | None = None, raise_on_error: bool = True):
        return dg.materialize(self.assets, selection=selection, partition_key=partition, resources=self.resources,
                              raise_on_error=raise_on_error)


def load_project(config: dict, tmp_path: Path, kiln_home: Path, monkeypatch) -> Project:
    """Partitions are read from the config at import, so every asset module is reloaded after writing it."""
    path = tmp_path / "kiln.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KILN_CONFIG", str(path))
    import assets.curation
    import assets.dedup
    import assets.governance
    import assets.quality
    import assets.tokens
    import assets.training
    import orchestration.definitions

    importlib.reload(assets.curation)
    importlib.reload(assets.dedup)
    importlib.reload(assets.quality)
    importlib.reload(assets.tokens)
    importlib.reload(assets.training)
    importlib.reload(assets.governance)
    definitions = importlib.reload(orchestration.definitions)
    kiln_config = definitions.KilnConfig(path=str(path))
    resources = {"kiln_config": kiln_config,
                 "storage": definitions.KilnStorage(root=str(kiln_home / "data"), kiln_config=kiln_config),
                 "dedup_index_store": definitions.DedupIndexStore(root=str(kiln_home / "dedup_index")),
                 "training_launcher": definitions.TrainingLauncher(),
                 "mlflow_tracking": definitions.MlflowTracking(tracking_uri=f"sqlite:///{kiln_home / 'mlflow.db'}",
                                                               artifact_location=str(kiln_home / "mlartifacts")),
                 "pipes_subprocess_client": dg.PipesSubprocessClient()}
    return Project(definitions, resources, kiln_home)
