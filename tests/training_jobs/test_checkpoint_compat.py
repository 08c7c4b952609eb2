"""Checkpoints written by earlier Kiln code: they resume and train on as that code did, or are refused clearly."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.training_jobs import old_run
from tests.training_jobs.conftest import check, launch, read_metrics, summary_of


def test_a_checkpoint_written_before_issue_34_resumes_and_trains_on_as_that_code_did(tmp_path):
    """The fixture's step-4 checkpoint (ZeRO-3, fp32, one rank) is resumed by today's trainer, with the run's default
    layout; steps 5-8 reproduce the losses the old code logged when it ran on. Not bit for bit: the loss is now
    computed in chunks and AdamW is fused, which reorders fp32 sums (differences of a few ulps; 1e-5 relative is
    ~100x that and far below a step's change of loss, ~2e-3 here)."""
    run = old_run.run_config(tmp_path)
    ckpt = tmp_path / "out" / "checkpoints" / "step_00000004"
    shutil.copytree(old_run.FIXTURE, ckpt, ignore=shutil.ignore_patterns("expected.json"))
    check(launch(run, nproc=1, launcher="python"))
    summary = summary_of(tmp_path / "out")
    assert summary["resumed_from"] == str(ckpt) and summary["steps"] == 8
    expected = json.loads((old_run.FIXTURE / "expected.json").read_text())["losses_after_resume"]
    logged = read_metrics(tmp_path / "out")
    assert {step: logged[int(step)]["train/loss"] for step in expected} == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("files, found", [
    ({"config.json": "not json"}, "JSONDecodeError"),
    ({"config.json": '{"model_type": "llama"}'}, "KeyError: 'vocab_size'"),
    ({"model_config.json": "{}"}, "KeyError: 'model'"),
])
def test_a_base_checkpoint_that_is_not_kilns_is_refused_saying_so(tmp_path, files, found):
    """training.base_checkpoint pointing at a folder whose description is someone else's: BaseCheckpointError (the
    launching asset turns it into a failure naming the key), not a raw JSONDecodeError or KeyError."""
    from training_jobs.base import BaseCheckpointError, load_base

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(BaseCheckpointError, match=rf"training.base_checkpoint {tmp_path}: its description does not "
                                                  rf"read as a Kiln or HF Llama checkpoint \({found}"):
        load_base(tmp_path, weights=False)


def test_a_base_checkpoint_that_is_not_there_or_is_a_checkpoints_folder_is_refused_saying_so(tmp_path):
    """training.base_checkpoint at a folder that does not exist, or at a run's checkpoints folder rather than a step
    in it: said so, with the complete checkpoints there (not "is not a checkpoint" or "stopped while saving")."""
    from training_jobs import checkpoint
    from training_jobs.base import BaseCheckpointError, load_base

    step = tmp_path / "checkpoints" / "step_00000004"
    step.mkdir(parents=True)
    (step / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"model")
    checkpoint.write_manifest(step, 4, {"model": {}})
    with pytest.raises(BaseCheckpointError, match=r"checkpoints does not verify: it holds checkpoints: point at "
                                                  r"a step_N folder inside it \(the complete ones there: step_00000004"):
        load_base(tmp_path / "checkpoints", weights=False)
    with pytest.raises(BaseCheckpointError, match=r"/export does not verify: it does not exist; pick"):
        load_base(tmp_path / "export", weights=False)
