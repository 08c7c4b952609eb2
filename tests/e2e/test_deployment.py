"""deploy/production/dagster.yaml is a valid Dagster instance config, and the code location loads with it.

What `dagster definitions validate` checks of the instance (Dagster 1.13): it loads DAGSTER_HOME/dagster.yaml,
so the top-level schema is enforced (a misspelled top-level key fails) and the storage is instantiated -- for
Postgres that means a live connection. The run launcher, run coordinator and compute log manager are loaded
lazily, so a misspelled key in their `config:` (or a module that does not exist) passes the CLI unnoticed.
Hence two layers here, neither needing a Postgres or Kubernetes server:
  1. the production yaml, unmodified, against Dagster's own schemas: the instance schema
     (`InstanceRef.from_dir` -> `dagster_instance_config`), then every configurable class's `config_type()`,
     exactly as `ConfigurableClassData.rehydrate` does but without instantiating (which would connect);
  2. the real CLI with a copy of the yaml whose `storage:` alone is swapped for SQLite.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION_YAML = ROOT / "deploy" / "production" / "dagster.yaml"
PRODUCTION_WORKSPACE = ROOT / "deploy" / "production" / "workspace.yaml"

# Every `env:` entry of the production yaml, with a dummy value (nothing is contacted).
DUMMY_ENV = {
    "DAGSTER_PG_HOST": "postgres.kiln.svc", "DAGSTER_PG_PORT": "5432", "DAGSTER_PG_DB": "dagster",
    "DAGSTER_PG_USERNAME": "dagster", "DAGSTER_PG_PASSWORD": "not-a-secret",
    "KILN_K8S_IMAGE": "registry.example/kiln:test", "KILN_K8S_NAMESPACE": "kiln",
    "KILN_K8S_SERVICE_ACCOUNT": "kiln-runs", "KILN_K8S_INSTANCE_CONFIG_MAP": "kiln-dagster-instance",
    "KILN_K8S_PG_PASSWORD_SECRET": "kiln-postgresql", "KILN_K8S_ENV_SECRET": "kiln-env",
    "KILN_COMPUTE_LOG_BUCKET": "kiln-compute-logs", "KILN_COMPUTE_LOG_PREFIX": "dagster/compute-logs",
    "AWS_REGION": "us-east-1", "KILN_CODE_SERVER_HOST": "kiln-code.kiln.svc",
    # the production resources of orchestration/deployments.py
    "KILN_DEPLOYMENT": "production", "MLFLOW_TRACKING_URI": "http://mlflow.kiln.svc:5000",
    "KILN_TRAINING_WORKERS": "16",
}


def validate_instance_yaml(home: Path) -> dict[str, dict]:
    """Validate `home/dagster.yaml` against Dagster's schemas without connecting to anything.

    Returns {section: processed config} for the configurable classes; raises on the first invalid one."""
    import importlib

    import sqlalchemy
    from dagster._config import process_config, resolve_to_config_type
    from dagster._core.errors import DagsterInvalidConfigError
    from dagster._core.instance.ref import InstanceRef
    from dagster._core.launcher import RunLauncher
    from dagster._core.run_coordinator import RunCoordinator
    from dagster._core.storage.base_storage import DagsterStorage
    from dagster._core.storage.compute_log_manager import ComputeLogManager
    from dagster_postgres.utils import pg_url_from_config

    ref = InstanceRef.from_dir(str(home))  # the instance schema: unknown top-level keys, storage, concurrency
    sections = {"storage": (ref.storage_data, DagsterStorage), "run_launcher": (ref.run_launcher_data, RunLauncher),
                "run_coordinator": (ref.run_coordinator_data, RunCoordinator),
                "compute_logs": (ref.compute_logs_data, ComputeLogManager)}
    processed = {}
    for section, (data, base) in sections.items():
        try:
            klass = getattr(importlib.import_module(data.module_name), data.class_name)
        except (ImportError, AttributeError) as exc:
            raise DagsterInvalidConfigError(f"{section}: cannot load {data.module_name}.{data.class_name}: {exc}",
                                            [], data.config_dict) from None
        if not issubclass(klass, base):
            raise DagsterInvalidConfigError(f"{section}: {klass} is not a {base.__name__}", [], data.config_dict)
        result = process_config(resolve_to_config_type(klass.config_type()), data.config_dict)
        if not result.success:
            raise DagsterInvalidConfigError(f"{section}: invalid config for {data.module_name}.{data.class_name}",
                                            result.errors, data.config_dict)
        processed[section] = {"class": klass, "config": result.value}
    # Postgres: the URL the storage would connect to must resolve to an installed driver (no connection made).
    engine = sqlalchemy.create_engine(pg_url_from_config(processed["storage"]["config"]))
    engine.dispose()
    return processed


@pytest.fixture
def dummy_env(monkeypatch):
    for key, value in DUMMY_ENV.items():
        monkeypatch.setenv(key, value)
    return DUMMY_ENV


def _home_with(tmp_path: Path, text: str) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(text)
    return home


def test_production_instance_yaml_is_valid(tmp_path, dummy_env):
    home = _home_with(tmp_path, PRODUCTION_YAML.read_text())
    sections = validate_instance_yaml(home)

    from dagster import QueuedRunCoordinator
    from dagster_aws.s3 import S3ComputeLogManager
    from dagster_k8s import K8sRunLauncher
    from dagster_postgres import DagsterPostgresStorage

    assert sections["storage"]["class"] is DagsterPostgresStorage
    assert sections["storage"]["config"]["postgres_db"]["hostname"] == dummy_env["DAGSTER_PG_HOST"]
    assert sections["run_launcher"]["class"] is K8sRunLauncher
    assert sections["run_launcher"]["config"]["job_image"] == dummy_env["KILN_K8S_IMAGE"]
    assert sections["run_launcher"]["config"]["job_namespace"] == dummy_env["KILN_K8S_NAMESPACE"]
    assert sections["run_coordinator"]["class"] is QueuedRunCoordinator
    assert sections["compute_logs"]["class"] is S3ComputeLogManager
    assert sections["compute_logs"]["config"]["bucket"] == dummy_env["KILN_COMPUTE_LOG_BUCKET"]

    raw = yaml.safe_load(PRODUCTION_YAML.read_text())
    assert raw["telemetry"] == {"enabled": False}
    assert {"key": "kiln/training", "value": "true", "limit": 1} in raw["concurrency"]["runs"]["tag_concurrency_limits"]
    # `training_run` has pool="training": with run granularity at most one run holding it is in progress
    assert raw["concurrency"]["pools"] == {"granularity": "run", "default_limit": 1}


BROKEN = {  # (what a hurried edit might do, what the error must name)
    "top-level key": (("run_monitoring:", "run_monitorin:"), "run_monitorin"),
    "postgres key": (("hostname: {env: DAGSTER_PG_HOST}", "hostnam: {env: DAGSTER_PG_HOST}"), "hostnam"),
    "k8s launcher key": (("job_namespace:", "job_namespce:"), "job_namespce"),
    "s3 compute log key": (("bucket: {env:", "buckt: {env:"), "buckt"),
    "run coordinator class": (("class: QueuedRunCoordinator", "class: QueuedRunCoordinater"), "QueuedRunCoordinater"),
    "compute log module": (("module: dagster_aws.s3.compute_log_manager", "module: dagster_aws.s3.compute_logs"),
                           "dagster_aws.s3.compute_logs"),
    "tag limit type": (("limit: 1\n", "limit: one\n"), "limit"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_production_yaml_is_refused(tmp_path, dummy_env, case):
    from dagster._core.errors import DagsterInvalidConfigError

    (old, new), named = BROKEN[case]
    text = PRODUCTION_YAML.read_text()
    assert old in text, f"the fixture no longer matches deploy/production/dagster.yaml: {old!r}"
    home = _home_with(tmp_path, text.replace(old, new, 1))
    with pytest.raises(DagsterInvalidConfigError) as err:
        validate_instance_yaml(home)
    assert named in f"{err.value} {[e.message for e in getattr(err.value, 'errors', [])]}"


def test_a_missing_environment_variable_is_refused(tmp_path, dummy_env, monkeypatch):
    from dagster._core.errors import DagsterInvalidConfigError

    monkeypatch.delenv("KILN_K8S_IMAGE")
    with pytest.raises(DagsterInvalidConfigError) as err:
        validate_instance_yaml(_home_with(tmp_path, PRODUCTION_YAML.read_text()))
    assert "KILN_K8S_IMAGE" in " ".join(e.message for e in err.value.errors)


def test_production_workspace_yaml_is_valid(dummy_env):
    """The webserver and daemon reach the code location's gRPC server (no server needed to check the schema)."""
    from dagster._core.workspace.config_schema import process_workspace_config

    result = process_workspace_config(yaml.safe_load(PRODUCTION_WORKSPACE.read_text()))
    assert result.success, [e.message for e in result.errors]
    [entry] = result.value["load_from"]
    assert entry["grpc_server"] == {"host": dummy_env["KILN_CODE_SERVER_HOST"], "port": 4000,
                                    "location_name": "orchestration.definitions"}


