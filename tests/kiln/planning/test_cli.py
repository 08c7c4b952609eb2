"""`kiln plan` through a tiny argparse front end, as kiln/cli/ will wire it."""

import argparse
import json
from pathlib import Path

import pytest

from kiln.cli.plan import add_plan_parser, run_plan


@pytest.fixture(autouse=True)
def no_project(tmp_path_factory, monkeypatch):
    """Most tests plan from flags and defaults alone: no $KILN_CONFIG, no configs/default.yaml in the cwd."""
    monkeypatch.delenv("KILN_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    monkeypatch.setenv("KILN_HOME", str(tmp_path_factory.mktemp("kiln-home")))  # no finished runs: MFU 0.4 assumed


def kiln(*argv):
    parser = argparse.ArgumentParser(prog="kiln")
    add_plan_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    return run_plan(args)


def test_one_screen_plan(capsys):
    assert kiln("--budget-usd", "1000000", "--price", "2.5", "--gpu", "H100", "--gpus", "256", "--mfu", "0.4") == 0
    screen = capsys.readouterr().out
    # By hand: $1,000,000 / $2.5 = 400,000 GPU-hours; x 3,600 s x 989 TFLOP/s (H100 SXM dense BF16) x 0.4
    # = 5.70e23 FLOPs; 400,000 h / 256 GPUs / 24 = 65.1 days.
    assert "$1,000,000 on 256 x H100-SXM (32 nodes x 8)" in screen
    assert "5.7e+23 FLOPs" in screen and "at 989 TFLOP/s peak, MFU 40% given" in screen
    assert "400,000 GPU-hours x $2.5 = $1,000,000" in screen
    assert "65.1 days" in screen
    for needle in ("TP ", "PP ", "DP ", "memory/GPU", "GiB"):  # the layout section is there
        assert needle in screen
    assert len(screen.splitlines()) < 40


def test_json(capsys):
    assert kiln("--budget-flops", "1e22", "--json", "--source", "web=1e11", "--weight", "web=1") == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["compute"]["flops"] == 1e22
    assert plan["data"]["sources"][0]["source"] == "web"
    assert {"model", "parallelism", "reliability", "sizing"} <= set(plan)


def test_a_weighted_source_without_tokens_prints_strict_json_and_a_table(capsys):
    """Its infinite epochs made `--json` (json.dumps with allow_nan=False) die with a traceback, exit 1."""
    argv = ["--budget-flops", "1e21", "--source", "web=1e11", "--source", "code=0", "--weight", "web=1",
            "--weight", "code=1"]
    assert kiln(*argv, "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert [s["epochs"] for s in plan["data"]["sources"]][1] is None and not plan["data"]["sufficient"]
    assert any("'code' has no tokens available" in w for w in plan["warnings"])
    assert kiln(*argv) == 0
    assert "no data" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--budget-usd", "-5"], ["budget_usd", "-5", "greater than 0"]),
        (["--gpu", "X100"], ["gpu", "unknown GPU 'X100'", "H100-SXM", "MI300X"]),
        (["--mfu", "1.5"], ["mfu", "1.5", "less than or equal to 1"]),
        (["--gpus", "12"], ["not a multiple of gpus_per_node=8"]),
        # infinite or absurd numbers: a message, not an OverflowError traceback (or minutes of sizing)
        (["--budget-usd", "inf"], ["budget_usd=inf", "finite number"]),
        (["--inference-tokens", "inf"], ["inference_tokens=inf", "finite number"]),
        (["--budget-flops", "1e300"], ["budget_flops=1e+300", "less than or equal to"]),
        (["--price", "1e-300"], ["price_per_gpu_hour=1e-300", "greater than or equal to 0.0001"]),
        (["--gpu-mtbf-hours", "1e-300"], ["gpu_mtbf_hours=1e-300", "greater than or equal to 0.01"]),
        (["--checkpoint-write-seconds", "1e12"], ["checkpoint_write_seconds=1000000000000.0", "less than or equal to"]),
        (["--restart-minutes", "1e6"], ["restart_minutes=1000000.0", "less than or equal to"]),
        # the natural mixture weights sources by their tokens: all 0 names available_tokens, not mixture_weights
        (["--source", "web=0"], ["available_tokens sum to 0", "'web': 0.0", "tokens > 0"]),
        (["--n-layers", "2", "--d-model", "64"], ["model.n_heads: Field required", "--n-heads"]),
        (["--experiment", "x"], ["--experiment needs --mlflow-uri"]),
        # failures faster than a checkpoint can be written and restarted from: 3600 s / 16384 GPUs = 0.22 s
        (["--gpu-mtbf-hours", "1", "--gpus", "16384"],
         ["checkpointing cannot make progress", "gpu_mtbf_hours 1 / 16384 GPUs", "checkpoint_write_seconds"]),
    ],
)
def test_bad_input_exits_2_with_a_message(argv, needles, capsys):
    assert kiln(*argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("kiln plan: ")
    for needle in needles:
        assert needle in captured.err


def test_argparse_level_errors_also_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        kiln("--budget-usd", "1", "--budget-flops", "1e20")
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        kiln("--source", "web")
    assert info.value.code == 2 and "NAME=NUMBER" in capsys.readouterr().err


def test_config_then_flags(tmp_path, capsys):
    import yaml

    project = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "default.yaml").read_text())
    project["planning"] = {"budget_usd": 50000, "gpu": "A100", "n_gpus": 16, "available_tokens": {"web": 1.0e9}}
    config = tmp_path / "kiln.yaml"
    config.write_text(yaml.safe_dump(project))
    assert kiln("--config", str(config), "--budget-flops", "1e21", "--source", "code=1e9", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["request"]["budget_usd"] is None and plan["request"]["budget_flops"] == 1e21
    assert plan["cluster"]["n_gpus"] == 16 and plan["gpu"]["name"] == "A100-80GB"
    assert {s["source"] for s in plan["data"]["sources"]} == {"web", "code"}
    assert kiln("--config", str(tmp_path / "missing.yaml")) == 2
    assert "missing.yaml' not found" in capsys.readouterr().err
    project["planning"]["mfu"] = 3
    config.write_text(yaml.safe_dump(project))
    assert kiln("--config", str(config)) == 2
    # validated as part of the project config; every line of the message prefixed, as every kiln command says it
    assert capsys.readouterr().err.splitlines() == [f"kiln plan: {config}: invalid config",
                                                    "kiln plan:   planning.mfu = 3: Input should be less than or "
                                                    "equal to 1"]


def test_the_project_config_is_read_like_every_kiln_command(tmp_path, monkeypatch, capsys):
    """Without --config, `kiln plan` starts from $KILN_CONFIG's `planning:` (else configs/default.yaml), and a flag
    replaces the config's value of the same quantity, in whichever form the config gave it."""
    import yaml

    repo = Path(__file__).resolve().parents[3]
    project = yaml.safe_load((repo / "configs" / "default.yaml").read_text())
    project["planning"] = {"budget_usd": 50000, "gpu": "A100", "nodes": 2, "gpus_per_node": 8}
    config = tmp_path / "kiln.yaml"
    config.write_text(yaml.safe_dump(project))
    monkeypatch.setenv("KILN_CONFIG", str(config))
    assert kiln("--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["request"]["budget_usd"] == 50000 and plan["cluster"]["n_gpus"] == 16
    assert plan["gpu"]["name"] == "A100-80GB"
    assert kiln("--gpus", "32", "--json") == 0  # not a conflict with the config's nodes: 2
    assert json.loads(capsys.readouterr().out)["cluster"]["n_gpus"] == 32
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**project, "planning": {"gpu": "H200"}}))
    assert kiln("--config", str(other), "--json") == 0  # --config wins over $KILN_CONFIG
    assert json.loads(capsys.readouterr().out)["gpu"]["name"] == "H200"
    monkeypatch.setenv("KILN_CONFIG", str(tmp_path / "gone.yaml"))  # set but missing: said, not ignored
    assert kiln() == 2 and "gone.yaml' not found" in capsys.readouterr().err
    monkeypatch.delenv("KILN_CONFIG")
    monkeypatch.chdir(repo)  # configs/default.yaml in the working directory, as for every kiln command
    assert kiln("--json") == 0
    default = yaml.safe_load((repo / "configs" / "default.yaml").read_text())["planning"]
    assert json.loads(capsys.readouterr().out)["request"]["budget_usd"] == default["budget_usd"]


