from pathlib import Path

import pytest

from kiln.common.config import ConfigError, ProjectConfig, load_config, parse_config

DEFAULT = Path(__file__).resolve().parents[3] / "configs" / "default.yaml"


def minimal(**source_overrides):
    source = {"name": "web", "kind": "jsonl", "path": "/data/*.jsonl", "license": "CC-BY-4.0", "domain": "web",
              "profile": "prose"} | source_overrides
    return {"sources": [source], "profiles": {"prose": ["gopher_quality", {"c4": {"min_num_sentences": 3}}]}}


def test_default_config_is_valid():
    config = load_config(DEFAULT)
    assert {s.name for s in config.sources} >= {"python_docs", "package_readmes", "package_licenses", "stdlib_code"}
    for source in config.sources:
        assert source.profile in config.profiles


def test_profile_steps_parse_both_forms():
    config = parse_config(minimal())
    steps = config.profile_for("web")
    assert [s.step for s in steps] == ["gopher_quality", "c4"]
    assert steps[1].params == {"min_num_sentences": 3}


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: c["sources"][0].update(kind="jsonx"), ["sources[0].kind", "'jsonx'", "'jsonl'"]),
    (lambda c: c["sources"][0].update(quality_tier=9), ["sources[0].quality_tier", "9", "less than or equal to 5"]),
    (lambda c: c["sources"][0].update(licence="MIT"), ["sources[0].licence", "did you mean 'license'"]),
    (lambda c: c["sources"][0].update(profile="nope"), ["'nope'", "defined profiles: ['prose']"]),
    (lambda c: c["sources"][0].pop("path"), ["no 'path'"]),
    (lambda c: c["profiles"]["prose"].append("gopher_qualty"), ["profiles.prose[2]", "unknown step 'gopher_qualty'",
                                                                "gopher_quality"]),
    (lambda c: c["profiles"]["prose"].append({"c4": {"min_sentences": 2}}),
     ["profiles.prose[2] (c4)", "min_sentences", "min_num_sentences"]),
    (lambda c: c.update(sources=c["sources"] * 2), ["source names must be unique", "'web'"]),
    (lambda c: c.update(engine={"workers": -1}), ["engine.workers", "-1", "greater than or equal to 0"]),
    (lambda c: c.update(curation={"workers": 2}), ["curation.workers", "moved to engine.workers"]),
    (lambda c: c.update(engine={"backend": "spark"}), ["engine.backend", "'spark'", "'ray'", "'processes'"]),
    (lambda c: c.update(curation={"pii": {"types": ["email", "passport"]}}), ["curation.pii", "passport", "email"]),
    (lambda c: c.update(refresh={"schedule": {"timezone": "Mars/Olympus"}}),
     ["refresh.schedule.timezone", "'Mars/Olympus' is not an IANA time zone", "'Europe/Berlin'"]),
    (lambda c: c.update(quality={"perplexity": {"device": "tpu"}}),
     ["quality.perplexity.device", "'tpu'", "auto|cpu|cuda"]),
    (lambda c: c.update(storage={"keep_replaced_minutes": -5}),
     ["storage.keep_replaced_minutes", "-5", "greater than or equal to 0"]),
    (lambda c: c.update(storage={"keep_old_run_checkpoints": -1}),
     ["storage.keep_old_run_checkpoints", "-1", "greater than or equal to 0"]),
    # seeds numpy's and SentencePiece's generators refuse: a traceback naming no key, after the tokenize round
    (lambda c: c.update(shards={"seed": -1}), ["shards.seed", "-1", "greater than or equal to 0"]),
    (lambda c: c.update(tokenizer={"seed": 2**32}), ["tokenizer.seed", "4294967296", "less than 4294967296"]),
])
def test_bad_config_names_key_value_and_what_is_allowed(mutate, expected):
    raw = minimal()
    mutate(raw)
    with pytest.raises(ConfigError) as err:
        parse_config(raw, origin="test.yaml")
    message = str(err.value)
    assert message.startswith("test.yaml: invalid config")
    for fragment in expected:
        assert fragment in message, message


