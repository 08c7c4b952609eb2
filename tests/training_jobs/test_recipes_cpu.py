"""Training recipes after a first run, through the real entry point (DeepSpeed ZeRO-3 on CPU, gloo):
continued pretraining with replay and a re-warmup, a long-context phase (longer seq_len, larger RoPE base) with
prefix-LM, span corruption, and the refusals a base checkpoint can meet.

The base run is conftest's run_a (2 ranks, 12 steps of the tiny test model, ZeRO-3 under zero.Init). Expected
values come from a second implementation (export.load_model + evaluate.stream_loss in plain PyTorch on the same
held-back tokens) or by hand.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.training_jobs.conftest import PROBE, check, launch, read_metrics, summary_of, write_run
from training_jobs import checkpoint
from training_jobs.base import BaseCheckpointError, check_compatible, load_base
from training_jobs.model import ModelConfig

pytestmark = pytest.mark.slow


def test_a_continued_run_starts_from_the_base_weights_and_replays_its_data(run_a, tmp_path, token_dataset):
    """Two ranks continue the base's ZeRO checkpoint with a re-warmup and 25% replay. Before any update the run
    measures the base's loss on its held-back tokens: it must equal the base export's loss on the same tokens
    computed in plain PyTorch (the weights arrived intact, under ZeRO-3 partitioning)."""
    from training_jobs.evaluate import stream_loss, validation_stream
    from training_jobs.export import load_model

    ckpt = run_a / "checkpoints" / "step_00000012"
    out = tmp_path / "continued"
    run = write_run(tmp_path, token_dataset, out, max_steps=4, base_checkpoint=str(ckpt), rewarmup_steps=2,
                    schedule=dict(total_steps=4), checkpoint=dict(every_steps=4))
    config = json.loads(run.read_text())
    config["replay"] = {"share": 0.25, "dataset_dir": str(token_dataset.dir)}
    run.write_text(json.dumps(config))
    check(launch(run, nproc=2))
    summary = summary_of(out)

    # val_batches 4 x micro-batch 4 x 2 ranks = the first 32 windows of 32 tokens of the validation stream.
    tokens = validation_stream(token_dataset.dir, token_dataset.tokenizer_sha256)[:32 * 32 + 1]
    expected = stream_loss(load_model(run_a / "export" / "safetensors"), tokens, 32)["loss"]
    assert summary["base_val_loss"] == pytest.approx(expected, abs=2e-5)
    assert summary["base_checkpoint"]["kind"] == "deepspeed"
    assert summary["base_checkpoint"]["sha256"] == checkpoint.sha256_file(ckpt / checkpoint.MANIFEST)
    assert summary["base_checkpoint"]["trained_on"] == str(token_dataset.dir)

    metrics = read_metrics(out)
    lr = 3e-3  # BASE schedule's peak; the re-warmup of 2 steps: lr/2, then lr
    assert [metrics[s]["train/lr"] for s in (1, 2)] == pytest.approx([lr / 2, lr])
    assert metrics[1]["train/loss"] < summary_of(run_a)["final_loss"] + 1.0  # not a fresh model's ~6.2

    state = torch.load(out / "checkpoints" / "step_00000004" / "zero_pp_rank_0_mp_rank_00_model_states.pt",
                       weights_only=True)["kiln"]["loader"]
    # 4 steps x 4 sequences per rank = 16; every 4th is a replay sequence (floor((k + 1) / 4) > floor(k / 4)).
    assert (state["count"], state["main"]["position"], state["replay"]["position"]) == (16, 12, 4)
    manifest = checkpoint.read_manifest(out / "checkpoints" / "step_00000004")
    assert manifest["base_checkpoint"]["sha256"] == summary["base_checkpoint"]["sha256"]  # lineage travels on


def test_a_long_context_phase_with_prefix_lm_exports_what_it_trained(run_a, tmp_path, token_dataset):
    """From the base's safetensors export: twice the sequence length, a 10x RoPE base, prefix-LM. The HF export
    of the result gives Kiln's logits at the new length; perplexity by position is reported."""
    transformers = pytest.importorskip("transformers")
    from training_jobs.export import load_model

    out = tmp_path / "long"
    check(launch(write_run(tmp_path, token_dataset, out, seq_len=64, max_steps=2, val_batches=2,
                           base_checkpoint=str(run_a / "export" / "safetensors"), objective="prefix_lm",
                           model={"rope_theta": 100_000.0}, schedule=dict(total_steps=2)), nproc=1))
    summary = summary_of(out)
    assert summary["model"]["rope_theta"] == 100_000.0 and summary["model"]["max_seq_len"] == 64
    assert summary["base_checkpoint"]["kind"] == "safetensors" and summary["objective"] == "prefix_lm"
    assert set(summary["val_ppl_pos"]) == {"0-1k"} and summary["val_ppl_pos"]["0-1k"] > 1
    assert 0 <= summary["long_document_token_share"] <= 1
    assert "train/prefix_lm_loss" in read_metrics(out)[1]

    hf_dir = out / "export" / "hf"
    assert json.loads((hf_dir / "config.json").read_text())["rope_theta"] == 100_000.0
    tokens = torch.randint(0, 500, (2, 64), generator=torch.Generator().manual_seed(0))
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, load_model(out / "export" / "safetensors")(tokens),
                                   atol=1e-4, rtol=0)


def test_every_form_of_a_base_gives_the_same_weights(run_a):
    deepspeed_form = load_base(run_a / "checkpoints" / "step_00000012")
    for form in ("export/safetensors", "export/hf", "export"):
        other = load_base(run_a / form)
        assert other.cfg == deepspeed_form.cfg, form
        assert other.tokenizer_sha256 == deepspeed_form.tokenizer_sha256, form
        for name, tensor in deepspeed_form.state.items():
            torch.testing.assert_close(other.state[name], tensor, atol=0, rtol=0, msg=f"{form}: {name}")