def test_own_fits_need_an_experiment(capsys):
    """The fit itself is tested on real training runs (tests/training_jobs/test_train_cpu.py)."""
    assert kiln("--mlflow-uri", "sqlite:///nowhere.db") == 2
    assert "--experiment" in capsys.readouterr().err


def test_a_tracking_store_that_cannot_be_read_exits_2_naming_it(tmp_path, capsys):
    """A file-store folder, a scheme MLflow does not know, a missing SQLite file and a file that is no SQLite database
    (SQLAlchemy's DatabaseError, not an MlflowException): a message and exit 2, where MLflow raised a traceback (exit
    1) or created the database empty."""
    (tmp_path / "mlruns").mkdir()
    (tmp_path / "notes.db").write_text("not a database\n")
    for uri, needle in ((str(tmp_path / "mlruns"), f"--mlflow-uri {tmp_path / 'mlruns'}: "),
                        ("ftp://host/x", "--mlflow-uri ftp://host/x: "),
                        (f"sqlite:///{tmp_path}/absent.db", "no such SQLite file"),
                        (f"sqlite:///{tmp_path}/notes.db", f"--mlflow-uri sqlite:///{tmp_path}/notes.db: "
                                                            "(sqlite3.DatabaseError) file is not a database\n")):
        assert kiln("--mlflow-uri", uri, "--experiment", "kiln") == 2, uri
        err = capsys.readouterr().err
        assert err.startswith("kiln plan: ") and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "absent.db").exists()


def finished_run(home: Path, key: str, **summary) -> None:
    """A hand-made summary.json where the training asset writes one (KILN_HOME/runs/<key>/)."""
    folder = home / "runs" / key
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"status": "completed", "flops_per_token": 1e9, "world_size": 1,
                                                     **summary}))