def _cli_instance_yaml(home_dir: Path) -> str:
    """The production yaml with only `storage:` on SQLite: Postgres storage connects when the instance loads."""
    config = yaml.safe_load(PRODUCTION_YAML.read_text())
    config["storage"] = {"sqlite": {"base_dir": str(home_dir / "storage")}}
    return yaml.safe_dump(config, sort_keys=False)


def _validate_cli(home: Path, tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, **env, "DAGSTER_HOME": str(home), "KILN_HOME": str(tmp_path / "kiln"),
           "KILN_CONFIG": str(ROOT / "configs" / "default.yaml"), "MLFLOW_DISABLE_TELEMETRY": "true"}
    dagster = shutil.which("dagster", path=str(Path(sys.executable).parent))
    return subprocess.run([dagster, "definitions", "validate", "-m", "orchestration.definitions"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def test_code_location_validates_with_the_production_instance(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(_cli_instance_yaml(home))
    proc = _validate_cli(home, tmp_path, DUMMY_ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "All code locations passed validation" in proc.stdout + proc.stderr


def test_the_cli_refuses_a_misspelled_top_level_key(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(_cli_instance_yaml(home).replace("run_monitoring:", "run_monitorin:"))
    proc = _validate_cli(home, tmp_path, DUMMY_ENV)
    assert proc.returncode != 0 and "run_monitorin" in proc.stdout + proc.stderr


def test_deployment_resources():
    import dagster as dg

    from orchestration.deployments import deployment_resources

    local, production = deployment_resources("local"), deployment_resources("production")
    assert set(local) == set(production)
    assert production["mlflow_tracking"].tracking_uri == dg.EnvVar("MLFLOW_TRACKING_URI")
    assert production["training_launcher"].launcher == "ray"  # many machines: Ray Train workers
    assert production["training_launcher"].num_workers == dg.EnvVar.int("KILN_TRAINING_WORKERS")
    assert local["training_launcher"].launcher is None  # follows training.launcher
    with pytest.raises(ValueError, match="KILN_DEPLOYMENT='staging'"):
        deployment_resources("staging")


def _resource_env_vars(resource) -> set[str]:
    """The variables a resource reads through dg.EnvVar, its nested resources' included."""
    import dagster as dg

    found = set()
    for value in resource.__dict__.values():
        if isinstance(value, (str, int)) and getattr(value, "env_var_name", None):  # dg.EnvVar, dg.EnvVar.int
            found.add(value.env_var_name)
        elif isinstance(value, dg.ConfigurableResource):
            found |= _resource_env_vars(value)
    return found


def test_run_pods_get_every_variable_the_production_resources_read(dummy_env, monkeypatch):
    """The K8sRunLauncher gives a run pod only its `env_vars` (copied from the daemon) and `env_secrets`: a resource
    variable missing there fails every run that needs the resource, at its initialization in the pod."""
    import dagster as dg
    from dagster_k8s.container_context import K8sContainerContext

    from orchestration.deployments import deployment_resources

    resources = deployment_resources("production")
    read = set().union(*(_resource_env_vars(r) for r in resources.values() if isinstance(r, dg.ConfigurableResource)))
    assert {"MLFLOW_TRACKING_URI", "KILN_TRAINING_WORKERS"} <= read
    launcher = yaml.safe_load(PRODUCTION_YAML.read_text())["run_launcher"]["config"]
    pod_env = {e["name"]: e["value"] for e in K8sContainerContext(env_vars=launcher["env_vars"]).run_k8s_config
               .container_config["env"]}
    assert read <= set(pod_env), f"not copied into run pods (run_launcher.config.env_vars): {read - set(pod_env)}"
    for key in DUMMY_ENV:  # the run pod: what the launcher copies, nothing of the daemon's own environment
        if key not in pod_env:
            monkeypatch.delenv(key)
    with dg.build_resources({k: resources[k] for k in ("training_launcher", "mlflow_tracking")}) as started:
        assert started.training_launcher.num_workers == int(dummy_env["KILN_TRAINING_WORKERS"])
        assert started.mlflow_tracking.tracking_uri == dummy_env["MLFLOW_TRACKING_URI"]
