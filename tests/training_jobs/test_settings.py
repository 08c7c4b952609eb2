"""Training settings, the run config file, and the DeepSpeed config Kiln derives from the shipped JSON."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from training_jobs.model import ModelConfig
from training_jobs.settings import (
    DEFAULT_DEEPSPEED_CONFIG,
    ModelSettings,
    RunConfig,
    TrainingSettings,
    load_deepspeed_config,
)
from training_jobs.setup import deepspeed_config, resolve_compile, resolve_precision

SHA = "ab" * 32


def test_defaults_validate_and_resolve():
    t = TrainingSettings()
    assert t.resolved_max_steps(world_size=2, seq_len=512) == 1000
    assert t.weight_decay == 0.1 and t.betas == (0.9, 0.95) and t.grad_clip == 1.0 and t.precision == "auto"
    assert t.deepspeed_config_path() == DEFAULT_DEEPSPEED_CONFIG


def test_unknown_keys_are_refused_at_every_level():
    with pytest.raises(ValidationError, match="extra"):
        TrainingSettings.model_validate({"modle": {}})
    with pytest.raises(ValidationError, match="monitor.spike"):
        TrainingSettings.model_validate({"monitor": {"spike": 2}})


def test_token_budget_sets_the_step_count():
    t = TrainingSettings(token_budget=1_000_000, micro_batch_size=4, grad_accum=2)
    assert t.tokens_per_step(world_size=2, seq_len=128) == 2048
    assert t.resolved_max_steps(world_size=2, seq_len=128) == 489  # ceil(1e6 / 2048)
    with pytest.raises(ValidationError, match="max_steps or training.token_budget, not both"):
        TrainingSettings(max_steps=10, token_budget=100)


def test_presets_and_overrides():
    arch = ModelSettings(preset="small", n_layers=4, vocab_size=1000).architecture(vocab_size=500, max_seq_len=256)
    assert arch["d_model"] == 512 and arch["n_layers"] == 4 and arch["ffn_hidden"] == 1408
    assert arch["vocab_size"] == 1024  # padded to a multiple of 64
    ModelConfig(**arch)  # every field the model needs, nothing else
    one_b = ModelSettings(preset="1b").architecture(vocab_size=32_000, max_seq_len=2048)
    assert (one_b["n_heads"], one_b["n_kv_heads"], one_b["ffn_hidden"]) == (32, 8, 8192)


@pytest.mark.parametrize("override, message", [({"d_model": 66}, "not divisible by n_heads"),
                                               ({"d_model": 36}, "is odd; RoPE needs it even"),
                                               ({"n_kv_heads": 3}, "not a multiple of n_kv_heads"),
                                               ({"vocab_size": 10}, "smaller than the tokenizer's")])
def test_bad_shapes_name_the_problem(override, message):
    with pytest.raises(ValueError, match=message):
        ModelSettings(**override).architecture(vocab_size=500, max_seq_len=64)


def test_schedule_refuses_min_lr_above_lr():
    with pytest.raises(ValidationError, match="min_lr .* is above lr"):
        TrainingSettings.model_validate({"schedule": {"lr": 1e-4, "min_lr": 1e-3}})


def test_a_schedule_shorter_than_the_run_is_refused_naming_both_keys():
    """total_steps 50 with max_steps 300: the curve would end at step 50 and the learning rate sit at min_lr for the
    other 250 steps. total_steps only extends a curve; equal or longer is fine."""
    with pytest.raises(ValidationError, match=r"training\.schedule\.total_steps 50 is below the run's 300 steps "
                                              r"\(training\.max_steps.*sit at min_lr for the last 250"):
        TrainingSettings.model_validate({"max_steps": 300, "schedule": {"total_steps": 50}})
    for total in (300, 500):
        assert TrainingSettings.model_validate({"max_steps": 300, "schedule": {"total_steps": total}})
    from training_jobs.settings import schedule_too_short  # the trainer's check once a token budget sets max_steps

    assert schedule_too_short(50, 300) and schedule_too_short(None, 300) is None and schedule_too_short(50, None) is None


def test_run_config_round_trips_through_json(tmp_path):
    t = TrainingSettings(max_steps=5, model={"preset": "tiny", "d_model": 128}, schedule={"kind": "wsd"})
    run = t.to_run_config(dataset_dir=tmp_path / "shards", tokenizer_sha256=SHA, output_dir=tmp_path / "out",
                          run_name="r1", tags={"team": "x"})
    path = run.write(tmp_path / "run.json")
    assert json.loads(path.read_text())["format"] == "kiln-run-config/1"
    again = RunConfig.read(path)
    assert again == run and again.training.model.d_model == 128
    assert again.checkpoint_dir() == tmp_path / "out" / "checkpoints"


def test_run_config_errors_are_specific(tmp_path):
    with pytest.raises(FileNotFoundError, match="run config .* not found"):
        RunConfig.read(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text(json.dumps({"dataset_dir": "d", "output_dir": "o", "tokenizer_sha256": "xyz"}))
    with pytest.raises(ValueError, match="tokenizer_sha256"):
        RunConfig.read(tmp_path / "bad.json")


def test_shipped_deepspeed_config_is_zero3_with_autos():
    ds = load_deepspeed_config(DEFAULT_DEEPSPEED_CONFIG)
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert ds["train_micro_batch_size_per_gpu"] == ds["gradient_accumulation_steps"] == "auto"
    assert ds["bf16"] == {"enabled": "auto"} and "optimizer" not in ds and "scheduler" not in ds


def test_deepspeed_autos_are_filled_from_the_settings():
    t = TrainingSettings(micro_batch_size=3, grad_accum=4, grad_clip=0.5)
    cfg = ModelConfig(**t.model.architecture(500, 64))
    ds = deepspeed_config(t, "bf16", cfg)
    filled = (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["gradient_clipping"])
    assert filled == (3, 4, 0.5)
    assert ds["bf16"]["enabled"] is True
    zero = ds["zero_optimization"]
    # DeepSpeed's defaults (5e8, 5e7, 1e5), the buckets capped at the model's parameters: the tiny preset over a
    # 512-token vocabulary (500 padded to a multiple of 64) has 2 x (4·64² + 3·64·192 + 2·64) + 64 + 512·64
    # = 139,584
    zero_keys = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
    assert tuple(zero[k] for k in zero_keys) == (139_584, 139_584, 100_000)
    assert deepspeed_config(t, "fp32", cfg)["bf16"]["enabled"] is False
    assert resolve_precision("fp32") == "fp32" and resolve_precision("bf16") == "bf16"


def test_deepspeed_config_conflicts_are_errors(tmp_path):
    cfg = ModelConfig(**ModelSettings().architecture(500, 64))
    conflicting = tmp_path / "ds.json"
    conflicting.write_text(json.dumps({"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 3}}))
    t = TrainingSettings(micro_batch_size=8, deepspeed_config=str(conflicting))
    with pytest.raises(ValueError, match=r"sets train_micro_batch_size_per_gpu = 16 .* give 8"):
        deepspeed_config(t, "fp32", cfg)
    conflicting.write_text(json.dumps({"optimizer": {"type": "AdamW"}}))
    with pytest.raises(ValueError, match="remove 'optimizer'"):
        deepspeed_config(t, "fp32", cfg)
    with pytest.raises(FileNotFoundError, match="fix training.deepspeed_config"):
        deepspeed_config(TrainingSettings(deepspeed_config=str(tmp_path / "nope.json")), "fp32", cfg)


def test_compile_auto_is_on_for_cuda_only_and_bad_values_name_the_key(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert TrainingSettings().compile == "auto" and resolve_compile(TrainingSettings())[0] is False
    assert resolve_compile(TrainingSettings(compile=True)) == (True, "set by training.compile")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_compile(TrainingSettings())[0] is True
    assert resolve_compile(TrainingSettings(compile=False))[0] is False
    assert resolve_compile(TrainingSettings(parallelism={"pp": 2}))[0] is False  # auto stays off with stages
    with pytest.raises(ValidationError, match=r"training\.compile: true with training\.parallelism\.pp > 1.*set "
                                              r"training\.compile: auto or false, or pp: 1"):
        TrainingSettings(compile=True, parallelism={"pp": 2})  # refused when the settings load
    with pytest.raises(ValidationError, match=r"(?s)compile\.literal\['auto'\]\n  Input should be 'auto'.*"
                                              r"compile\.bool"):
        TrainingSettings(compile="fast")


def test_settings_module_imports_no_torch():
    import subprocess
    import sys
    code = "import sys, training_jobs.settings; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_training_jobs_import_only_the_shard_format_and_dagster_pipes():
    """training_jobs runs where Kiln's processing stack and Dagster may be absent (ARCHITECTURE.md, layout). The
    planner's memory model and its GPU table (pure Python) are the other pieces it reads: the run's layout comes from
    the one, its MFU's peak from the other. The settings' base model (pydantic only) and
    the atomic writes and file hashes (standard library only), the loader's hash, splitmix64 (numpy only), and the
    peak resident memory on CPU (standard library only) are the last."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "training_jobs"
    bad = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                top = name.split(".")[0]
                allowed = ("kiln.tokens.shard_format", "kiln.planning.memory", "kiln.planning.hardware",
                           "kiln.common.strict", "kiln.common.manifest", "kiln.common.splitmix",
                           "kiln.common.memory")
                if (top == "kiln" and name not in allowed) or top in ("dagster", "assets", "resources",
                                                                      "orchestration"):
                    bad.append(f"{path.name}: {name}")
    assert not bad, bad