def test_the_default_mfu_is_kilns_own_on_that_gpu_and_the_plan_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KILN_HOME", str(tmp_path))
    # Three H200 runs. Two from before steady goodput was recorded count by their whole goodput: 100k tok/s x 1e9
    # FLOPs/token for 1,000 s on 1 GPU = 1e17 FLOPs in 1,000 GPU-s; 150k tok/s on 2 GPUs for 250 s = 3.75e16 FLOPs in
    # 500 GPU-s. The third counts by its steady goodput, not its whole (50k tok/s over 400 s: startup and compilation
    # in): 80k tok/s x 1e9 for 300 s = 2.4e16 FLOPs in 300 GPU-s. Pooled: 1.615e17 / (989e12 x 1,800) = 0.09072
    # (the mean of the three runs' MFUs, 0.1011, 0.0758 and 0.0809, would be 0.0859).
    finished_run(tmp_path, "a", device="NVIDIA H200", goodput_tokens_per_s=100_000.0, time={"wall_s": 1000.0},
                 mfu=0.5)
    finished_run(tmp_path, "b", device="NVIDIA H200", goodput_tokens_per_s=150_000.0, time={"wall_s": 250.0},
                 world_size=2)
    finished_run(tmp_path, "g", device="NVIDIA H200", goodput_tokens_per_s=50_000.0, time={"wall_s": 400.0},
                 steady_goodput_tokens_per_s=80_000.0, steady_s=300.0)
    # Not counted: another GPU kind, a failed run, a CPU run, a run from before goodput was reported.
    finished_run(tmp_path, "c", device="NVIDIA H100 80GB HBM3", goodput_tokens_per_s=9e5, time={"wall_s": 100.0})
    finished_run(tmp_path, "d", device="NVIDIA H200", goodput_tokens_per_s=9e5, time={"wall_s": 100.0},
                 status="failed")
    finished_run(tmp_path, "e", device="cpu", goodput_tokens_per_s=9e5, time={"wall_s": 100.0})
    finished_run(tmp_path, "f", device="NVIDIA H200", tokens_per_s=9e5, mfu=0.9)
    for key, text in (("h", "[1, 2]"), ("i", '{"status": "completed", "device": "NVIDIA H200", "goodput_tokens_per_s": 9e5, "time": {"wall_s": 100}}')):
        (tmp_path / "runs" / key).mkdir()  # not a run's summary: a list, one without its figures (not a traceback)
        (tmp_path / "runs" / key / "summary.json").write_text(text)
    assert kiln("--budget-usd", "100000", "--price", "2.5", "--gpu", "H200", "--gpus", "8", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["mfu"]["origin"] == "measured" and plan["mfu"]["n_runs"] == 3
    assert plan["mfu"]["runs"] == [str(tmp_path / "runs" / key / "summary.json") for key in "abg"]
    assert plan["mfu"]["mfu"] == pytest.approx(1.615e17 / (989e12 * 1800))
    # $100,000 / $2.5 = 40,000 GPU-hours x 3,600 s x 989e12 FLOP/s x 0.09072
    assert plan["compute"]["flops"] == pytest.approx(40_000 * 3600 * 1.615e17 / 1800)
    assert kiln("--budget-usd", "100000", "--gpu", "H200", "--gpus", "8") == 0
    assert "MFU 9.1% from 3 runs of Kiln on H200" in capsys.readouterr().out
    assert kiln("--budget-usd", "100000", "--gpu", "A100", "--gpus", "8") == 0
    assert "MFU 40% assumed (no runs of Kiln on A100-80GB)" in capsys.readouterr().out
    # A given MFU wins over the measured one (shown as in test_one_screen_plan: "MFU 40% given").
    from kiln.planning.hardware import lookup_gpu
    from kiln.planning.own_mfu import choose_mfu, runs_in

    given = choose_mfu(0.3, lookup_gpu("H200"), runs_in(tmp_path / "runs"))
    assert (given.mfu, given.origin, given.describe()) == (0.3, "given", "MFU 30% given")


@pytest.mark.parametrize("device, kind", [
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"), ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"), ("NVIDIA L40", None),
    ("NVIDIA GH200 480GB", None), ("cpu", None)])
def test_cuda_device_names_map_to_the_planners_gpus(device, kind):
    from kiln.planning.own_mfu import gpu_kind

    assert gpu_kind(device) == kind


def test_a_tracking_server_that_cannot_be_reached_is_named_without_its_password(capsys, monkeypatch):
    """MLflow's error quotes the URL it requested whole: `kiln plan --mlflow-uri http://user:secret@host` printed the
    password on stderr (operations.md: error messages show URLs without their user:password@)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # port 1 refuses at once; no retries
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    assert kiln("--mlflow-uri", "http://kiln:s3cret-pw@127.0.0.1:1", "--experiment", "kiln") == 2
    err = capsys.readouterr().err
    assert err.startswith("kiln plan: --mlflow-uri http://127.0.0.1:1: API request to http://127.0.0.1:1/api/"), err
    assert "s3cret" not in err and "kiln:" not in err.removeprefix("kiln plan:"), err
