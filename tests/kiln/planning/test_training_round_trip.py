"""`kiln plan` -> project config round trip: the layout the planner prints under "training" is what the
project config's `training:` section takes as is, and what the run then refuses when it does not fit.

Every expected layout value is read from the planner's own output (or set by hand below); the config side
is loaded with kiln.common.config's loader, as the training asset loads it.
"""

import json
from pathlib import Path

import pytest
import yaml

from kiln.cli import main
from kiln.common.config import ConfigError, load_config
from training_jobs.settings import Parallelism

DEFAULT = Path(__file__).resolve().parents[3] / "configs" / "default.yaml"
LAYOUT_KEYS = ["tp", "pp", "dp", "zero_stage", "micro_batch", "grad_accum"]

# Budgets / clusters the planner is run on. default-config: the repo's `planning:` ($100k, 2 nodes x 8 H100);
# pipeline: 22B parameters in 3 heads (no tensor-parallel degree divides them) on 8 A100-80GB without ZeRO-3, which
# needs pipeline stages; one-node: 1e22 FLOPs on 8 GPUs.
CASES = {
    "default-config": ["--config", str(DEFAULT)],
    "pipeline": ["--n-layers", "48", "--d-model", "6144", "--n-heads", "3", "--gpu", "A100-80GB", "--gpus", "8",
                 "--zero-stage", "1"],
    "one-node": ["--budget-flops", "1e22", "--gpus", "8"],
}
N_GPUS = {"default-config": 16, "pipeline": 8, "one-node": 8}  # by hand: nodes x GPUs per node
# GPT-3 175B on 8 nodes of A100-80GB without ZeRO-3: a Megatron-style TP x PP layout, which Kiln's trainer does not run
GPT3 = ["--n-layers", "96", "--d-model", "12288", "--n-heads", "96", "--vocab-size", "50257",
        "--gpu", "A100-80GB", "--nodes", "8", "--zero-stage", "2", "--global-batch-tokens", str(2**22)]


def plan_json(argv, capsys) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def project_with(training_keys: dict, *, drop_batch_keys: bool = True) -> dict:
    """configs/default.yaml with `training_keys` pasted into its `training:` section; the layout's micro_batch /
    grad_accum replace micro_batch_size / grad_accum (the default.yaml comment says to remove those)."""
    project = yaml.safe_load(DEFAULT.read_text())
    if drop_batch_keys:
        for key in ("micro_batch_size", "grad_accum"):
            project["training"].pop(key)
    project["training"].update(training_keys)
    return project


def load(project: dict, tmp_path: Path):
    path = tmp_path / "kiln.yaml"
    path.write_text(yaml.safe_dump(project))
    return load_config(path)


