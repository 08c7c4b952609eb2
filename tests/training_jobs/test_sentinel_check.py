"""Span corruption's sentinels are counted before launch: the project config (tokenizer.sentinel_tokens at the run's
seq_len), the training_run launch config, and the tokenizer this KILN_HOME fitted. Numbers from
test_objectives.py::test_the_sentinels_a_run_needs_by_hand (4096 -> 186, 8192 -> 372, 100 cover up to 2210)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from assets.training import TrainingLaunch, check_sentinels
from kiln.common.config import ConfigError, load_config, merge_config, parse_config

RECIPES = Path(__file__).resolve().parents[2] / "configs" / "recipes"


def span_recipe(change: dict | None = None):
    """configs/recipes/span_corruption.yaml (tokenizer.sentinel_tokens 100), with `change` merged in."""
    config = load_config(RECIPES / "span_corruption.yaml")
    if not change:
        return config
    return parse_config(merge_config(config.model_dump(mode="json", by_alias=True), change))


def test_the_recipe_at_its_seq_len_and_at_the_longest_100_sentinels_cover_is_valid():
    assert span_recipe().tokenizer.sentinel_tokens == 100
    assert span_recipe({"training": {"seq_len": 2210}}).training.seq_len == 2210


def test_a_long_context_span_corruption_run_is_refused_naming_the_keys_and_the_number():
    with pytest.raises(ConfigError) as refused:
        span_recipe({"training": {"seq_len": 4096}})
    message = str(refused.value)
    for part in ["training.objective span_corruption at seq_len 4096 (training.seq_len) needs 186 sentinel tokens",
                 "noise_density 0.15, mean_span 3", "tokenizer.sentinel_tokens is 100",
                 "set tokenizer.sentinel_tokens to ≥ 186", "or lower training.seq_len to ≤ 2210"]:
        assert part in message, part
    assert span_recipe({"training": {"seq_len": 4096}, "tokenizer": {"sentinel_tokens": 186}}).training.seq_len == 4096


def test_without_training_seq_len_the_shards_seq_len_is_checked():
    with pytest.raises(ConfigError, match=r"at seq_len 8192 \(shards.seq_len\) needs 372 sentinel tokens.*"
                                          r"lower shards.seq_len to ≤ 2210"):
        span_recipe({"training": {"seq_len": None}, "shards": {"seq_len": 8192}})


def test_the_long_context_recipe_with_span_corruption_is_checked_at_its_seq_len():
    """The long-context recipe's phase `long` is read at training.seq_len 512: 23 sentinels (512 -> window 513 ->
    467 tokens of text, 70 noise, 23 spans). 20 are too few; 23 do."""
    config = load_config(RECIPES / "long_context.yaml").model_dump(mode="json", by_alias=True)
    with pytest.raises(ConfigError, match=r"at seq_len 512 \(training.seq_len\) needs 23 sentinel tokens"):
        parse_config(merge_config(config, {"training": {"objective": "span_corruption"},
                                           "tokenizer": {"sentinel_tokens": 20}}))
    parse_config(merge_config(config, {"training": {"objective": "span_corruption"},
                                       "tokenizer": {"sentinel_tokens": 23}}))


def test_the_launch_config_is_checked_before_launch():
    with pytest.raises(dg.Failure, match=r"(?s)training_run launch config.*at seq_len 4096 \(training.seq_len\) needs 186"):
        TrainingLaunch(seq_len=4096).apply(span_recipe())


def card(sentinels: int) -> dict:
    specials = {"pad": {"id": 0}, "eos": {"id": 2}}
    return {"special_tokens": {**specials, **{f"sentinel_{i}": {"id": 7 + i} for i in range(sentinels)}}}


def test_the_fitted_tokenizer_is_checked_not_only_the_config():
    """The config asks for 200 sentinels (enough for 4096), but this KILN_HOME fitted its tokenizer with 100."""
    settings = span_recipe({"training": {"seq_len": 4096}, "tokenizer": {"sentinel_tokens": 200}}).training
    with pytest.raises(dg.Failure) as refused:
        check_sentinels(settings, card(100), shards_seq_len=512)
    message = refused.value.description
    for part in ["at seq_len 4096 (training.seq_len) needs 186 sentinel tokens",
                 "the tokenizer of this KILN_HOME was fitted with 100 (it is fitted once and kept)",
                 "re-materialize `tokenizer` and `token_shards` with tokenizer.sentinel_tokens ≥ 186",
                 "or lower training.seq_len to ≤ 2210"]:
        assert part in message, part
    check_sentinels(settings, card(186), shards_seq_len=512)
    # No training.seq_len: the run reads the shards' seq_len.
    unset = span_recipe({"training": {"seq_len": None}}).training
    with pytest.raises(dg.Failure, match=r"at seq_len 8192 \(the token shards' seq_len, shards.seq_len\) needs 372"):
        check_sentinels(unset, card(100), shards_seq_len=8192)
    with pytest.raises(dg.Failure, match="fitted without them"):
        check_sentinels(unset, card(0), shards_seq_len=512)
    check_sentinels(span_recipe({"training": {"objective": "clm"}}).training, card(0), shards_seq_len=8192)


def test_the_arithmetic_the_config_imports_needs_no_torch_or_numpy():
    import subprocess
    import sys

    code = "import sys, training_jobs.span_lengths; sys.exit(sorted({'torch', 'numpy'} & set(sys.modules)) or 0)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
