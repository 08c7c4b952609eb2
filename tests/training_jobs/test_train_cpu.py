"""Real multi-process DeepSpeed ZeRO-3 training on CPU (gloo): the run, checkpoints, exact resume, a corrupt
checkpoint, a loss spike and its rollback, NaN before any checkpoint, MLflow, Dagster Pipes, and the
consolidated exports.

Uninterrupted reference: run A (torchrun, 2 ranks, 12 steps, a checkpoint every 4, keep 2). Run B stops at
step 8 (deepspeed launcher, same LR curve through schedule.total_steps=12); copies of it are resumed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.training_jobs.conftest import (BASE, REPO, check, launch, launch_command, mlflow_store, read_metrics,
                                         run_a_mlflow_uri, summary_of, write_run)
from tests.s3 import _moto_server, s3_endpoint  # noqa: F401 (fixtures)
from training_jobs import checkpoint

pytestmark = pytest.mark.slow

def test_two_rank_run_learns_and_reports(run_a):
    summary = summary_of(run_a)
    metrics = read_metrics(run_a)
    assert summary["status"] == "completed" and summary["steps"] == 12 and summary["world_size"] == 2
    assert sorted(metrics) == list(range(1, 13))
    losses = [metrics[s]["train/loss"] for s in range(1, 13)]
    assert sum(losses[-3:]) / 3 < losses[0] - 0.5  # it learns
    assert summary["final_loss"] == losses[-1] and 0 < summary["val_loss"] < losses[0]
    val_rows = [json.loads(line) for line in (run_a / "metrics.jsonl").read_text().splitlines() if "val/loss" in line]
    assert [r["step"] for r in val_rows] == [6, 12] and val_rows[-1]["val/loss"] == summary["val_loss"]
    assert summary["tokens_seen"] == 12 * 2 * 4 * 32 and summary["tokens_per_s"] > 0
    assert summary["mfu"] is None and metrics[5]["train/mfu"] is None  # no peak on CPU, no guess
    assert summary["stability_events"] == [] and summary["rollbacks"] == 0
    assert summary["n_params"] == 139_584 and summary["flops_per_token"] == 886_656
    # on CPU rank 0's peak resident set: at least torch and DeepSpeed (hundreds of MB), far below the 24 GiB machine
    assert 0.2 < summary["peak_memory_gib"] < 8
    assert summary["checkpoint"].endswith("step_00000012") and summary["mlflow_run_id"]
    # torchrun's per-launch log folders are in the run folder, not left behind in the temporary directory
    assert not list((run_a.parent / "tmp").glob("torchelastic_*")) and (run_a / "torchelastic").is_dir()
    # Goodput: the counted tokens over all of fit()'s wall time; its parts (the first step, the profiled steps 3-4 and
    # their report, the other steps, checkpoints 4, 8, 12, validation at 6 and 12, waiting at the end for the
    # checkpoints to be written and hashed, the final validation, export) sum to it, with what none claims as
    # other_s (>= 0).
    time_spent = summary["time"]
    assert 0 < summary["goodput_tokens_per_s"] <= summary["tokens_per_s"] and summary["goodput_mfu"] is None
    assert summary["goodput_tokens_per_s"] == pytest.approx(12 * 256 / time_spent["wall_s"], rel=1e-3)
    assert sum(v for k, v in time_spent.items() if k != "wall_s") == pytest.approx(time_spent["wall_s"], abs=0.01)
    assert time_spent["other_s"] >= -0.005 and min(time_spent[k] for k in (
        "train_s", "warmup_s", "profile_s", "startup_s", "checkpoint_s", "validation_s", "final_validation_s",
        "export_s")) > 0
    assert time_spent["final_checkpoint_s"] >= 0  # step 12 was saved at the cadence: only its completion waited for
    # Steady goodput: the 9 steps neither first nor profiled, over the time left without the one-time parts
    one_time = sum(time_spent[k] for k in ("startup_s", "warmup_s", "profile_s", "final_checkpoint_s",
                                            "final_validation_s", "export_s"))
    # (seven figures each rounded to the millisecond: within 3.5 ms, and the steady window is under a second)
    assert summary["steady_s"] == pytest.approx(time_spent["wall_s"] - one_time, abs=0.004)
    assert summary["steady_goodput_tokens_per_s"] == pytest.approx(9 * 256 / summary["steady_s"])
    stall = summary["checkpoint_stall"]
    assert stall["count"] == 3 and 0 < stall["max_s"] <= stall["total_s"] <= time_spent["checkpoint_s"]
    stalls = [json.loads(line) for line in (run_a / "metrics.jsonl").read_text().splitlines() if "stall_s" in line]
    assert [r["step"] for r in stalls] == [4, 8, 12]
    assert sum(r["checkpoint/stall_s"] for r in stalls) == pytest.approx(stall["total_s"], abs=0.002)


def test_the_export_reproduces_the_loss_recorded_at_save_time_and_other_weights_do_not(run_a):
    """The checkpoint asset's `loads` check: the export, reloaded, must give the loss the trained (ZeRO-3, two
    ranks) model had on a held-back sequence; the same model with one matrix off misses it."""
    from training_jobs.export import load_model, probe_check

    summary = summary_of(run_a)
    probe = summary["loss_probe"]
    assert len(probe["inputs"]) == len(probe["targets"]) == 32 and probe["inputs"][1:] == probe["targets"][:-1]
    model = load_model(Path(summary["exports"]["safetensors"]))
    good = probe_check(model, probe, summary["precision"])
    assert good["passed"], good
    with torch.no_grad():
        model.layers[0].mlp.down_proj.weight.mul_(-1.0)
    bad = probe_check(model, probe, summary["precision"])
    assert not bad["passed"] and abs(bad["reloaded_loss"] - probe["loss"]) > 0.01, bad


def test_a_profile_of_two_steps_is_written(run_a):
    """training.profile_steps [3, 4] (run_a's): rank 0's torch.profiler window, in profile/. That it changes no loss
    is shown by the resume tests: run_b, without a profile, has run_a's losses bit for bit."""
    profile = summary_of(run_a)["profile"]
    assert profile["steps"] == [3, 4] and profile["wall_s"] > 0
    assert profile["device_busy_fraction"] is None  # no device on CPU, and no CUDA call to wait in
    assert profile["host_waits"] == {"cudaDeviceSynchronize": 0, "cudaStreamSynchronize": 0, "cudaEventSynchronize": 0}
    ops = (run_a / "profile" / "ops.txt").read_text()
    assert "Self CPU" in ops and "aten::mm" in ops  # the blocks' matmuls, forward and backward
    events = json.loads((run_a / "profile" / "trace.json").read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)


def test_kiln_plan_fits_a_scaling_law_on_kilns_own_runs(tmp_path, token_dataset, capsys):
    """Three real training runs of different sizes log what the planner needs under one set of names; `kiln plan
    --mlflow-uri` reads them (not hand-made records) and fits L(C). Expected values come from each run's own
    summary.json, independently of MLflow."""
    from kiln.cli import main

    mlflow_uri = mlflow_store(tmp_path, "kiln-scaling")
    summaries = []
    for d_model in (16, 32, 64):
        out = tmp_path / f"d{d_model}"
        check(launch(write_run(tmp_path, token_dataset, out, experiment="kiln-scaling",
                               model={"d_model": d_model, "n_heads": 4}), nproc=1, launcher="python",
                     env={"MLFLOW_TRACKING_URI": mlflow_uri}))  # one plain process: the launcher is not under test
        summaries.append(summary_of(out))
    code = main(["plan", "--mlflow-uri", mlflow_uri, "--experiment", "kiln-scaling", "--budget-flops", "1e18",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    own = json.loads(out)["own_fit"]
    assert own["n_runs"] == 3
    law = own["compute_law"]
    assert law is not None and not law.get("error"), own
    from kiln.planning.fits import runs_from_mlflow

    runs = sorted(runs_from_mlflow(mlflow_uri, "kiln-scaling"), key=lambda r: r.n_params)
    assert [(r.n_params, r.tokens, r.loss) for r in runs] == [
        (s["n_params"], s["tokens_seen"], s["val_loss"]) for s in sorted(summaries, key=lambda s: s["n_params"])]
    assert [r.flops for r in runs] == [s["flops_per_token"] * s["tokens_seen"] for s in
                                       sorted(summaries, key=lambda s: s["n_params"])]
    assert main(["plan", "--mlflow-uri", mlflow_uri, "--experiment", "kiln-scaling", "--budget-flops", "1e18"]) == 0
    table = capsys.readouterr().out
    assert "Own scaling fits (3 runs)" in table
    # The same runs as the plan's default MFU reads them, from MLflow and from summary.json (CPU: no GPU kind).
    from kiln.planning import own_mfu

    tracked = sorted(own_mfu.runs_from_mlflow(mlflow_uri, "kiln-scaling"), key=lambda r: r.model_flops)
    expected = sorted((own_mfu.from_summary(s, "") for s in summaries), key=lambda r: r.model_flops)
    assert [(r.device, r.gpu_seconds, r.gpu) for r in tracked] == [(r.device, r.gpu_seconds, None) for r in expected]
    assert [r.model_flops for r in tracked] == pytest.approx([r.model_flops for r in expected])
    assert [r.mlflow_run_id for r in tracked] == [r.mlflow_run_id for r in expected]
    print("\n[kiln plan, own fit]\n" + table[table.index("Own scaling fits"):])


def test_checkpoints_are_complete_verified_and_rotated(run_a):
    root = run_a / "checkpoints"
    assert [f.step for f in checkpoint.checkpoints(root, complete_only=False)] == [8, 12]  # keep_last 2
    for step in (8, 12):
        ckpt = root / checkpoint.tag_for(step)
        assert checkpoint.verify(ckpt) is None
        manifest = checkpoint.read_manifest(ckpt)
        assert manifest["world_size"] == 2 and manifest["step"] == step
        assert {f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in (0, 1) for kind in ("model", "optim")} \
            <= set(manifest["files"])


def test_nothing_persisted_needs_pickle(run_a):
    ckpt = run_a / "checkpoints" / "step_00000012"
    plain = checkpoint.check_weights_only(ckpt)
    assert plain["zero_pp_rank_0_mp_rank_00_model_states.pt"] is None  # holds our client_state
    assert "ZeroStageEnum" in plain["zero_pp_rank_0_mp_rank_00_optim_states.pt"]  # DeepSpeed's own objects
    assert set(checkpoint.check_weights_only(ckpt, allow_deepspeed=True).values()) == {None}
    state = torch.load(ckpt / "zero_pp_rank_0_mp_rank_00_model_states.pt", weights_only=True)["kiln"]
    assert state["step"] == 12 and state["loader"]["position"] == 12 * 4 and len(state["rng"]) == 2
    assert state["tokens_seen"] == 12 * 256 and state["monitor"]["format"] == "kiln-monitor/1"


def test_mlflow_has_params_metrics_and_the_deepspeed_config(run_a):
    import mlflow
    client = mlflow.MlflowClient(run_a_mlflow_uri(run_a))
    run = client.get_run(summary_of(run_a)["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "a"
    assert run.data.params["model.n_params"] == "139584" and run.data.params["world_size"] == "2"
    assert run.data.params["compile"] == "False" and "off on CPU" in run.data.params["compile.why"]  # auto, on CPU
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == [2, 4, 6, 8, 10, 12]
    assert history[-1].value == pytest.approx(summary_of(run_a)["final_loss"])
    assert "val/loss" in run.data.metrics and "train/tokens_per_s" in run.data.metrics
    assert run.data.metrics["run/goodput_tokens_per_s"] == pytest.approx(summary_of(run_a)["goodput_tokens_per_s"])
    assert run.data.metrics["run/steady_goodput_tokens_per_s"] == pytest.approx(
        summary_of(run_a)["steady_goodput_tokens_per_s"])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "checkpoint/stall_s")] == [4, 8, 12]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"deepspeed_config.json", "run_config.json", "summary.json"} <= artifacts
    # the layout and why: on CPU the shipped JSON's ZeRO-3 and the micro-batch the settings give (4)
    assert (run.data.params["layout.zero_stage"], run.data.params["layout.micro_batch"]) == ("3", "4")
    assert "no accelerator" in run.data.params["layout.reason"]
    summary = summary_of(run_a)
    manifest = checkpoint.read_manifest(Path(summary["checkpoint"]))
    assert summary["layout"] == manifest["layout"] and summary["layout"]["grad_accum"] == 1


def test_exports_of_the_trained_model_agree(run_a):
    transformers = pytest.importorskip("transformers")
    from training_jobs.export import load_model

    kiln = load_model(run_a / "export" / "safetensors")
    hf = transformers.AutoModelForCausalLM.from_pretrained(run_a / "export" / "hf", dtype=torch.float32).eval()
    tokens = torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, kiln(tokens), atol=1e-4, rtol=0)
        # the consolidated weights are the trained ones: the export reproduces the reported val loss scale
        assert kiln(tokens[:, :-1], tokens[:, 1:]).item() < 6.5


def test_resume_reproduces_the_uninterrupted_run_exactly(run_a, run_b, tmp_path, token_dataset):
    assert summary_of(run_b)["steps"] == 8
    out = tmp_path / "b_resumed"
    shutil.copytree(run_b, out)
    check(launch(write_run(tmp_path, token_dataset, out, max_steps=12), nproc=2))
    assert resumed_at_8_like(run_a, out)["val_loss"] == summary_of(run_a)["val_loss"]


def resumed_at_8_like(run_a: Path, out: Path) -> dict:
    """`out` resumed from step 8 and its steps 1..12 are run_a's bit for bit; its summary."""
    summary = summary_of(out)
    assert summary["resumed_from"].endswith("step_00000008") and summary["steps_this_run"] == 4
    expected, got = read_metrics(run_a), read_metrics(out)
    for step in range(1, 13):
        for key in ("train/loss", "train/grad_norm", "train/lr"):
            assert got[step][key] == expected[step][key], (step, key)  # bit for bit
    return summary


def processes_of(run_config: Path) -> list[int]:
    """Every process whose command line names this run config: the launcher and all ranks."""
    found = []
    for proc_dir in Path("/proc").iterdir():
        try:
            if proc_dir.name.isdigit() and str(run_config).encode() in (proc_dir / "cmdline").read_bytes():
                found.append(int(proc_dir.name))
        except OSError:  # exited meanwhile
            continue
    return found


def kill_every_process_of(run_config: Path) -> None:
    """SIGKILL the launcher and every rank (torchrun starts ranks in their own sessions): a node dying."""
    for pid in processes_of(run_config):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_killed_run_resumes_exactly(run_a, tmp_path, token_dataset):
    """SIGKILL every process in the middle of step 10 (checkpoint 8 is complete), start again: the run resumes
    from step 8 and steps 9..12 equal the uninterrupted run's bit for bit."""
    out = tmp_path / "killed"
    config = write_run(tmp_path, token_dataset, out)
    cmd, env = launch_command(config, nproc=2, env={"KILN_INJECT_FAULT": "hang@10"})
    log = tmp_path / "killed.log"  # the injector says when a rank is in step 10 (step 9 is judged a step late)
    with open(log, "wb") as stdout:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=stdout, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not ((out / "checkpoints" / "step_00000008" / checkpoint.MANIFEST).is_file() and
                   b"hanging in step 10" in log.read_bytes()):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended or stalled before step 10"
            time.sleep(0.2)
    finally:
        kill_every_process_of(config)
        proc.wait(30)
    assert not (out / "summary.json").exists()  # killed, not finished
    assert sorted(read_metrics(out)) == list(range(1, 9))  # written before checkpoint 8; step 9 was never judged
    time.sleep(1)
    assert not processes_of(config), "a rank survived the kill"
    check(launch(config, nproc=2))
    summary = summary_of(out)
    assert summary["resumed_from"].endswith("step_00000008") and summary["steps_this_run"] == 4
    expected, got = read_metrics(run_a), read_metrics(out)
    for step in range(9, 13):
        for key in ("train/loss", "train/grad_norm", "train/lr"):
            assert got[step][key] == expected[step][key], (step, key)


def test_a_run_stopped_on_one_machine_resumes_on_another_from_s3(run_a, run_b, tmp_path, token_dataset,
                                                                 s3_endpoint):  # noqa: F811
    """run_b's folder goes up to S3 through its mirror (kiln/common/run_mirror.py); another machine, with nothing of
    the run, pulls the newest checkpoint and the launch resumes from it: steps 9..12 equal the uninterrupted run's
    bit for bit, and the metrics before the stop came down with it."""
    from kiln.common.remote import S3Remote
    from tests.s3 import s3_client
    from kiln.common.run_mirror import RunMirror

    remote = S3Remote.connect(s3_client(s3_endpoint), "kiln-runs", "kiln", create_bucket=True)
    assert RunMirror(remote, run_b, keep_last=2).push() == ["step_00000008", "step_00000004"]
    there, warnings = tmp_path / "elsewhere" / run_b.name, []  # the same run key on another machine
    assert RunMirror(remote, there, keep_last=2).pull(warnings.append) == "step_00000008"
    assert not warnings and read_metrics(there) == read_metrics(run_b)
    check(launch(write_run(tmp_path, token_dataset, there, max_steps=12), nproc=2))
    resumed_at_8_like(run_a, there)


def test_a_corrupt_newest_checkpoint_is_skipped(run_a, run_b, tmp_path, token_dataset):
    out = tmp_path / "b_corrupt"
    shutil.copytree(run_b, out)
    victim = out / "checkpoints" / "step_00000008" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    done = launch(write_run(tmp_path, token_dataset, out, max_steps=12), nproc=2)
    check(done)
    assert "skipping checkpoint step_00000008" in done.stdout
    summary = summary_of(out)
    assert summary["resumed_from"].endswith("step_00000004")
    rejected = out / "checkpoints" / "_rejected" / "step_00000008"
    assert "does not match its sha256" in (rejected / "REJECTED.txt").read_text()
    expected, got = read_metrics(run_a), read_metrics(out)
    assert [got[s]["train/loss"] for s in range(5, 13)] == [expected[s]["train/loss"] for s in range(5, 13)]


def test_a_run_of_two_ranks_is_refused_on_one_before_deepspeed_loads_it(run_b, tmp_path, token_dataset):
    """The folder of a 2-rank ZeRO-3 run launched again with 1 rank (the GPU count changed): Kiln's refusal, naming
    both counts, in place of DeepSpeed's ZeRORuntimeException from load_checkpoint; one Ray Train does not retry."""
    from training_jobs.train import REFUSALS

    out = tmp_path / "b_one_rank"
    shutil.copytree(run_b, out)
    done = launch(write_run(tmp_path, token_dataset, out, max_steps=12), nproc=1)
    assert done.returncode != 0
    error = summary_of(out)["error"]
    assert "step_00000008 was written by 2 ranks and this launch has 1" in error, error
    assert "ZeRORuntimeException" not in done.stdout + done.stderr
    assert "CheckpointMismatch" in error and checkpoint.CheckpointMismatch in REFUSALS


@pytest.fixture(scope="module")
def spike_run(tmp_path_factory, token_dataset) -> tuple[Path, dict]:
    """One rank, launched through Dagster Pipes as the training_run asset will; step 7's loss is x100: the run folder
    and the materialization's metadata."""
    import sys

    from dagster import PipesSubprocessClient, asset, materialize

    root = tmp_path_factory.mktemp("spike")
    out = root / "spike"
    run_config = write_run(root, token_dataset, out, monitor={"lr_reduced_steps": 3})

    @asset(required_resource_keys={"pipes"})
    def trained_model(context):
        command = [sys.executable, "-m", "training_jobs.train", "--run-config", str(run_config)]
        return context.resources.pipes.run(command=command, context=context, cwd=str(REPO), env={
            "KILN_INJECT_FAULT": "spike@7", "OMP_NUM_THREADS": "1"}).get_materialize_result()

    result = materialize([trained_model], resources={"pipes": PipesSubprocessClient()})
    assert result.success
    return out, result.asset_materializations_for_node("trained_model")[0].metadata


def test_a_loss_spike_rolls_back_skips_data_and_finishes(spike_run):
    """The monitor judges step 7 a step late, once step 8 is under way: the rollback to checkpoint 4 still comes
    before step 8's checkpoint, which is written only from the redone steps."""
    out, metadata = spike_run
    assert metadata["rollbacks"].value == 1 and metadata["stability_events"].value == 1
    assert metadata["status"].value == "completed" and metadata["steps"].value == 12

    summary = summary_of(out)
    (event,) = summary["stability_events"]
    assert (event["kind"], event["action"], event["step"], event["rollback_to"], event["skipped_steps"]) == \
        ("loss_spike", "rollback", 7, 4, 3)
    tokens_per_step = 4 * 32
    assert summary["tokens_skipped"] == 3 * tokens_per_step and summary["tokens_seen"] == 12 * tokens_per_step

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8, 9, 10, 11, 12]  # step 7 was rolled back, 5 and 6 redone
    first5, second5 = [r for r in rows if r["step"] == 5 and "train/loss" in r]
    assert second5["train/lr"] == pytest.approx(first5["train/lr"] * 0.5)  # lowered LR ...
    assert second5["train/loss"] != first5["train/loss"]  # ... on other data (the window was skipped)

    # Checkpoint 8 came after the rollback: it skipped steps 5-7's data, so its loader stands 3 steps further on.
    kiln_state = {step: torch.load(out / "checkpoints" / checkpoint.tag_for(step) /
                                   "zero_pp_rank_0_mp_rank_00_model_states.pt", weights_only=True)["kiln"]
                  for step in (8, 12)}
    assert kiln_state[8]["tokens_skipped"] == 3 * tokens_per_step
    assert kiln_state[8]["loader"]["position"] == (8 + 3) * 4
    assert [e["kind"] for e in kiln_state[12]["monitor"]["events"]] == ["loss_spike"]  # in the client_state too