def test_a_base_from_another_tokenizer_or_shape_is_refused(run_a, tmp_path, token_dataset):
    base = load_base(run_a / "export")
    with pytest.raises(BaseCheckpointError, match="trained with tokenizer .* the same ids would mean other text"):
        check_compatible(base, base.cfg, "ab" * 32)
    wider = ModelConfig(**{**base.cfg.to_dict(), "d_model": 128, "ffn_hidden": 384})
    with pytest.raises(BaseCheckpointError, match=r"d_model 64 in the base vs 128 here.*Set training.model"):
        check_compatible(base, wider, base.tokenizer_sha256)
    longer = ModelConfig(**{**base.cfg.to_dict(), "max_seq_len": 4096, "rope_theta": 1e6, "rope_scaling_factor": 4.0})
    check_compatible(base, longer, base.tokenizer_sha256)  # context settings may change

    # Through the entry point: the run stops before training and says why in summary.json.
    import shutil
    foreign = tmp_path / "foreign"
    shutil.copytree(run_a / "export", foreign)
    meta = json.loads((foreign / "safetensors" / "model_config.json").read_text())
    (foreign / "safetensors" / "model_config.json").write_text(json.dumps({**meta, "tokenizer_sha256": "cd" * 32}))
    out = tmp_path / "refused"
    done = launch(write_run(tmp_path, token_dataset, out, max_steps=2, base_checkpoint=str(foreign)), nproc=1,
                  launcher="python")
    assert done.returncode != 0
    assert "the same ids would mean other text" in summary_of(out)["error"]


def test_span_corruption_trains_with_the_tokenizers_sentinels(tmp_path):
    from kiln.tokens.shard_writer import write_token_shards
    from kiln.tokens.tokenizer import draw_training_sample, train_tokenizer
    from tests.token_corpus import NATURAL, SMALL_TOKENIZER, shard_settings, standard_sources
    from tests.training_jobs.conftest import TokenDataset

    sources = standard_sources(tmp_path)
    tok_settings = SMALL_TOKENIZER.model_copy(update={"sentinel_tokens": 20})
    train_tokenizer(draw_training_sample(sources, {}, tok_settings), tok_settings, tmp_path / "tok")
    shards = tmp_path / "shards"
    result = write_token_shards(sources, tmp_path / "tok", shard_settings(seq_len=32, val_fraction=0.15), NATURAL,
                                shards, progress=False)
    (shards / "_manifest.json").write_text(json.dumps({"stats": result.manifest_stats()}), encoding="utf-8")
    dataset = TokenDataset(shards, tmp_path / "tok", result.tokenizer_sha256, result.vocab_size)
    out = tmp_path / "t5"
    check(launch(write_run(tmp_path, dataset, out, max_steps=3, objective="span_corruption",
                           schedule=dict(total_steps=3)), nproc=1))
    summary = summary_of(out)
    losses = [read_metrics(out)[s]["train/span_corruption_loss"] for s in (1, 2, 3)]
    assert summary["status"] == "completed" and all(0 < v < 10 for v in losses)
    assert summary["val_loss"] > 0  # validation stays causal LM loss


def test_zero_init_builds_the_same_model_partitioned(run_a, tmp_path, token_dataset):
    """Two ranks, ZeRO-3. run_a's trainer built its model inside deepspeed.zero.Init: what it handed to
    deepspeed.initialize (recorded by construction_probe) was already partitioned, param.data empty on both ranks,
    the whole size only in ds_numel / ds_shape, each rank's ds_tensor half of it (DeepSpeed pads to an even split),
    and the two halves joined are the weights of the same seed's model built whole in plain PyTorch here. With
    zero_init false the trainer hands the model over whole, and the same seed and schedule give bit-identical losses
    (the same fp32 numbers in the same order): zero.Init changes where the weights live, not what they are."""
    import math

    from training_jobs.model import Transformer
    from training_jobs.settings import RunConfig

    out = tmp_path / "whole"
    check(launch(write_run(tmp_path, token_dataset, out, max_steps=3, zero_init=False,
                           checkpoint=dict(every_steps=None), export=[]), nproc=2, module=PROBE))
    seed = RunConfig.read(run_a.parent / f"{run_a.name}.json").training.seed  # conftest.write_run's file
    full = dict(Transformer(ModelConfig(**summary_of(run_a)["model"]), seed=seed).named_parameters())
    partitioned, whole = ([torch.load(run / "construction" / f"rank{r}.pt", weights_only=False)["before"]
                           for r in (0, 1)] for run in (run_a, out))
    assert set(partitioned[0]) == set(partitioned[1]) == set(whole[0]) == set(full)  # the tied matrix once
    for name, param in full.items():
        n, halves = param.numel(), [rank[name] for rank in partitioned]
        assert [(h["numel"], h["ds_numel"], h["ds_shape"]) for h in halves] == [(0, n, tuple(param.shape))] * 2, name
        assert [h["partition"].numel() for h in halves] == [math.ceil(n / 2)] * 2, name
        assert torch.equal(torch.cat([h["partition"] for h in halves])[:n], param.detach().flatten()), name
        assert [(rank[name]["numel"], rank[name]["ds_numel"]) for rank in whole] == [(n, None)] * 2, name
    assert [read_metrics(out)[s]["train/loss"] for s in (1, 2, 3)] == \
        [read_metrics(run_a)[s]["train/loss"] for s in (1, 2, 3)]