@pytest.mark.parametrize("case", CASES)
def test_plan_json_training_block_loads_as_the_project_training_config(case, tmp_path, capsys):
    plan = plan_json(CASES[case], capsys)
    block = plan["training"]
    # the chosen layout, nothing else: the recommended one, or Kiln's own best where that one is TP and PP at once
    chosen = plan["kiln_layout"] or plan["parallelism"]
    full_recompute = chosen["recompute"] == "full"
    assert list(block) == ["parallelism"] + ["model"] * full_recompute and list(block["parallelism"]) == LAYOUT_KEYS
    layout = block["parallelism"]
    assert layout == {key: chosen[key] for key in LAYOUT_KEYS}
    assert plan["cluster"]["n_gpus"] == N_GPUS[case] == layout["tp"] * layout["pp"] * layout["dp"]
    assert chosen["fits"]

    config = load(project_with(block), tmp_path)
    assert config.training.model.activation_checkpointing == full_recompute
    assert config.training.parallelism.model_dump() == layout
    assert config.training.parallelism == Parallelism(**layout)
    assert config.training.micro_batch_size == layout["micro_batch"]
    assert config.training.grad_accum == layout["grad_accum"]
    assert config.training.parallelism.data_parallel(N_GPUS[case]) == layout["dp"]
    for world_size in (N_GPUS[case] + 1, 2 * N_GPUS[case], N_GPUS[case] // 2):
        with pytest.raises(ValueError, match=r"training\.parallelism") as err:
            config.training.parallelism.data_parallel(world_size)
        assert f"{world_size} training processes" in str(err.value)


def test_the_planner_emits_tensor_and_pipeline_parallel_layouts(capsys):
    """The round trip above covers TP > 1 and PP > 1, not only pure data parallelism. GPT-3 on 64 A100s plans as
    TP x PP at once (a 3D-parallel trainer's layout); the block Kiln's config takes has TP or PP at 1."""
    default = plan_json(CASES["default-config"], capsys)["training"]["parallelism"]
    pipeline = plan_json(CASES["pipeline"], capsys)["training"]["parallelism"]
    gpt3 = plan_json(GPT3, capsys)
    assert default["tp"] > 1
    assert pipeline["pp"] > 1 and pipeline["tp"] == 1
    assert pipeline["zero_stage"] <= 1  # DeepSpeed's pipeline engine runs ZeRO-0/1 only: the config would refuse 2
    assert gpt3["parallelism"]["pp"] > 1 and gpt3["parallelism"]["tp"] > 1
    assert 1 in (gpt3["training"]["parallelism"]["tp"], gpt3["training"]["parallelism"]["pp"])


def test_training_yaml_pastes_under_training(tmp_path, capsys):
    """`--training-yaml` text, indented under `training:` of default.yaml in place of micro_batch_size / grad_accum,
    loads to the same layout as the JSON block."""
    argv = CASES["pipeline"]
    block = plan_json(argv, capsys)["training"]
    assert main(["plan", *argv, "--training-yaml"]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text) == block
    lines = [line for line in DEFAULT.read_text().splitlines()
             if not line.startswith(("  micro_batch_size:", "  grad_accum:"))]
    at = lines.index("training:") + 1
    # the pipeline case fits only with full recompute: its model key merged into default.yaml's, as the text says
    assert block["model"] == {"activation_checkpointing": True} and "merge it into training.model" in text
    pasted_model = "  model: {preset: tiny, tied_embeddings: true, activation_checkpointing: true}"
    lines[lines.index("  model: {preset: tiny, tied_embeddings: true}")] = pasted_model
    text = "\n".join(line for line in text.splitlines() if not line.startswith("model:"))
    pasted = "\n".join(lines[:at] + ["  " + line for line in text.splitlines()] + lines[at:]) + "\n"
    (tmp_path / "kiln.yaml").write_text(pasted)
    training = load_config(tmp_path / "kiln.yaml").training
    assert training.model.activation_checkpointing
    assert training.parallelism.model_dump() == block["parallelism"]
    assert (training.micro_batch_size, training.grad_accum) == (block["parallelism"]["micro_batch"],
                                                               block["parallelism"]["grad_accum"])


def test_table_names_the_block(capsys):
    block = plan_json(CASES["default-config"], capsys)["training"]
    assert main(["plan", *CASES["default-config"]]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if "training.parallelism:" in line]
    assert yaml.safe_load(line.split("training.", 1)[1]) == block


def test_a_layout_that_fits_only_with_full_recompute_turns_activation_checkpointing_on(tmp_path, capsys):
    """1e23 FLOPs on 8 H100s at seq_len 32768: no layout fits without recomputing each block, so the plan says full
    recompute, and the `training:` block must turn the trainer's activation checkpointing on (it recomputes only when
    told): without it the same layout needs about 4x the memory. The block loads as the run's settings."""
    argv = ["--budget-flops", "1e23", "--gpus", "8", "--seq-len", "32768", "--global-batch-tokens", str(2**22),
            "--mfu", "0.4"]
    plan = plan_json(argv, capsys)
    assert plan["parallelism"]["recompute"] == "full" and plan["kiln_layout"] is None
    block = plan["training"]
    assert block["model"] == {"activation_checkpointing": True}
    assert load(project_with(block), tmp_path).training.model.activation_checkpointing
    assert main(["plan", *argv, "--training-yaml"]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text) == block and "model: {activation_checkpointing: true}" in text
    assert main(["plan", *argv]) == 0
    assert "training.model: {activation_checkpointing: true}" in capsys.readouterr().out


def test_json_and_training_yaml_are_exclusive(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "--json", "--training-yaml"])
    assert info.value.code == 2 and "not allowed with" in capsys.readouterr().err


