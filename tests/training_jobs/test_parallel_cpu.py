"""The layout of training.parallelism on CPU (gloo, 2 ranks): two pipeline stages (DeepSpeed's pipeline engine over
Kiln's blocks), tensor parallelism (DeepSpeed AutoTP), the refusals, and the DeepSpeed config the layout fills.

Reference: run_a (conftest; 2 data-parallel ranks of 4 sequences, ZeRO-3, the same seed and LR schedule). A layout
with tp*pp = 2 on 2 ranks has one data-parallel replica; with micro_batch_size 8 each of its steps reads the same 8
sequences as run_a's step (the loader deals sequence j*world+r to rank r: run_a's ranks get 0,2,4,6 and 1,3,5,7,
one replica gets 0..7), and the mean of two 4-sequence means is the 8-sequence mean. So the per-step losses must
agree up to fp32 rounding: another summation order (ZeRO-3's reduce-scatter vs one rank's sum, the tied embedding's
gradient summed across stages, tp partial products all-reduced) moves them by ~1e-7 relative over 8 steps (seen:
<= 1.5e-7). Tolerance 1e-5 relative: far above that, far below what a wrong weight, batch, learning rate or
optimizer state does to a loss (>= 1e-3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.training_jobs.conftest import PROBE, check, launch, read_metrics, summary_of, write_run
from training_jobs.model import ModelConfig, Transformer
from training_jobs.settings import RunConfig, TrainingSettings

RTOL = 1e-5
ONE_REPLICA = dict(micro_batch_size=8)  # run_a's 2 x 4 sequences per step, on the one data-parallel replica


def losses(output: Path, steps) -> list[float]:
    metrics = read_metrics(output)
    return [metrics[s]["train/loss"] for s in steps]


@pytest.fixture(scope="module")
def pp_run(tmp_path_factory, token_dataset) -> Path:
    """Two pipeline stages: stopped at step 4 (max_steps 4 of run_a's 12-step schedule, checkpoint 4), then started
    again in the same folder with max_steps 8: it resumes from its checkpoint."""
    root = tmp_path_factory.mktemp("pp")
    out = root / "pp"
    check(launch(write_run(root, token_dataset, out, max_steps=4, export=[], parallelism={"pp": 2}, **ONE_REPLICA),
                 nproc=2))
    assert summary_of(out)["steps"] == 4
    check(launch(write_run(root, token_dataset, out, max_steps=8, parallelism={"pp": 2}, **ONE_REPLICA), nproc=2))
    return out


@pytest.mark.slow
def test_two_pipeline_stages_train_like_data_parallel(run_a, pp_run):
    summary = summary_of(pp_run)
    assert summary["status"] == "completed" and summary["parallelism"] == {"tp": 1, "pp": 2, "dp": 1,
                                                                          "zero_stage": 1}
    assert summary["tokens_per_step"] == summary_of(run_a)["tokens_per_step"] == 8 * 32
    got, expected = losses(pp_run, range(1, 9)), losses(run_a, range(1, 9))
    assert got == pytest.approx(expected, rel=RTOL)
    ckpt = pp_run / "checkpoints" / "step_00000008"
    files = set(json.loads((ckpt / "manifest.json").read_text())["files"])
    assert {"layer_00-model_states.pt", "mp_rank_01_model_states.pt",
            "zero_pp_rank_0_mp_rank_01_optim_states.pt"} <= files  # DeepSpeed's pipeline layout, in the manifest


@pytest.mark.slow
def test_a_pipeline_run_resumes_from_its_checkpoint(run_a, pp_run):
    """Steps 5..8 ran in the second process, from checkpoint 4: they continue run_a's (uninterrupted) losses."""
    summary = summary_of(pp_run)
    assert summary["resumed_from"].endswith("step_00000004") and summary["steps_this_run"] == 4
    assert losses(pp_run, range(5, 9)) == pytest.approx(losses(run_a, range(5, 9)), rel=RTOL)
    metrics, reference = read_metrics(pp_run), read_metrics(run_a)
    assert [metrics[s]["train/lr"] for s in range(1, 9)] == [reference[s]["train/lr"] for s in range(1, 9)]


@pytest.mark.slow
def test_the_pipeline_export_reloads_as_a_transformer(run_a, pp_run):
    """The stages' layer files come back under the Transformer's names: the same tensors as a data-parallel export,
    and the reloaded model (training_jobs.export.load_model, no pipeline) reproduces the trained model's loss."""
    from safetensors.torch import load_file

    from training_jobs.export import load_model, probe_check

    summary = summary_of(pp_run)
    for form in ("safetensors", "hf"):
        mine, theirs = (load_file(str(Path(s["exports"][form]) / "model.safetensors")) for s in (summary,
                                                                                                  summary_of(run_a)))
        assert {k: v.shape for k, v in mine.items()} == {k: v.shape for k, v in theirs.items()}, form
    result = probe_check(load_model(Path(summary["exports"]["safetensors"])), summary["loss_probe"], "fp32")
    assert result["passed"], result


@pytest.mark.slow
@pytest.mark.parametrize("split", [{"pp": 2}, {"tp": 2}], ids=["pp", "tp"])
def test_a_split_model_at_zero0_clips_by_and_reports_the_whole_models_gradient_norm(run_a, tmp_path, token_dataset,
                                                                                      split):
    """parallelism.zero_stage 0 with two pipeline stages or tp 2: DeepSpeed's own clipping summed the first stage's
    gradients only (its model-parallel rank 0) / each tp rank its own slices', so it clipped by less than the model's
    norm (steps 3-4 off run_a's by ~3e-5), and it reported no norm at all (train/grad_norm null, the stability
    monitor blind to explosions). The norm is now the whole model's, over both ranks, a tied or unsplit weight
    counted once: run_a's (ZeRO-3's norm on 2 data-parallel ranks, an independent implementation), and with it the
    clipped steps' losses (grad_clip 1.0: steps 2-4 clip)."""
    out = tmp_path / "split0"
    check(launch(write_run(tmp_path, token_dataset, out, max_steps=4, export=[], parallelism={**split, "zero_stage": 0},
                           checkpoint={"every_steps": 100}, **ONE_REPLICA), nproc=2))
    assert summary_of(out)["parallelism"]["zero_stage"] == 0
    got, expected = read_metrics(out), read_metrics(run_a)
    for key in ("train/loss", "train/grad_norm"):
        assert [got[s][key] for s in range(1, 5)] == pytest.approx([expected[s][key] for s in range(1, 5)],
                                                                   rel=RTOL), key


# Megatron's split, written out: these weights are cut by output rows, these by input columns (dim 0 / dim 1).
SPLIT_DIM = {"self_attn.q_proj": 0, "self_attn.k_proj": 0, "self_attn.v_proj": 0, "mlp.gate_proj": 0, "mlp.up_proj": 0,
             "self_attn.o_proj": 1, "mlp.down_proj": 1}


@pytest.mark.slow
def test_tensor_parallel_trains_like_data_parallel(run_a, tmp_path, token_dataset):
    """DeepSpeed AutoTP (tp 2) on Kiln's Transformer, on CPU: heads and MLP units split over the two ranks, ZeRO-3
    on top; the export joins the slices (checkpoint.CONSOLIDATED) and reloads.

    Both ranks of a tp group read the same batches, so equal losses alone would also hold with no split at all: the
    run goes through construction_probe, which records each rank's AutoTP layers as deepspeed.initialize left them.
    Each rank must hold its own half of every split weight, through the tp group, and the two halves must be the
    weight of the same seed's model built whole in plain PyTorch here (the second implementation)."""
    from training_jobs.export import load_model, probe_check

    out = tmp_path / "tp"
    config = write_run(tmp_path, token_dataset, out, max_steps=3, checkpoint=dict(every_steps=None),
                       export=["safetensors"], parallelism={"tp": 2}, **ONE_REPLICA)
    check(launch(config, nproc=2, module=PROBE))
    summary = summary_of(out)
    assert summary["parallelism"] == {"tp": 2, "pp": 1, "dp": 1, "zero_stage": 3}

    cfg = ModelConfig(**summary["model"])
    full = dict(Transformer(cfg, seed=RunConfig.read(config).training.seed).named_parameters())
    ranks = [torch.load(out / "construction" / f"rank{r}.pt", weights_only=False)["tp"] for r in (0, 1)]
    split = {f"layers.{i}.{name}": dim for i in range(cfg.n_layers) for name, dim in SPLIT_DIM.items()}
    for rank, layers in enumerate(ranks):
        assert set(layers) == set(split), rank  # every split weight, and nothing else (embedding, norms whole)
        for name, layer in layers.items():
            assert (layer["tp_world_size"], layer["tp_index"], layer["group_ranks"], layer["is_tp_group"]) == \
                (2, rank, [0, 1], True), name
    for name, dim in split.items():
        whole, halves = full[f"{name}.weight"], [layers[name]["weight"] for layers in ranks]
        expected = list(whole.shape)
        expected[dim] //= 2
        assert [list(h.shape) for h in halves] == [expected, expected], name  # q (32, 64), down (64, 96), ...
        assert not torch.equal(halves[0], halves[1]), name
        assert torch.equal(torch.cat(halves, dim=dim), whole.detach()), name

    assert losses(out, (1, 2, 3)) == pytest.approx(losses(run_a, (1, 2, 3)), rel=RTOL)
    model = load_model(Path(summary["exports"]["safetensors"]))
    assert model.layers[0].self_attn.q_proj.weight.shape == (64, 64)  # whole again
    result = probe_check(model, summary["loss_probe"], "fp32")
    assert result["passed"], result


@pytest.mark.slow
def test_a_layout_that_does_not_divide_the_world_is_refused(tmp_path, token_dataset):
    out = tmp_path / "refused"
    done = launch(write_run(tmp_path, token_dataset, out, parallelism={"pp": 2}), launcher="python")
    assert done.returncode != 0
    summary = summary_of(out)
    assert summary["status"] == "failed"
    assert "training.parallelism (tp 1 x pp 2 = 2 ranks per data-parallel replica) does not fit the 1 training " \
           "processes" in summary["error"]


# ------------------------------------------------------------------------------------------- no launch

CFG = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_hidden=192, max_seq_len=32)