def test_a_profile_window_is_first_then_last():
    assert TrainingSettings(profile_steps=[20, 24]).profile_steps == (20, 24)
    with pytest.raises(ValidationError, match=r"profile_steps \[24, 20\]: the first step comes after the last"):
        TrainingSettings(profile_steps=[24, 20])
    with pytest.raises(ValidationError, match="profile_steps"):
        TrainingSettings(profile_steps=[0, 4])  # steps count from 1


def test_a_profile_window_past_the_run_is_refused():
    """A window that ends after the run's last step never closed: nothing was written, the profiler recorded the rest
    of the run (checkpoints, validation, export) and every step from its first was left out of the step throughput."""
    from training_jobs.settings import profile_window_problem  # the trainer's check once a token budget sets max_steps

    with pytest.raises(ValidationError, match=r"profile_steps \[3, 50\] ends after the run's 10 steps"):
        TrainingSettings(max_steps=10, profile_steps=[3, 50])
    assert TrainingSettings(max_steps=10, profile_steps=[3, 10]).profile_steps == (3, 10)
    assert TrainingSettings(token_budget=1000, profile_steps=[3, 50]).profile_steps == (3, 50)  # known at launch
    assert "training.profile_steps [3, 50]" in profile_window_problem((3, 50), 10)
    assert profile_window_problem((3, 10), 10) is None and profile_window_problem(None, 10) is None