# training_jobs.train, SIGKILLed (a node dying) as soon as a rollback is done, before any step after it.
_KILLED_AFTER_THE_ROLLBACK = """
import os, signal, sys
from training_jobs import train
real = train.Trainer._roll_back
def roll_back(self, *args):
    if real(self, *args):
        os.kill(os.getpid(), signal.SIGKILL)
    return False
train.Trainer._roll_back = roll_back
sys.exit(train.main(sys.argv[1:]))
"""


def test_a_run_killed_after_a_rollback_resumes_as_rolled_back(spike_run, tmp_path, token_dataset):
    """spike_run's settings and spike, killed right after its rollback to checkpoint 4, before checkpoint 8: resumed
    from checkpoint 4, it read steps 5-7's data again (the skipped window, which holds the spike on real data), at the
    full LR, with no rollback counted: its steps 5..12 were another run's. It continues as spike_run did, bit for
    bit, with the rollback in its summary."""
    out = tmp_path / "killed"
    run = write_run(tmp_path, token_dataset, out, monitor={"lr_reduced_steps": 3})
    cmd, env = launch_command(run, launcher="python", env={"KILN_INJECT_FAULT": "spike@7"})
    killed = subprocess.run([cmd[0], "-c", _KILLED_AFTER_THE_ROLLBACK, *cmd[3:]], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert not (out / "summary.json").exists() and checkpoint.checkpoints(out / "checkpoints")[-1].step == 4
    done = launch(run, launcher="python")
    check(done)
    assert "resuming as rolled back to step_00000004" in done.stdout
    reference, _ = spike_run
    expected, got = read_metrics(reference), read_metrics(out)
    for step in range(5, 13):
        for key in ("train/loss", "train/grad_norm", "train/lr"):
            assert got[step][key] == expected[step][key], (step, key)
    summary, uninterrupted = summary_of(out), summary_of(reference)
    for key in ("rollbacks", "tokens_skipped", "tokens_seen", "final_loss", "val_loss"):
        assert summary[key] == uninterrupted[key], key
    assert summary["rollbacks"] == 1 and summary["resumed_from"].endswith("step_00000004")
    assert [(e["kind"], e["step"], e["rollback_to"]) for e in summary["stability_events"]] == [("loss_spike", 7, 4)]


def test_a_nan_at_zero1_in_bf16_is_rolled_back_by_the_monitor(tmp_path, token_dataset):
    """At ZeRO-1 and 2 in bf16 DeepSpeed's own overflow check is off (it read a flag from the GPU every step,
    setup.deepspeed_config): a NaN gradient is no longer skipped by DeepSpeed but reaches the weights and the reported
    grad norm, and the stability monitor rolls the step back to the last checkpoint (4), as at every other stage."""
    out = tmp_path / "nan_zero1"
    run = write_run(tmp_path, token_dataset, out, precision="bf16", parallelism={"zero_stage": 1})
    done = launch(run, launcher="python", env={"KILN_INJECT_FAULT": "nan@7", "OMP_NUM_THREADS": "1"})
    check(done)
    summary = summary_of(out)
    assert summary["parallelism"]["zero_stage"] == 1 and summary["precision"] == "bf16"
    (event,) = summary["stability_events"]
    assert (event["kind"], event["action"], event["step"], event["rollback_to"]) == ("nan", "rollback", 7, 4)
    assert summary["status"] == "completed" and summary["steps"] == 12 and math.isfinite(summary["final_loss"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "train/loss" in line]
    assert [r["step"] for r in rows][-6:] == [7, 8, 9, 10, 11, 12]  # redone from checkpoint 4 on finite weights
    assert all(math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"]) for r in rows[-6:])


def test_a_spike_before_the_first_checkpoint_lowers_the_lr_of_the_next_updates(tmp_path, token_dataset):
    """No checkpoint yet (checkpoints by time only): a loss spike at step 7 is judged once update 8 has run, and the
    LR of the next `lr_reduced_steps` (3) updates, 9 to 11, is halved. It used to start at update 10 (the window
    counted from the spike, and update 9's LR was set before the spike was judged): with 2 steps or fewer, none."""
    from training_jobs.schedule import lr_at
    from training_jobs.settings import TrainingSettings

    out = tmp_path / "spike_no_checkpoint"
    run = write_run(tmp_path, token_dataset, out, log_every_steps=1, monitor={"lr_reduced_steps": 3},
                    checkpoint={"every_steps": None})
    check(launch(run, launcher="python", env={"KILN_INJECT_FAULT": "spike@7"}))
    (event,) = summary_of(out)["stability_events"]
    assert (event["kind"], event["action"], event["step"]) == ("loss_spike", "warn", 7)
    schedule = TrainingSettings(**BASE).schedule
    used = {step: row["train/lr"] for step, row in read_metrics(out).items()}
    for update in (6, 8, 9, 10, 11, 12):  # update u takes lr_at(u - 1); the spike's own row is not logged
        factor = 0.5 if update in (9, 10, 11) else 1.0
        assert used[update] == pytest.approx(lr_at(update - 1, schedule, 12) * factor), update


# training_jobs.train, with the engine's construction made 2 s slower (as consolidating a base checkpoint is).
_SLOW_BUILD = """
import sys, time
from training_jobs import train
real = train.build_engine
def slow_build(*args, **kwargs):
    time.sleep(2.0)
    return real(*args, **kwargs)
train.build_engine = slow_build
sys.exit(train.main(sys.argv[1:]))
"""


def test_goodput_counts_the_trainers_construction_and_a_launch_that_trains_nothing_keeps_the_figures(
        tmp_path, token_dataset):
    """Building the trainer (the layout, the data, the engine, a base checkpoint to consolidate) is the run's wall
    time too: goodput left it out, overstated most for continued pretraining. Launched again once complete (the
    asset materialized again), the run trains nothing: its summary kept no throughput (tokens/s None, goodput 0 in
    the asset's metadata and MLflow, and kiln plan's own MFU lost the run); it keeps the figures of the launch that
    trained."""
    out = tmp_path / "slow_build"
    run = write_run(tmp_path, token_dataset, out, max_steps=4, checkpoint={"every_steps": None}, export=[])
    cmd, env = launch_command(run, launcher="python")
    check(subprocess.run([cmd[0], "-c", _SLOW_BUILD, *cmd[3:]], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300))
    first = summary_of(out)
    spent = first["time"]
    assert spent["startup_s"] >= 2.0 and spent["wall_s"] >= 2.0 + spent["train_s"]
    assert first["goodput_tokens_per_s"] == pytest.approx(4 * 128 / spent["wall_s"], rel=1e-3)
    assert first["throughput_of"] == "this launch" and first["steps_this_run"] == 4

    check(launch(run, launcher="python"))
    again = summary_of(out)
    assert again["status"] == "completed" and again["steps_this_run"] == 0 and again["resumed_from"]
    assert again["throughput_of"] == "an earlier launch"
    for key in ("tokens_per_s", "goodput_tokens_per_s", "steady_goodput_tokens_per_s", "time", "checkpoint_stall"):
        assert again[key] == first[key], key


def test_nan_before_the_first_checkpoint_stops_the_run_as_diverged(tmp_path, token_dataset):
    out = tmp_path / "nan"
    done = launch(write_run(tmp_path, token_dataset, out), launcher="python", env={"KILN_INJECT_FAULT": "nan@2"})
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    summary = summary_of(out)
    assert summary["status"] == "diverged" and "before the first checkpoint" in summary["error"]
    assert summary["stability_events"][0]["kind"] == "nan"