def test_what_the_trainer_cannot_run_is_refused_before_an_engine_is_built():
    from training_jobs.setup import check_layout

    with pytest.raises(ValueError, match="training.objective 'prefix_lm' with training.parallelism.pp 2"):
        check_layout(TrainingSettings(objective="prefix_lm", parallelism={"pp": 2}), CFG)
    with pytest.raises(ValueError, match="pp 3 is more than the model's 2 blocks"):
        check_layout(TrainingSettings(parallelism={"pp": 3}), CFG)
    with pytest.raises(ValueError, match=r"tp 3 does not divide the model's \{'n_heads': 4, 'n_kv_heads': 4"):
        check_layout(TrainingSettings(parallelism={"tp": 3}), CFG)
    with pytest.raises(ValueError, match="tp 2 with pp 2: the trainer runs tensor or pipeline parallelism, not both"):
        TrainingSettings(parallelism={"tp": 2, "pp": 2})  # refused when the settings load, naming the key
    check_layout(TrainingSettings(parallelism={"tp": 2}), CFG)


def test_the_data_split_follows_deepspeeds_rank_layout():
    """Pipeline: ranks are stage-major (rank = stage * dp + data rank); AutoTP: tp consecutive ranks per replica."""
    from training_jobs.setup import Dist, data_shard

    def shards(layout, world):
        t = TrainingSettings(parallelism=layout)
        return [(s.rank, s.world_size) for s in (data_shard(Dist(r, world, torch.device("cpu")), t)
                                                 for r in range(world))]

    assert shards({"pp": 2}, 4) == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert shards({"tp": 2}, 4) == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert shards({}, 2) == [(0, 2), (1, 2)]