@pytest.mark.parametrize("settings, message", [
    ({"model": {"d_model": 100, "n_heads": 3}}, "d_model 100 is not divisible by n_heads 3"),
    ({"betas": [1.5, 0.95]}, "betas.0"),
    ({"betas": [0.9, -0.1]}, "betas.1"),
    ({"seed": -1}, "seed"),
    ({"monitor": {"window": 5, "min_history": 50}}, "min_history 50 is more than its window 5"),
    ({"checkpoint": {"every_steps": None, "every_minutes": None}}, "every_steps and every_minutes are both null"),
    ({"phases": []}, "phases"),
])
def test_settings_that_would_fail_after_launch_are_refused_when_they_load(settings, message):
    """Each of these loaded before and failed minutes into a run (torch's AdamW on a beta, numpy on a negative seed at
    the second epoch) or quietly did nothing (spike detection never judging, no save before the end)."""
    with pytest.raises(ValidationError, match=message):
        TrainingSettings.model_validate(settings)


def test_the_project_config_needs_the_safetensors_export_the_checkpoint_asset_reads():
    from kiln.common.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"training.export \['hf'\]: the checkpoint asset publishes"):
        parse_config({"sources": [{"name": "w", "kind": "jsonl", "path": "/x", "license": "CC0", "domain": "web",
                                   "profile": "p"}], "profiles": {"p": []}, "training": {"export": ["hf"]}})