# The key as the YAML writes it, once: pydantic names the type it tried in the path of a key of several types
# (`enabled.bool`, `enabled.literal['auto']`, one error each), the mark `[key]` after a mapping's key, and a field by
# its Python name (`from_`); and a mapping of sections (`quality.rules.<source>`) is no dead end for the hints.
@pytest.mark.parametrize("change, line", [
    ({"quality": {"classifier": {"enabled": "maybe"}}},
     "  quality.classifier.enabled = 'maybe': Input should be a valid boolean or 'auto'"),
    ({"training": {"micro_batch_size": "big"}},
     "  training.micro_batch_size = 'big': Input should be a valid integer or 'auto'"),
    ({"training": {"micro_batch_size": 0}},
     "  training.micro_batch_size = 0: Input should be greater than 0 or 'auto'"),
    ({"quality": {"rules": {"web": {"min_scroe": 0.5}}}}, "  quality.rules.web.min_scroe: unknown key; did you mean "
                                                          "'min_score'?"),
    ({"mixture": {"replay": {"share": 0.1, "fracton": 0.1}}}, "  mixture.replay.fracton: unknown key; allowed keys: "
                                                              "from, share"),
    ({"tokenizer": {"special_tokens": {"bso": "<s>"}}},
     "  tokenizer.special_tokens.bso: unknown key; did you mean 'bos'? (allowed keys: 'bos', 'eos', 'pad', 'unk', "
     "'fim_prefix', 'fim_suffix' or 'fim_middle')"),
])
def test_a_bad_key_is_one_line_naming_it_as_written(change, line):
    with pytest.raises(ConfigError) as err:
        parse_config(minimal() | change, origin="test.yaml")
    assert str(err.value).splitlines() == ["test.yaml: invalid config", line]


# YAML as users write it: `yes` and `true` are booleans, `.inf` and `.nan` floats. Pydantic's lax mode read a boolean
# as 1 (one training step, one checkpoint kept, one worker) and let an infinite learning rate through.
@pytest.mark.parametrize("yaml_lines, key", [
    ("training:\n  max_steps: true\n", "training.max_steps = True"),
    ("training:\n  checkpoint:\n    keep_last: yes\n", "training.checkpoint.keep_last = True"),
    ("engine:\n  workers: on\n", "engine.workers = True"),
    ("training:\n  schedule:\n    lr: .inf\n", "training.schedule.lr = inf"),
    ("training:\n  adam_eps: .nan\n", "training.adam_eps = nan"),
    ("dedup:\n  near:\n    threshold: .nan\n", "dedup.near.threshold = nan"),
])
def test_a_boolean_or_an_infinity_for_a_number_is_refused(tmp_path, yaml_lines, key):
    path = tmp_path / "kiln.yaml"
    path.write_text(f"extends: {DEFAULT}\n" + yaml_lines)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert key in message, message
    assert ("takes no true/false" if "True" in key else "finite number") in message, message


@pytest.mark.parametrize("yaml_lines, fragments", [
    # inside a mapping: the weight read as 1.0
    ("mixture:\n  weights:\n    python_docs: yes\n", ["mixture.weights: this key takes no true/false", "(at python_docs)"]),
    # a filter step's parameter (a user turning a rule off; null is the way): the threshold read as 0 dropped every
    # document with one '#' heading
    ("profiles:\n  technical_docs:\n    - gopher_quality: {max_symbol_word_ratio: off}\n",
     ["profiles.technical_docs[0] (gopher_quality)", "max_symbol_word_ratio: takes no true/false",
      "given False; default 0.1"]),
    ("profiles:\n  technical_docs:\n    - gopher_quality: {max_avg_word_length: .inf}\n",
     ["max_avg_word_length: must be a finite number (given inf"]),
    ("planning:\n  n_gpus: yes\n", ["planning.n_gpus = True", "takes no true/false"]),
])
def test_a_boolean_or_an_infinity_is_refused_inside_mappings_steps_and_the_plan(tmp_path, yaml_lines, fragments):
    path = tmp_path / "kiln.yaml"
    path.write_text(f"extends: {DEFAULT}\n" + yaml_lines)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


# YAML reads `no:` (Norwegian's language code), `on:` and `1:` as a boolean and a number: the message named no key
# ("refresh.sensor[1] = True: Keys should be strings") or a language False, never the fix, quoting the key.
@pytest.mark.parametrize("yaml_lines, line", [
    ("profiles:\n  technical_docs:\n    - language\n"
     "    - gopher_quality: {per_language: {no: {min_doc_words: 30}}}\n",
     "  profiles: profiles.technical_docs[1] (gopher_quality).per_language: a language code read as False: YAML reads "
     "an unquoted yes/no/on/off/true/false as a boolean: write the key in quotes (\"no\": ...)"),
    ("refresh:\n  sensor:\n    on: true\n",
     "  refresh.sensor: the key True is not a string; YAML reads an unquoted yes/no/on/off/true/false as a boolean: "
     "write the key in quotes (\"no\": ...)"),
    ("card:\n  license_fields:\n    1: licence\n",
     "  card.license_fields: the key 1 is not a string; keys are words: write it in quotes ('1': ...)"),
])
def test_a_key_yaml_reads_as_a_boolean_or_a_number_is_told_to_be_quoted(tmp_path, yaml_lines, line):
    path = tmp_path / "kiln.yaml"
    path.write_text(f"extends: {DEFAULT}\n" + yaml_lines)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).splitlines() == [f"{path}: invalid config", line]
    quoted = yaml_lines.replace("no:", '"no":').replace("on:", '"on":').replace("1:", "'1':")
    path.write_text(f"extends: {DEFAULT}\n" + quoted)
    if "per_language" in yaml_lines:
        assert load_config(path).profiles["technical_docs"][1].per_language == {"no": {"min_doc_words": 30}}