def test_the_layout_fills_the_deepspeed_config(tmp_path):
    from training_jobs.setup import deepspeed_config

    shipped = deepspeed_config(TrainingSettings(), "fp32", CFG)["zero_optimization"]
    assert shipped["stage"] == 3 and "stage3_prefetch_bucket_size" in shipped
    piped = deepspeed_config(TrainingSettings(parallelism={"pp": 2}), "fp32", CFG)["zero_optimization"]
    assert piped["stage"] == 1 and not any(k.startswith("stage3_") for k in piped)
    assert deepspeed_config(TrainingSettings(parallelism={"zero_stage": 2}), "fp32", CFG)["zero_optimization"][
        "stage"] == 2
    sharded = deepspeed_config(TrainingSettings(parallelism={"tp": 2}), "fp32", CFG)["tensor_parallel"]
    assert sharded["autotp_size"] == 2 and sharded["partition_config"]["layer_specs"][1]["partition_type"] == "row"

    own = tmp_path / "ds.json"  # a stage the user wrote down is not overridden
    own.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    with pytest.raises(ValueError, match=r"sets zero_optimization.stage = 3 but the training settings give 1"):
        deepspeed_config(TrainingSettings(deepspeed_config=str(own), parallelism={"pp": 2}), "fp32", CFG)
    own.write_text(json.dumps({"zero_optimization": {"stage": "auto"}}))
    assert deepspeed_config(TrainingSettings(deepspeed_config=str(own), parallelism={"pp": 2}), "fp32",
                            CFG)["zero_optimization"]["stage"] == 1