@pytest.mark.parametrize("key, layout_key", [("micro_batch_size", "micro_batch"), ("grad_accum", "grad_accum")])
def test_a_batch_setting_that_disagrees_with_the_layout_is_refused(key, layout_key, tmp_path, capsys):
    block = plan_json(CASES["default-config"], capsys)["training"]
    value = block["parallelism"][layout_key]
    same = project_with(block)
    same["training"][key] = value  # equal: accepted
    assert getattr(load(same, tmp_path).training, key) == value

    other = project_with(block)
    other["training"][key] = value + 1
    with pytest.raises(ConfigError) as err:
        load(other, tmp_path)
    message = str(err.value)
    assert f"training.{key} is {value + 1}" in message
    assert f"training.parallelism.{layout_key} is {value}" in message


def test_default_yaml_batch_keys_left_in_place_are_named(tmp_path, capsys):
    """Pasting without removing default.yaml's batch keys: its micro_batch_size `auto` gives way to the layout's
    micro_batch; its grad_accum: 1, a number, fails with a message when the layout's differs, not a silent choice."""
    block = plan_json(CASES["default-config"], capsys)["training"]
    kept = project_with(block, drop_batch_keys=False)
    assert kept["training"]["micro_batch_size"] == "auto"
    if block["parallelism"]["grad_accum"] == kept["training"]["grad_accum"]:
        assert load(kept, tmp_path).training.micro_batch_size == block["parallelism"]["micro_batch"]
        pytest.skip("the plan's grad_accum happens to equal default.yaml's")
    with pytest.raises(ConfigError, match=r"training\.grad_accum is 1 but training\.parallelism\.grad_accum"):
        load(kept, tmp_path)
    del kept["training"]["grad_accum"]
    assert load(kept, tmp_path).training.micro_batch_size == block["parallelism"]["micro_batch"]


def test_pipeline_with_zero3_is_refused(tmp_path, capsys):
    block = plan_json(CASES["pipeline"], capsys)["training"]
    layout = block["parallelism"]
    assert layout["pp"] > 1
    bad = project_with({"parallelism": {**layout, "zero_stage": 3}})
    with pytest.raises(ConfigError) as err:
        load(bad, tmp_path)
    message = str(err.value)
    assert "training.parallelism" in message and f"pp {layout['pp']} with zero_stage 3" in message
    assert "zero_stage: 1" in message  # says what to set
    with pytest.raises(ValueError, match="zero_stage"):  # the settings class alone, by hand
        Parallelism(tp=1, pp=2, zero_stage=3)
    assert Parallelism(tp=1, pp=2, zero_stage=1).data_parallel(8) == 4
    assert Parallelism(tp=1, pp=1, zero_stage=3).zero_stage == 3  # ZeRO-3 without a pipeline is fine


def test_a_layout_without_dp_takes_what_the_world_size_leaves():
    """By hand: tp 1 x pp 4 = 4 ranks per replica; 16 processes leave dp 4, 18 do not divide."""
    layout = Parallelism(tp=1, pp=4, zero_stage=1)
    assert layout.data_parallel(16) == 4
    with pytest.raises(ValueError, match=r"training\.parallelism \(tp 1 x pp 4 = 4 ranks"):
        layout.data_parallel(18)


def test_where_nothing_fits_the_block_is_still_one_kiln_runs(capsys):
    """GPT-3 on 32 A100-80GB: no layout fits (the planner's closest is TP 8 x PP 4, 82 GiB of 72 usable). The block
    is still Kiln's closest (TP or PP at 1), which the config loads (and the launch then refuses for memory), and
    `--training-yaml` says both: why not the plan's layout, and that it does not fit."""
    argv = [*GPT3[:8], "--gpus", "32", *GPT3[12:]]
    assert "--nodes" not in argv and "--zero-stage" in argv
    plan = plan_json(argv, capsys)
    assert not plan["parallelism"]["fits"] and plan["parallelism"]["tp"] > 1 and plan["parallelism"]["pp"] > 1
    layout = plan["training"]["parallelism"]
    assert layout == {key: plan["kiln_layout"][key] for key in LAYOUT_KEYS} and 1 in (layout["tp"], layout["pp"])
    assert Parallelism(**layout).data_parallel(32) == layout["dp"]
    assert main(["plan", *argv, "--training-yaml"]) == 0
    text = capsys.readouterr().out
    assert "# the best layout Kiln's trainer runs (TP or PP at 1), not the plan's TP 8 x PP 4" in text
    assert "# warning: it does not fit:" in text and yaml.safe_load(text) == plan["training"]