def test_booleans_still_set_the_keys_that_take_them(tmp_path):
    path = tmp_path / "kiln.yaml"
    path.write_text(f"extends: {DEFAULT}\ntraining:\n  compile: false\n  model:\n    tied_embeddings: no\n"
                    "  checkpoint:\n    resume: off\n")
    training = load_config(path).training
    assert training.compile is False and training.model.tied_embeddings is False
    assert training.checkpoint.resume is False


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """Plain YAML keeps the last of two equal keys: a second `storage:` block silently dropped `backend: s3`, and the
    data stayed on this machine. A `<<` merge's keys may still be overridden, as YAML means them to be."""
    path = tmp_path / "kiln.yaml"
    path.write_text(f"extends: {DEFAULT}\nstorage:\n  backend: s3\n  bucket: b\nengine:\n  workers: 1\n"
                    "storage:\n  keep_replaced_minutes: 10\n")
    with pytest.raises(ConfigError, match=r"key 'storage' is given twice \(lines 2 and 7\).*merge them into one"):
        load_config(path)
    path.write_text(f"extends: {DEFAULT}\nengine: &local\n  workers: 1\n  backend: processes\n"
                    "card:\n  summary: s\n  summary: t\n")
    with pytest.raises(ConfigError, match=r"key 'summary' is given twice \(lines 6 and 7\)"):
        load_config(path)
    path.write_text(f"extends: {DEFAULT}\nx-engine: &local {{workers: 1, backend: ray}}\n"
                    "engine:\n  <<: *local\n  backend: processes\n")
    with pytest.raises(ConfigError, match="x-engine"):  # the merge itself is fine; the stray key is what is refused
        load_config(path)


def test_every_bad_step_of_the_profiles_is_named_at_once(tmp_path):
    """The loader reported only the first bad step: a user fixed it, loaded again, and met the next. Every step's
    error is one line now, as docs/curation.md shows them (the default prose profile's 5th and 6th steps)."""
    path = tmp_path / "kiln.yaml"
    path.write_text(f"extends: {DEFAULT}\nprofiles:\n  prose:\n    - url_blocklist\n    - garbage\n    - language\n"
                    "    - gopher_repetition\n    - gopher_quality: {max_bullet_lines_ratio: 1.5}\n"
                    "    - c4: {min_sentences: 3}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    lines = str(error.value).splitlines()
    assert lines[1].startswith("  profiles: profiles.prose[4] (gopher_quality): max_bullet_lines_ratio:")
    assert lines[2].startswith("  profiles: profiles.prose[5] (c4): step 'c4' has no parameter(s) ['min_sentences']")


def test_every_shipped_config_loads():
    for path in [DEFAULT, *sorted((Path(DEFAULT).parent / "recipes").glob("*.yaml")),
                 Path(DEFAULT).parent / "demo.yaml"]:
        load_config(path)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("card: {summary: 'Fran\u00e7ais'}\n".encode("latin-1"))  # ç is byte 0xe7 there
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text \(byte 21: .*save the config as UTF-8"):
        load_config(latin1)
    (tmp_path / "configs").mkdir()
    (tmp_path / "child.yaml").write_text("extends: configs\n")
    with pytest.raises(ConfigError, match=r"configs: a directory, not a config file; point extends 'configs' in "):
        load_config(tmp_path / "child.yaml")


def test_a_missing_config_says_what_named_it(tmp_path, monkeypatch):
    """`kiln audit ... --config mine.yml` (a typo) was told to set KILN_CONFIG or create configs/default.yaml, neither
    of which it read."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KILN_CONFIG", raising=False)
    with pytest.raises(ConfigError) as err:
        load_config("mine.yml")
    assert str(err.value) == (f"config file 'mine.yml' not found; no file at {tmp_path / 'mine.yml'}; check the path "
                              f"given (--config)")
    with pytest.raises(ConfigError) as err:
        load_config()
    assert str(err.value) == ("config file 'configs/default.yaml' not found; set KILN_CONFIG or create "
                              f"configs/default.yaml (relative to the current folder, {tmp_path})")
    monkeypatch.setenv("KILN_CONFIG", "gone.yaml")
    with pytest.raises(ConfigError) as err:
        load_config()
    assert str(err.value) == (f"config file 'gone.yaml' not found; KILN_CONFIG names it ({tmp_path / 'gone.yaml'}); "
                              "point KILN_CONFIG at the project's YAML file")


def test_a_loaded_config_survives_a_json_round_trip():
    """Engine tasks and benches hand the config to other processes as JSON: it must read back identical."""
    config = load_config(Path(__file__).resolve().parents[3] / "configs" / "default.yaml")
    assert ProjectConfig.model_validate_json(config.model_dump_json()) == config


def test_a_config_extends_another_key_by_key(tmp_path):
    (tmp_path / "base.yaml").write_text(DEFAULT.read_text())
    (tmp_path / "child.yaml").write_text("extends: base.yaml\ntraining:\n  max_steps: 7\n  schedule: {lr: 0.01}\n"
                                         "mixture:\n  weights: {}\n")
    base, child = load_config(DEFAULT), load_config(tmp_path / "child.yaml")
    assert child.training.max_steps == 7 and child.training.schedule.lr == 0.01
    assert child.training.schedule.min_lr == base.training.schedule.min_lr  # merged, not replaced
    assert child.mixture.weights == {} and child.sources == base.sources
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="makes a cycle"):
        load_config(tmp_path / "loop.yaml")
    (tmp_path / "orphan.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(ConfigError, match="missing.yaml.*not found; \\(extended by"):
        load_config(tmp_path / "orphan.yaml")


def test_a_run_length_in_an_extending_file_replaces_the_one_it_extends(tmp_path):
    """max_steps and token_budget say one thing two ways (not both may be set). default.yaml sets max_steps: 300; a
    file extending it with only token_budget was refused, "set training.max_steps or training.token_budget, not
    both", for a max_steps its author never wrote. Now the extending file's run length replaces the base's, as the
    same key would; both in one file is still refused."""
    (tmp_path / "base.yaml").write_text(DEFAULT.read_text())
    assert load_config(tmp_path / "base.yaml").training.max_steps == 300
    (tmp_path / "mine.yaml").write_text("extends: base.yaml\ntraining:\n  token_budget: 1000000\n")
    mine = load_config(tmp_path / "mine.yaml").training
    assert (mine.token_budget, mine.max_steps) == (1_000_000, None)
    assert mine.resolved_max_steps(world_size=1, seq_len=128) == 977  # ceil(1e6 / (8 x 128)): the budget's
    (tmp_path / "back.yaml").write_text("extends: mine.yaml\ntraining:\n  max_steps: 50\n")
    back = load_config(tmp_path / "back.yaml").training
    assert (back.max_steps, back.token_budget) == (50, None)
    (tmp_path / "both.yaml").write_text("extends: base.yaml\ntraining:\n  token_budget: 1000\n  max_steps: 5\n")
    with pytest.raises(ConfigError, match="not both"):
        load_config(tmp_path / "both.yaml")


@pytest.mark.parametrize("recipe", sorted(p.name for p in (DEFAULT.parent / "recipes").glob("*.yaml")))
def test_every_recipe_config_is_valid(recipe):
    config = load_config(DEFAULT.parent / "recipes" / recipe)
    assert config.sources == load_config(DEFAULT).sources


@pytest.mark.parametrize("change, message", [
    ({"mixture": {"replay": {"share": 0.1}}}, "mixture.replay mixes earlier data into a continued run"),
    ({"training": {"objective": "span_corruption"}}, "set tokenizer.sentinel_tokens"),
    ({"training": {"rewarmup_steps": 5}}, "rewarmup_steps is the warmup of a continued run"),
    ({"training": {"phases": ["long"]}}, r"training.phases names \['long'\], which mixture.phases does not define"),
    ({"training": {"model": {"rope_scaling": {"type": "linear", "factor": 0.5}}}}, "factor"),
])
def test_recipe_settings_that_cannot_work_are_refused(change, message):
    from kiln.common.config import merge_config

    with pytest.raises(ConfigError, match=message):
        parse_config(merge_config(minimal(), change))


def test_an_empty_kiln_home_or_config_counts_as_unset(tmp_path, monkeypatch):
    """`KILN_HOME= make demo` (or an empty value a CI variable left) made the Makefile's DAGSTER_HOME /dagster, and
    Kiln's home the current folder; an empty KILN_CONFIG named the current folder as the config file."""
    import os
    import subprocess

    from kiln.common.config.base import DEFAULT_CONFIG, config_path, kiln_home

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KILN_HOME", "")
    monkeypatch.setenv("KILN_CONFIG", "")
    assert kiln_home() == tmp_path.resolve() / ".kiln"
    assert config_path() == Path(DEFAULT_CONFIG)
    root = Path(__file__).resolve().parents[3]
    shown = subprocess.run(["make", "-s", "-C", str(root), "homes"], capture_output=True, text=True, check=True,
                           env={**os.environ, "KILN_HOME": "", "KILN_CONFIG": ""}).stdout.split()
    assert shown == [f"KILN_HOME={root}/.kiln", f"DAGSTER_HOME={root}/.kiln/dagster",
                     f"KILN_CONFIG={root}/configs/demo.yaml"]
