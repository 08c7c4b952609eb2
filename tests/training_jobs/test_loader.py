"""The training loader: every token once across ranks, exact resume, phases in order, refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kiln.common.config import Mixture, Phase
from kiln.common.storage import DatasetWriter
from kiln.tokens.shard_format import ShardError, open_shard, read_shard_set
from kiln.tokens.shard_writer import write_token_shards
from tests.token_corpus import (
    NATURAL,
    make_texts,
    shard_settings,
    standard_sources,
    train_small_tokenizer,
    write_source,
)
from training_jobs.loader import KeptSequences, ShardLoader

SEQ = 16


def commit(writer: DatasetWriter, result, monkeypatch) -> Path:
    monkeypatch.setattr("kiln.common.storage.git_commit", lambda: None)
    writer.commit(code_version="test", config={}, inputs={}, counts=result.counts(), stats=result.manifest_stats())
    return writer.final_dir


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A committed token_shards dataset with several shards per split."""
    root = tmp_path_factory.mktemp("loader")
    sources = standard_sources(root)
    tok_dir = train_small_tokenizer(root, sources)
    writer = DatasetWriter(root / "store" / "token_shards" / "_all", "token_shards", None)
    result = write_token_shards(sources, tok_dir, shard_settings(seq_len=SEQ), NATURAL, writer, progress=False)
    mp = pytest.MonkeyPatch()
    try:
        return commit(writer, result, mp), result
    finally:
        mp.undo()


def stream(dataset_dir: Path, split: str = "train") -> np.ndarray:
    shard_set = read_shard_set(dataset_dir)
    return np.concatenate([open_shard(dataset_dir / s.path).tokens for s in shard_set.split(split)]).astype(np.int64)


def all_inputs(loader: ShardLoader) -> list[np.ndarray]:
    return [x.numpy() for x, _ in loader]


def test_batches_are_shifted_long_tensors(dataset):
    path, result = dataset
    loader = ShardLoader(path, seq_len=SEQ, batch_size=4, expected_tokenizer_sha256=result.tokenizer_sha256)
    x, y = next(iter(loader))
    assert x.dtype == y.dtype == torch.long and x.shape == y.shape == (4, SEQ)
    assert torch.equal(x[:, 1:], y[:, :-1])
    tokens = stream(path)
    assert x[0].tolist() == tokens[:SEQ].tolist() and y[0].tolist() == tokens[1:SEQ + 1].tolist()
    assert loader.seq_len == ShardLoader(path).seq_len == SEQ  # the default comes from the manifest


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_no_token_lost_or_duplicated_across_ranks(dataset, world_size):
    path, _ = dataset
    tokens = stream(path)
    n_seq = (len(tokens) - 1) // SEQ
    usable = n_seq - n_seq % world_size
    loaders = [ShardLoader(path, seq_len=SEQ, batch_size=1, rank=r, world_size=world_size) for r in range(world_size)]
    per_rank = [np.concatenate(all_inputs(loader)) for loader in loaders]
    assert len({len(p) for p in per_rank}) == 1  # every rank takes the same number of steps
    interleaved = np.stack(per_rank, axis=1).reshape(-1, SEQ)  # sequence j*world + r came from rank r
    assert interleaved.shape[0] == usable
    assert np.array_equal(interleaved.reshape(-1), tokens[:usable * SEQ])


def counting_set(folder: Path, layout: list[tuple[str, int, int, str]]) -> Path:
    """A hand-made shard set of shards (phase, phase index, tokens, split) whose token at stream position i is i."""
    from kiln.tokens.shard_format import ShardInfo, describe_shard_set, write_shard
    infos, start = [], 0
    for name, (phase, index, size, split) in enumerate(layout):
        tokens = np.arange(start, start + size, dtype=np.uint16)
        write_shard(folder / f"shard-{name:05d}.bin", tokens, np.array([0, size // 2, size]), SHA)
        infos.append(ShardInfo(f"shard-{name:05d}.bin", split, phase, index, size, 2))
        start += size
    stats = describe_shard_set(SHA, 60_000, 2, infos, seq_len=SEQ)
    (folder / "_manifest.json").write_text(json.dumps({"stats": stats}))
    return folder


@pytest.fixture
def counting(tmp_path) -> Path:
    """A hand-made shard set whose token at stream position i is i (two phases, shards of odd sizes), so a
    sequence is identified by its first token."""
    return counting_set(tmp_path, [("a", 0, 1001, "train"), ("a", 0, 777, "train"), ("b", 1, 1500, "train"),
                                   ("val", 0, 300, "val")])


def test_a_phase_too_short_for_every_rank_is_refused_naming_it(tmp_path):
    """Phase "short" holds 40 tokens: (40 - 1) // 16 = 2 sequences, 0 per rank for 3 ranks (the rest is cut so every
    rank reads as many). It was skipped silently: the run trained as if the phase were not configured. Refused now,
    naming the phase, its tokens and the ways out; on 2 ranks each reads one of its sequences."""
    path = counting_set(tmp_path, [("main", 0, 1000, "train"), ("short", 1, 40, "train"), ("val", 0, 300, "val")])
    with pytest.raises(ShardError, match=r"phase 'short' has 40 tokens: 2 sequences of 16, fewer than one for each "
                                         r"of 3 ranks.*never be trained on.*mixture\.phases.*training\.phases"):
        ShardLoader(path, seq_len=SEQ, batch_size=1, rank=0, world_size=3)
    loader = ShardLoader(path, seq_len=SEQ, batch_size=1, rank=1, world_size=2)
    assert [p.per_rank for p in loader.phases] == [31, 1]  # (1000 - 1) // 16 = 62 sequences, 31 per rank
    assert ShardLoader(path, seq_len=SEQ, batch_size=1, world_size=3, phases=["main"]).phases[0].per_rank == 20


SHA = "12" * 32


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_ranks_cover_each_phase_once_in_every_epoch(counting, world_size, epoch):
    loaders = [ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=r, world_size=world_size, seed=5)
               for r in range(world_size)]
    firsts = []
    for loader in loaders:
        loader.load_state_dict({**loader.state_dict(), "epoch": epoch})
        rows = np.concatenate(all_inputs(loader))
        assert np.array_equal(rows, rows[:, :1] + np.arange(SEQ))  # contiguous, also across shard boundaries
        firsts.append(rows[:, 0].tolist())
    assert len({len(f) for f in firsts}) == 1
    flat = [t for f in firsts for t in f]
    assert len(flat) == len(set(flat))  # no sequence read twice
    phase_a, phase_b = [t for t in flat if t < 1778], [t for t in flat if t >= 1778]
    for tokens, first, size in [(phase_a, 0, 1778), (phase_b, 1778, 1500)]:
        n_seq = (size - 1) // SEQ
        assert len(tokens) == n_seq - n_seq % world_size
        assert all((t - first) % SEQ == 0 and t - first + SEQ < size for t in tokens)
    if epoch == 0:
        assert firsts[0][:2] == [0, world_size * SEQ]  # file order
    # phases in order on every rank: every phase-a sequence before every phase-b one
    for f in firsts:
        assert f == sorted(f, key=lambda t: t >= 1778)


def test_the_phase_of_a_position_is_that_of_the_last_sequence_read(counting):
    """What the stability monitor is told about each step's data: tokens below 1778 are phase a's (the fixture's
    stream), so the last row read says which phase the loader stands in, across both phases and an epoch's end."""
    loader = ShardLoader(counting, seq_len=SEQ, batch_size=3, rank=1, world_size=2, seed=5)
    seen = []
    for _ in range(2 * loader.batches_per_epoch + 1):
        x, _ = loader.next_batch()
        seen.append(loader.phase_at(loader.state_dict()))
        assert seen[-1] == ("a" if int(x[-1, 0]) < 1778 else "b")
    assert {"a", "b"} == set(seen) and seen[0] == "a" and seen[-1] == "a"  # the next epoch starts in a again


def test_epochs_are_reshuffled_deterministically(counting):
    def epoch_firsts(seed, epoch, shuffle=True):
        loader = ShardLoader(counting, seq_len=SEQ, batch_size=1, seed=seed, shuffle_epochs=shuffle)
        loader.load_state_dict({**loader.state_dict(), "epoch": epoch})
        return np.concatenate(all_inputs(loader))[:, 0].tolist()

    assert epoch_firsts(1, 0) == sorted(epoch_firsts(1, 0))
    assert epoch_firsts(1, 1) != epoch_firsts(1, 2) != epoch_firsts(1, 0)
    assert epoch_firsts(1, 1) == epoch_firsts(1, 1) and epoch_firsts(1, 1) != epoch_firsts(2, 1)
    assert epoch_firsts(1, 3, shuffle=False) == epoch_firsts(1, 0)


@given(st.integers(1, 3000), st.tuples(st.integers(0, 2**32), st.integers(1, 9), st.integers(0, 3)), st.data())
def test_a_shuffled_epoch_is_a_permutation_computed_slot_by_slot(n, key, data):
    """`shuffled` maps range(n) onto itself one to one, whatever n and key, and a slot alone gives what the whole
    array gives; a slot outside the epoch is an error, not a wrapped read."""
    from training_jobs.loader import shuffled

    order = shuffled(np.arange(n), n, key)
    assert sorted(order.tolist()) == list(range(n))
    slot = data.draw(st.integers(0, n - 1), label="slot")
    assert shuffled(slot, n, key) == order[slot]
    with pytest.raises(IndexError, match=f"slot {n} of an epoch of {n} sequences"):
        shuffled(n, n, key)
    with pytest.raises(IndexError, match=f"slot {n} of an epoch of {n} sequences"):
        shuffled(np.array([0, n]), n, key)


def test_a_shuffled_epoch_reads_like_a_random_permutation():
    """Over 100,000 sequences, against a uniform random permutation's expectations: slot and sequence uncorrelated
    (|r| ~ 1/sqrt(n) = 0.003), neighbouring slots a third of the epoch apart on average, about one fixed point
    (not ~n, as a weak mix of a cycle walk would give), and another key (another epoch) a different order."""
    from training_jobs.loader import shuffled

    n = 100_000
    order = shuffled(np.arange(n), n, (5, 1, 0))
    assert abs(np.corrcoef(np.arange(n), order)[0, 1]) < 0.02
    assert 0.32 < np.abs(np.diff(order)).mean() / n < 0.35
    assert np.count_nonzero(order == np.arange(n)) < 10
    assert np.count_nonzero(order == shuffled(np.arange(n), n, (5, 2, 0))) < 10


def test_a_state_of_the_first_format_resumes_in_its_stored_permutation(counting):
    """Loader states "kiln-loader/1" shuffled epoch e of phase p by numpy's permutation of (seed, e, p): a run
    checkpointed then resumes in that order (the second implementation below draws it directly), and keeps writing
    /1 states; a new state (/2) reads slot j's sequence from `shuffled`. Each sequence is known by its first token:
    the counting set's token at stream position i is i, so phase a's sequence g starts with g * SEQ."""
    from training_jobs.loader import shuffled

    loader = ShardLoader(counting, seq_len=SEQ, batch_size=1, seed=5)
    phase = loader.phases[0]
    state = loader.state_dict()
    assert state["format"] == "kiln-loader/2"
    for fmt, order in [("kiln-loader/1", np.random.default_rng([5, 1, 0]).permutation(phase.sequences)),
                       ("kiln-loader/2", shuffled(np.arange(phase.sequences), phase.sequences, (5, 1, 0)))]:
        loader = ShardLoader(counting, seq_len=SEQ, batch_size=1, seed=5)
        loader.load_state_dict({**state, "format": fmt, "epoch": 1})
        firsts = [int(loader.next_batch()[0][0, 0]) for _ in range(phase.per_rank)]
        assert firsts == (order[:phase.per_rank] * SEQ).tolist()
        assert loader.state_dict()["format"] == fmt


def test_resume_mid_epoch_continues_exactly(dataset):
    path, _ = dataset
    kwargs = dict(seq_len=SEQ, batch_size=3, rank=1, world_size=2, seed=11)
    reference = ShardLoader(path, **kwargs)
    steps = reference.batches_per_epoch + 7  # crosses into the reshuffled second epoch
    expected = [reference.next_batch() for _ in range(steps)]

    first = ShardLoader(path, **kwargs)
    for _ in range(5):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints store it as JSON
    resumed = ShardLoader(path, **kwargs)
    resumed.load_state_dict(state)
    for want in expected[5:]:
        got = resumed.next_batch()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert resumed.epoch == 1


def test_resume_through_the_iterator(dataset):
    path, _ = dataset
    uninterrupted = all_inputs(ShardLoader(path, seq_len=SEQ, batch_size=2))
    loader = ShardLoader(path, seq_len=SEQ, batch_size=2)
    seen = []
    for x, _ in loader:
        seen.append(x.numpy())
        if len(seen) == 4:
            break
    again = ShardLoader(path, seq_len=SEQ, batch_size=2)
    again.load_state_dict(loader.state_dict())
    seen += all_inputs(again)
    assert len(seen) == len(uninterrupted) and all(np.array_equal(a, b) for a, b in zip(seen, uninterrupted))
    assert again.epoch == 1 and again.position == 0


def test_resume_with_other_settings_is_refused(dataset):
    path, _ = dataset
    state = ShardLoader(path, seq_len=SEQ, batch_size=2, world_size=2).state_dict()
    with pytest.raises(ShardError, match="world_size = 2"):
        ShardLoader(path, seq_len=SEQ, batch_size=2, world_size=3).load_state_dict(state)
    with pytest.raises(ShardError, match="seq_len = 16"):
        ShardLoader(path, seq_len=8, batch_size=2, world_size=2).load_state_dict(state)
    ShardLoader(path, seq_len=SEQ, batch_size=5, world_size=2).load_state_dict(state)  # batch size may change


def test_wrong_tokenizer_hash_is_refused(dataset):
    path, result = dataset
    with pytest.raises(ShardError, match=r"written with tokenizer .{12}…, the loader expects 000000000000…"):
        ShardLoader(path, seq_len=SEQ, expected_tokenizer_sha256="0" * 64)


def test_corrupt_header_is_refused(dataset, tmp_path):
    import shutil
    path, _ = dataset
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    victim = copy / read_shard_set(copy).split("train")[1].path
    data = bytearray(victim.read_bytes())
    data[0:8] = b"GARBAGE!"
    victim.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="is not a Kiln token shard"):
        ShardLoader(copy, seq_len=SEQ)
    data[0:8] = b"KILNTOK1"
    victim.write_bytes(bytes(data[:-16]))
    with pytest.raises(ShardError, match="truncated or corrupt"):
        ShardLoader(copy, seq_len=SEQ)


def test_opening_reads_each_shards_header_not_its_document_index(counting, monkeypatch):
    """Every rank checks every shard when it opens (header, size, tokenizer, counts against the manifest), without
    reading the document indexes, 8 B a document (8 GB per rank at 10^9 documents): the index is read (np.fromfile)
    only for a shard with excluded documents, whose boundaries it needs, and never for training's reads."""
    read = []
    fromfile = np.fromfile
    monkeypatch.setattr(np, "fromfile", lambda path, *a, **k: read.append(Path(path).name) or fromfile(path, *a, **k))
    loader = ShardLoader(counting, seq_len=SEQ, batch_size=1)
    assert read == []
    for _ in range(loader.batches_per_epoch):
        loader.next_batch()
    assert read == []
    ShardLoader(counting, seq_len=SEQ, batch_size=1, exclude=EXCLUDE)
    assert sorted(read) == sorted(EXCLUDE)


def test_each_shard_is_checked_at_opening_by_one_rank_and_by_the_others_as_they_map_it(counting, monkeypatch):
    """Rank r checks train shards r, r + world_size, ... when it opens (every rank checking every shard opened 250,000
    files per rank at 10^12 tokens). Worked by hand on the counting set's 3 train shards: with 3 ranks each opens one
    header; with 2, rank 0 opens shards 0 and 2 and rank 1 shard 1. A shard rank 0 did not check is checked when it
    first maps it: truncated, rank 1 refuses at opening and rank 0 at its first read of it; listed with another count
    than it holds, the same, and counting what the run read (`exposure`) too."""
    import kiln.tokens.shard_format as shard_format

    opened = []
    read_header = shard_format.read_header
    monkeypatch.setattr(shard_format, "read_header", lambda path: opened.append(Path(path).name) or read_header(path))
    for rank in range(3):
        opened.clear()
        ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=rank, world_size=3)
        assert opened == [f"shard-0000{rank}.bin"]
    opened.clear()
    ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=0, world_size=2)
    assert opened == ["shard-00000.bin", "shard-00002.bin"]

    victim = counting / "shard-00001.bin"
    whole = victim.read_bytes()
    victim.write_bytes(whole[:-16])
    with pytest.raises(ShardError, match=r"shard-00001.bin is \d+ bytes but .* truncated or corrupt"):
        ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=1, world_size=2)
    rank_0 = ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=0, world_size=2)
    with pytest.raises(ShardError, match=r"shard-00001.bin is \d+ bytes but .* truncated or corrupt"):
        for _ in range(rank_0.batches_per_epoch):
            rank_0.next_batch()
    victim.write_bytes(whole)

    manifest = json.loads((counting / "_manifest.json").read_text())
    manifest["stats"]["shards"][1]["tokens"] = 776  # it holds 777
    (counting / "_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="holds 777 tokens / 2 documents but the manifest lists 776 / 2"):
        ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=1, world_size=2)
    altered = "holds 777 tokens of 2 B but the manifest lists 776 of 2 B: the dataset was altered after it was written"
    rank_0 = ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=0, world_size=2)
    with pytest.raises(ShardError, match=altered):  # and so does counting what the run read, from rank 0's loader
        list(rank_0.exposure())
    with pytest.raises(ShardError, match=altered):
        for _ in range(rank_0.batches_per_epoch):
            rank_0.next_batch()


def test_phases_are_read_in_order(tmp_path, monkeypatch):
    sources = [write_source(tmp_path, "web", make_texts("prose", 200, seed=1)),
               write_source(tmp_path, "code", make_texts("code", 80, seed=2), domain="code")]
    tok_dir = train_small_tokenizer(tmp_path, sources)
    mixture = Mixture(phases=[Phase(name="first", tokens=6_000, weights={"web": 1, "code": 0}),
                              Phase(name="second", tokens=6_000, weights={"web": 0, "code": 1})])
    writer = DatasetWriter(tmp_path / "ds", "token_shards", None)
    result = write_token_shards(sources, tok_dir, shard_settings(seq_len=SEQ, tokens_per_shard=1024), mixture,
                                writer, progress=False)
    path = commit(writer, result, monkeypatch)
    loader = ShardLoader(path, seq_len=SEQ, batch_size=4)
    first_phase = loader.phases[0].per_rank
    assert [p.name for p in loader.phases] == ["first", "second"]
    rows = np.concatenate(all_inputs(loader))
    fim = {4, 5, 6}  # the FIM symbols: only code documents carry them
    assert not fim & set(rows[:first_phase].reshape(-1).tolist())
    assert fim & set(rows[first_phase:].reshape(-1).tolist())


def test_validation_split_reads_validation_shards(dataset):
    path, result = dataset
    val = ShardLoader(path, split="val", seq_len=SEQ, batch_size=2, shuffle_epochs=False)
    assert val.sequences_per_epoch == (result.tokens("val") - 1) // SEQ
    assert np.array_equal(np.concatenate(all_inputs(val)).reshape(-1), stream(path, "val")[:val.tokens_per_epoch])


def test_loader_imports_only_numpy_torch_the_shard_format_and_splitmix():
    code = ("import sys, training_jobs.loader; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'pandas', 'pydantic', 'dagster', "
            "'sentencepiece', 'yaml') or (m.startswith('kiln.') and m not in ('kiln.tokens', "
            "'kiln.tokens.shard_format', 'kiln.common', 'kiln.common.splitmix')));"
            "print(bad); sys.exit(bool(bad))")  # kiln.tokens, kiln.common: packages whose __init__ is a docstring
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr


def test_many_shards_keep_few_maps_open(tmp_path):
    from kiln.tokens.shard_format import ShardInfo, describe_shard_set, write_shard
    infos = []
    for i in range(150):
        write_shard(tmp_path / f"shard-{i:05d}.bin", np.arange(i * 50, i * 50 + 50, dtype=np.uint16), np.array([0, 50]), SHA)
        infos.append(ShardInfo(f"shard-{i:05d}.bin", "train", "main", 0, 50, 1))
    (tmp_path / "_manifest.json").write_text(json.dumps({"stats": describe_shard_set(SHA, 60_000, 2, infos)}))
    loader = ShardLoader(tmp_path, seq_len=SEQ, batch_size=4)
    rows = np.concatenate(all_inputs(loader))
    assert np.array_equal(rows.reshape(-1), np.arange(len(rows) * SEQ))
    assert len(rows) == (150 * 50 - 1) // SEQ // 4 * 4
    assert loader._tokens.cache_info().currsize <= 64


# ------------------------------------------------------------------------------- excluded documents (replay)

# In `counting`, shard-00000 holds stream tokens 0..1000 (documents [0, 500) and [500, 1001)), shard-00002 the
# first 1500 tokens of phase b, 1778..3277 (documents [1778, 2528) and [2528, 3278)).
EXCLUDE = {"shard-00000.bin": [1], "shard-00002.bin": [0]}
FORBIDDEN = [(500, 1001), (1778, 2528)]


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("epoch", [0, 1])
def test_excluded_documents_are_never_read_and_nothing_else_is_lost(counting, world_size, epoch):
    """Worked by hand: sequence g of a phase reads stream tokens 16g..16g+16. Phase a (1778 tokens, 111
    sequences) loses g = 31..62 (31·16 + 16 = 512 is the first to reach 500, 62·16 = 992 the last to start before
    1001): 79 left. Phase b (1500 tokens, 93 sequences) loses g = 0..46 (46·16 = 736 < 750): 46 left."""
    loaders = [ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=r, world_size=world_size, seed=3,
                           exclude=EXCLUDE) for r in range(world_size)]
    firsts = []
    for loader in loaders:
        loader.load_state_dict({**loader.state_dict(), "epoch": epoch})
        for x, y in loader:
            read = np.concatenate([x[0].numpy(), y[0, -1:].numpy()])  # every token the step sees
            assert np.array_equal(read, read[0] + np.arange(SEQ + 1))
            assert not any(((read >= a) & (read < b)).any() for a, b in FORBIDDEN), read[0]
            firsts.append(int(read[0]))
    assert len(firsts) == len(set(firsts))  # still no sequence twice
    expected_a = [16 * g for g in range(111) if not 31 <= g <= 62]
    expected_b = [1778 + 16 * g for g in range(93) if g > 46]
    per_rank = lambda n: n - n % world_size  # noqa: E731: each phase drops its last count % world_size
    assert len(firsts) == per_rank(79) + per_rank(46) and set(firsts) <= set(expected_a + expected_b)
    if epoch == 0:  # file order: each phase's first sequences
        assert sorted(firsts) == expected_a[:per_rank(79)] + expected_b[:per_rank(46)]
    assert loaders[0].excluded == {"documents": 2, "tokens": 501 + 750, "sequences": 32 + 47}


def test_a_phase_the_exclusions_leave_too_short_for_every_rank_is_refused_naming_it(tmp_path):
    """Phase "short" holds 60 tokens, documents [0, 30) and [30, 60): (60 - 1) // 16 = 3 sequences, enough for 2
    ranks. Its first document excluded (a removal request on replayed shards), sequences 0 and 1 touch it (1·16 < 30),
    so 1 is left: it was cut for 2 ranks without a word (0 per rank, the phase never read), where a phase that short
    to begin with is refused. Refused now as well, naming the phase, the counts and the ways out; 1 rank reads it."""
    path = counting_set(tmp_path, [("main", 0, 1000, "train"), ("short", 1, 60, "train"), ("val", 0, 300, "val")])
    exclude = {"shard-00001.bin": [0]}
    assert [p.per_rank for p in ShardLoader(path, seq_len=SEQ, batch_size=1, world_size=2).phases] == [31, 1]
    with pytest.raises(ShardError, match=r"phase 'short': the excluded documents \(removal requests\) leave 1 of its "
                                         r"3 sequences of 16, fewer than one for each of 2 ranks.*never be trained "
                                         r"on; launch at most 1 ranks, lower training.seq_len.*mixture.replay"):
        ShardLoader(path, seq_len=SEQ, batch_size=1, rank=1, world_size=2, exclude=exclude)
    with pytest.raises(ShardError, match=r"leave 0 of its 3 sequences.*never be trained on; lower training.seq_len"):
        ShardLoader(path, seq_len=SEQ, batch_size=1, world_size=2, exclude={"shard-00001.bin": [0, 1]})
    alone = ShardLoader(path, seq_len=SEQ, batch_size=1, exclude=exclude)
    assert [p.per_rank for p in alone.phases] == [62, 1] and alone.excluded["sequences"] == 2
    assert alone.sequence(0, 62)[0] == 1000 + 2 * 16  # the short phase's one sequence left: its third


@given(st.integers(0, 300), st.lists(st.tuples(st.integers(-5, 320), st.integers(0, 40)), max_size=12))
def test_kept_sequences_number_the_sequences_outside_every_range_in_order(total, ranges):
    """Against a mask (the second implementation): overlapping, touching, empty and out-of-stream ranges, any order;
    the ranges are held merged, so memory follows the exclusions, not the stream."""
    lo = np.clip([a for a, _ in ranges], 0, total).astype(np.int64)
    hi = np.clip([a + n for a, n in ranges], 0, total).astype(np.int64)
    excluded = np.zeros(total, bool)
    for a, b in zip(lo, hi):
        excluded[a:b] = True
    expected = np.flatnonzero(~excluded)
    kept = KeptSequences(total, lo, hi)
    assert len(kept) == len(expected) and len(kept.lo) <= len(ranges)
    assert np.array_equal(kept.sequence(np.arange(len(expected))), expected)
    assert [int(kept.sequence(i)) for i in range(len(expected))] == expected.tolist()  # one int at a time too
    assert np.all(kept.lo[1:] > kept.hi[:-1])  # merged: disjoint, not touching, in order


def test_exclusions_for_another_shard_set_are_refused(counting):
    with pytest.raises(ShardError, match=r"name shard\(s\) \['shard-09999.bin'\]"):
        ShardLoader(counting, seq_len=SEQ, exclude={"shard-09999.bin": [0]})
    with pytest.raises(ShardError, match="include index 2, but the shard holds 2 documents"):
        ShardLoader(counting, seq_len=SEQ, exclude={"shard-00000.bin": [2]})
    state = ShardLoader(counting, seq_len=SEQ, batch_size=1).state_dict()
    with pytest.raises(ShardError, match="skipped 0 sequences for excluded documents, this one skips 79"):
        ShardLoader(counting, seq_len=SEQ, batch_size=1, exclude=EXCLUDE).load_state_dict(state)


def test_the_position_list_says_where_every_copy_of_a_document_sits(dataset):
    """positions-*.parquet against a second look: each listed place holds the document's own text tokenized
    (validation documents: plain text, no FIM), and every train copy the member list counts is listed."""
    import pyarrow.parquet as pq

    from kiln.tokens.tokenizer import Tokenizer

    path, result = dataset
    positions = pq.read_table(next(path.glob("positions-*.parquet"))).to_pylist()
    members = {m["doc_id"]: m for m in pq.read_table(next(path.glob("members-*.parquet"))).to_pylist()}
    train_shards = {s.path for s in result.shards if s.split == "train"}
    listed: dict[str, int] = {}
    for p in positions:
        if p["shard"] in train_shards:
            listed[p["doc_id"]] = listed.get(p["doc_id"], 0) + 1
    assert listed == {d: m["copies"] for d, m in members.items() if m["split"] == "train" and m["copies"]}
    texts = {}
    for part in sorted((path.parent.parent.parent).glob("*/part-*.parquet")):
        texts |= {r["doc_id"]: r["text"] for r in pq.read_table(part, columns=["doc_id", "text"]).to_pylist()}
    tok = Tokenizer.load(path.parent.parent.parent / "tokenizer")
    checked = 0
    for p in positions:
        if p["shard"] not in train_shards and p["doc_id"] in texts:
            shard = open_shard(path / p["shard"])
            assert shard.document(p["index"]).tolist() == tok.encode(texts[p["doc_id"]]) + [tok.eos_id]
            checked += 1
    assert checked == sum(1 for m in members.values() if m["split"] == "val") > 0


# The counting set's documents (two per shard), as stream token values: [start, end).
SPANS = {("shard-00000.bin", 0): (0, 500), ("shard-00000.bin", 1): (500, 1001), ("shard-00001.bin", 0): (1001, 1389),
         ("shard-00001.bin", 1): (1389, 1778), ("shard-00002.bin", 0): (1778, 2528),
         ("shard-00002.bin", 1): (2528, 3278)}


def exposure_table(loader) -> dict[tuple[str, int], tuple[int, int]]:
    return {(shard, i): (int(r[i]), int(t[i])) for shard, r, t in loader.exposure() for i in range(len(r))}


@pytest.mark.parametrize("world_size, expected", [
    # 40 sequences: inputs 0..639, last target 640
    (1, {("shard-00000.bin", 0): (1, 500), ("shard-00000.bin", 1): (1, 140)}),
    # 2 x 40 sequences: inputs 0..1279, last target 1280
    (2, {("shard-00000.bin", 0): (1, 500), ("shard-00000.bin", 1): (1, 501), ("shard-00001.bin", 0): (1, 279)})])
def test_exposure_partway_through_the_first_epoch_worked_by_hand(counting, world_size, expected):
    loader = ShardLoader(counting, seq_len=SEQ, batch_size=4, world_size=world_size, seed=5)
    for _ in range(10):
        loader.next_batch()
    assert (loader.epoch, loader.position) == (0, 40)
    assert exposure_table(loader) == {k: expected.get(k, (0, 0)) for k in SPANS}


def test_exposure_counts_a_document_whose_last_target_alone_was_read(counting):
    """With the first shard's document boundary at 512 instead of 500, 32 sequences (inputs 0..511, last target
    512) end exactly on it: the document after it is read once, through its first token (a target), with 0 input
    tokens."""
    from kiln.tokens.shard_format import write_shard
    write_shard(counting / "shard-00000.bin", np.arange(1001, dtype=np.uint16), np.array([0, 512, 1001]), SHA)
    loader = ShardLoader(counting, seq_len=SEQ, batch_size=4, seed=5)
    loader.load_state_dict({**loader.state_dict(), "position": 32})
    assert exposure_table(loader)[("shard-00000.bin", 0)] == (1, 512)
    assert exposure_table(loader)[("shard-00000.bin", 1)] == (1, 0)


def reads_from_batches(log, spans=SPANS) -> dict[tuple[str, int], tuple[int, int]]:
    """The second look: from the tokens the loaders handed out (token value = stream position), per epoch the
    documents any read token (inputs or the last target) falls in, and the input tokens in each."""
    touched: dict[int, set] = {}
    tokens = dict.fromkeys(spans, 0)
    for epoch, x, y in log:
        for row_x, row_y in zip(x.numpy(), y.numpy()):
            seen = np.concatenate([row_x, row_y[-1:]])
            for key, (a, b) in spans.items():
                if ((seen >= a) & (seen < b)).any():
                    touched.setdefault(epoch, set()).add(key)
                tokens[key] += int(((row_x >= a) & (row_x < b)).sum())
    return {k: (sum(k in t for t in touched.values()), tokens[k]) for k in spans}


def recorded(loader, log: list) -> None:
    """Log every batch a loader hands out, with the epoch it belongs to."""
    def next_batch(inner=loader.next_batch):
        x, y = inner()
        log.append((loader.epoch, x, y))
        return x, y
    loader.next_batch = next_batch


@pytest.mark.parametrize("world_size", [1, 2])
# An epoch is 102 batches of 2 on one rank (204 sequences), 50 on two (55 + 46 sequences a rank, cut to 100):
# stop partway through epoch 0, or partway through the shuffled epoch 1.
@pytest.mark.parametrize("epochs", [0.37, 1.6])
# Small: the read sequences looked up 7 slots at a time and their prefix sums kept every 8 sequences, not 2^16.
@pytest.mark.parametrize("small", [False, True])
def test_exposure_from_a_recorded_cursor_matches_what_the_ranks_read(counting, world_size, epochs, small, monkeypatch):
    if small:
        from training_jobs import loader as loader_module
        monkeypatch.setattr(loader_module, "_SLOTS", 7)
        monkeypatch.setattr(loader_module._ReadBits, "BLOCK", 8)
    log: list = []
    batches = int(epochs * (102 if world_size == 1 else 50))
    for rank in range(world_size):
        loader = ShardLoader(counting, seq_len=SEQ, batch_size=2, rank=rank, world_size=world_size, seed=5)
        recorded(loader, log)
        for _ in range(batches):
            loader.next_batch()
    assert loader.epoch == int(epochs) and 0 < loader.position < loader.sequences_per_epoch
    # A fresh rank-0 loader, told only the last cursor, answers for every rank.
    fresh = ShardLoader(counting, seq_len=SEQ, batch_size=2, world_size=world_size, seed=5)
    fresh.load_state_dict(loader.state_dict())
    got = exposure_table(fresh)
    assert got == reads_from_batches(log)
    assert sum(t for _, t in got.values()) == world_size * 2 * batches * SEQ  # every input token, once
    if epochs > 1:  # a whole epoch, then part of one: every document read once, then again
        assert {r for r, _ in got.values()} == {2}
        # phases in order: epoch 1 read all of phase a (its first document whole twice) and stopped in phase b
        assert got[("shard-00000.bin", 0)] == (2, 1000)
        assert all(b - a - SEQ < t < 2 * (b - a) - SEQ for (a, b), (_, t) in
                   [(SPANS[k], got[k]) for k in [("shard-00002.bin", 0), ("shard-00002.bin", 1)]])


@given(st.lists(st.booleans(), min_size=1, max_size=300), st.data())
def test_read_bits_give_the_prefix_sums_of_the_sequences_read(read, data):
    """_ReadBits against a plain cumsum of the same bits, blocks of 8 or 16 sequences, any window."""
    from training_jobs.loader import _ReadBits

    total = len(read) - 1  # the last stands for the never-read end: False
    read[-1] = False
    hit = np.array(read)
    before = np.concatenate([[0], np.cumsum(hit)])
    first = data.draw(st.integers(0, total), label="first")
    last = data.draw(st.integers(first, total), label="last")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_ReadBits, "BLOCK", data.draw(st.sampled_from([8, 16]), label="block"))
        bits = _ReadBits.of(total, [np.flatnonzero(hit[:len(read) // 2]), np.flatnonzero(hit)])
        got_before, got_hit = bits.window(first, last)
    assert got_before.tolist() == before[first:last + 1].tolist()
    assert got_hit.tolist() == hit[first:last + 1].astype(int).tolist()


@pytest.mark.parametrize("world_size", [1, 2])
def test_exposure_with_replay_and_exclusions(counting, world_size):
    """A quarter of the sequences replayed from a set with two documents excluded: the replay's reads are its own
    role's, the excluded documents are never read, and both loaders' counts match what they handed out."""
    from training_jobs.loader import ReplayLoader

    logs: dict[str, list] = {"train": [], "replay": []}
    for rank in range(world_size):
        main = ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=rank, world_size=world_size, seed=5)
        replay = ShardLoader(counting, seq_len=SEQ, batch_size=1, rank=rank, world_size=world_size, seed=5,
                             exclude=EXCLUDE)
        loader = ReplayLoader(main, replay, 0.25, batch_size=4)
        for role, part in loader.roles().items():
            recorded(part, logs[role])
        for _ in range(120):  # 480 sequences a rank: 120 replayed, past the replay's epoch of 79 + 46 (world 1)
            loader.next_batch()
    fresh = ReplayLoader(ShardLoader(counting, seq_len=SEQ, batch_size=1, world_size=world_size, seed=5),
                         ShardLoader(counting, seq_len=SEQ, batch_size=1, world_size=world_size, seed=5,
                                     exclude=EXCLUDE), 0.25, batch_size=4)
    fresh.load_state_dict(loader.state_dict())
    got = {role: exposure_table(part) for role, part in fresh.roles().items()}
    assert got == {role: reads_from_batches(log) for role, log in logs.items()}
    assert got["replay"][("shard-00000.bin", 1)] == got["replay"][("shard-00002.bin", 0)] == (0, 0)
    assert sum(t for _, t in got["replay"].values()) == world_size * 120 * SEQ
    assert sum(t for _, t in got["train"].values()) == world_size * 360 * SEQ


# ------------------------------------------------------------------------------------------ prefetching

def same_batch(got, want) -> bool:
    return torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_prefetcher_hands_out_the_same_batches_and_the_position_of_those_handed_out(counting):
    """300 batches (50 an epoch: six epochs, reshuffled) equal a plain loader's; its state is the plain loader's after
    as many batches, though the thread has read ahead; a fresh prefetcher resumed mid-stream (state through JSON,
    as checkpoints store it) and a running one rewound (as a rollback does) continue exactly."""
    from training_jobs.loader import Prefetcher

    kwargs = dict(seq_len=SEQ, batch_size=2, rank=1, world_size=2, seed=5)
    reference = ShardLoader(counting, **kwargs)
    expected, states = [], []
    for _ in range(300):
        expected.append(reference.next_batch())
        states.append(reference.state_dict())
    assert reference.epoch == 5

    prefetcher = Prefetcher(ShardLoader(counting, **kwargs), depth=2)
    try:
        for k in range(137):
            assert same_batch(prefetcher.next_batch(), expected[k]) and prefetcher.state_dict() == states[k], k
        deadline = time.monotonic() + 10
        while not prefetcher._queue.full():  # the thread reads two batches ahead ...
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # ... unseen (a third may be read, waiting for room in the queue)
        assert prefetcher.source.state_dict() in states[138:140] and prefetcher.state_dict() == states[136]
        prefetcher.load_state_dict(states[99])  # a rollback's rewind, while the thread runs
        assert all(same_batch(prefetcher.next_batch(), want) for want in expected[100:150])
    finally:
        prefetcher.close()
    assert prefetcher.source.state_dict() == states[149]  # closed: the source stands where batches were handed out

    resumed = Prefetcher(ShardLoader(counting, **kwargs))
    resumed.load_state_dict(json.loads(json.dumps(states[136])))
    try:
        assert all(same_batch(resumed.next_batch(), want) for want in expected[137:])
        assert resumed.state_dict() == states[-1]
    finally:
        resumed.close()


def test_the_prefetcher_reads_a_replay_mixture_unchanged(counting):
    from training_jobs.loader import Prefetcher, ReplayLoader

    def mixture():
        return ReplayLoader(ShardLoader(counting, seq_len=SEQ, batch_size=1, seed=5),
                            ShardLoader(counting, seq_len=SEQ, batch_size=1, seed=6, exclude=EXCLUDE), 0.25, 4)

    reference, prefetcher = mixture(), Prefetcher(mixture())
    try:
        for _ in range(120):  # past both loaders' first epoch
            assert same_batch(prefetcher.next_batch(), reference.next_batch())
        assert prefetcher.state_dict() == reference.state_dict()
    finally:
        prefetcher.close()


class FailsAtThree:
    """A source whose fourth batch cannot be read."""

    def __init__(self):
        self.read = 0

    def state_dict(self):
        return {"read": self.read}

    def load_state_dict(self, state):
        self.read = state["read"]

    def next_batch(self):
        if self.read == 3:
            raise ShardError("shard-00003.bin: read error")
        self.read += 1
        return torch.full((1, 2), self.read), torch.full((1, 2), -self.read)


def test_an_error_in_the_prefetch_thread_is_raised_at_its_batch():
    from training_jobs.loader import Prefetcher

    prefetcher = Prefetcher(FailsAtThree())
    assert [prefetcher.next_batch()[0].tolist() for _ in range(3)] == [[[1, 1]], [[2, 2]], [[3, 3]]]
    for _ in range(2):  # at the batch it failed on, and again after
        with pytest.raises(ShardError, match="read error"):
            prefetcher.next_batch()
    assert prefetcher._thread is None and prefetcher.state_dict() == {"read": 3}
    prefetcher.load_state_dict({"read": 0})  # a new position clears the error
    assert prefetcher.next_batch()[0].tolist() == [[1, 1]]
    prefetcher.close()


def test_a_prefetcher_dropped_without_close_stops_its_thread(counting):
    import gc

    from training_jobs.loader import Prefetcher

    prefetcher = Prefetcher(ShardLoader(counting, seq_len=SEQ, batch_size=2))
    prefetcher.next_batch()
    thread = prefetcher._thread
    del prefetcher
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


def _publish(store, path: Path, note: str) -> str:
    """The shards of `path` committed as another version of the store's token_shards (a note file makes it differ);
    its data version."""
    import shutil

    from kiln.common.manifest import MANIFEST_NAME

    stats = json.loads((path / MANIFEST_NAME).read_text())["stats"]
    with store.staging("token_shards") as writer:
        for f in path.iterdir():
            if f.name != MANIFEST_NAME:
                shutil.copy2(f, writer.dir / f.name)
        (writer.dir / "note.txt").write_text(note)
        return writer.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats).data_version


def test_a_loader_reads_its_version_while_the_dataset_is_materialized_again(dataset, tmp_path):
    """A training run's loader maps shards on demand, over hours. The dataset materialized again meanwhile (a
    second version published, the first due for removal at once: keep_replaced_s=0) does not change what the
    loader reads, nor remove its folder under it; once the loader is gone, the next commit removes it."""
    import gc

    from kiln.common.storage import Store

    path, result = dataset
    store = Store(tmp_path / "store", keep_replaced_s=0)
    _publish(store, path, "first")
    first = store.snapshot("token_shards").folder
    loader = ShardLoader(store.dataset_dir("token_shards"), seq_len=SEQ, batch_size=4, shuffle_epochs=False)
    _publish(store, path, "second")
    assert store.snapshot("token_shards").folder != first and first.is_dir()  # held: kept
    assert np.concatenate([x.numpy().ravel() for x, _ in loader]).tolist() == \
        np.concatenate(all_inputs(ShardLoader(path, seq_len=SEQ, batch_size=4, shuffle_epochs=False))).ravel().tolist()
    del loader
    gc.collect()
    _publish(store, path, "third")
    assert not first.exists()


def test_a_run_reads_the_version_it_was_set_up_on_or_refuses(dataset, tmp_path):
    """The training_run asset checks lineage and removal requests against one token_shards version and names it in
    the run config. A partition materialized again before a loader opens it is refused, by the training and the
    validation loader alike (validation errors are otherwise only warnings), not read unchecked. A run config that
    names no version gets the one rank 0 reads, for every rank and split."""
    from kiln.common.storage import Store
    from training_jobs.loader import DatasetReplaced
    from training_jobs.settings import TrainingSettings
    from training_jobs.setup import Dist, open_validation, pin_data_versions

    path, _ = dataset
    store = Store(tmp_path / "store")
    checked = _publish(store, path, "checked by the asset")
    stable = store.dataset_dir("token_shards")
    run = TrainingSettings(seq_len=SEQ, micro_batch_size=4).to_run_config(
        dataset_dir=stable, tokenizer_sha256="0" * 64, output_dir=tmp_path / "run", dataset_data_version=checked)
    assert ShardLoader(stable, seq_len=SEQ, batch_size=4, expected_data_version=checked).shard_set.data_version \
        == checked
    newer = _publish(store, path, "a takedown applied after the check")
    assert newer != checked
    with pytest.raises(DatasetReplaced, match=f"now version {newer}, this run was set up on version {checked}"):
        ShardLoader(stable, seq_len=SEQ, batch_size=4, expected_data_version=checked)
    one = Dist(0, 1, torch.device("cpu"))
    with pytest.raises(DatasetReplaced):
        open_validation(run, SEQ, one)
    assert pin_data_versions(run, one).dataset_data_version == checked  # the asset's stays
    unnamed = run.model_copy(update={"dataset_data_version": None})
    assert pin_data_versions(unnamed, one).dataset_data_version == newer


def _open_data_as_rank(rank: int, tmp_path: Path) -> None:
    """One rank of a two-process gloo world (torch.multiprocessing.spawn): open_data with this rank's run config;
    what happened goes to rank-<rank>.txt."""
    from training_jobs.settings import RunConfig
    from training_jobs.setup import Dist, open_data

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=rank,
                                         world_size=2)
    dist = Dist(rank, 2, torch.device("cpu"))
    try:
        train, _ = open_data(RunConfig.read(tmp_path / f"run-{rank}.json"), dist, dist)
        outcome = f"opened {train.shard_set.data_version}"
    except ShardError as exc:
        outcome = f"refused: {type(exc).__name__}: {exc}"
    (tmp_path / f"rank-{rank}.txt").write_text(outcome)
    torch.distributed.destroy_process_group()


def test_a_dataset_one_rank_refuses_is_refused_on_every_rank(dataset, tmp_path):
    """Each rank opens its loaders itself, so two ranks can see two versions (a partition materialized again between
    their opens). Here rank 1 expects the version before the newest, as if it had opened after a replacement: it
    refuses, and so does rank 0, with rank 1's reason, instead of training on into a collective rank 1 never joins
    (a Ray Train worker that refused returns: a restart would be refused again, training_jobs/ray_launch.py)."""
    from kiln.common.storage import Store
    from training_jobs.settings import TrainingSettings

    path, _ = dataset
    store = Store(tmp_path / "store")
    older = _publish(store, path, "what rank 1 expects")
    newer = _publish(store, path, "what rank 0 expects, the current one")
    for rank, version in enumerate((newer, older)):
        TrainingSettings(seq_len=SEQ, micro_batch_size=4).to_run_config(
            dataset_dir=store.dataset_dir("token_shards"), tokenizer_sha256=read_shard_set(path).tokenizer_sha256,
            output_dir=tmp_path / "run", dataset_data_version=version).write(tmp_path / f"run-{rank}.json")
    torch.multiprocessing.spawn(_open_data_as_rank, args=(tmp_path,), nprocs=2)
    reason = (f"refused: DatasetReplaced: {store.dataset_dir('token_shards')} is now version {newer}, this run was set "
              f"up on version {older}")
    assert [(tmp_path / f"rank-{rank}.txt").read_text().split(" (")[0] for rank in (0, 1)] == [reason, reason]


def test_a_shard_only_another_rank_checks_is_refused_on_every_rank(dataset, tmp_path):
    """Rank 1 alone checks the second train shard at opening; truncated, rank 0 refuses too, with rank 1's reason,
    before either trains."""
    import shutil

    from training_jobs.settings import TrainingSettings

    path, _ = dataset
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    victim = copy / read_shard_set(copy).split("train")[1].path
    victim.write_bytes(victim.read_bytes()[:-16])
    for rank in (0, 1):
        TrainingSettings(seq_len=SEQ, micro_batch_size=4).to_run_config(
            dataset_dir=copy, tokenizer_sha256=read_shard_set(copy).tokenizer_sha256,
            output_dir=tmp_path / "run").write(tmp_path / f"run-{rank}.json")
    torch.multiprocessing.spawn(_open_data_as_rank, args=(tmp_path,), nprocs=2)
    said = [(tmp_path / f"rank-{rank}.txt").read_text() for rank in (0, 1)]
    assert said[0] == said[1] and said[0].startswith(f"refused: ShardError: shard {victim} is ") \
        and "truncated or corrupt" in said[0], said


def test_a_checkpoint_resumes_only_on_the_version_its_loader_read(dataset, tmp_path):
    """A run without a pinned version (the CLI, a restart) that crashes, then finds its shards materialized again
    with the same number of sequences (here: the same tokens, another version): the checkpoint's position is in the
    old version, so the resume is refused, naming both. A state from before versions were recorded still loads, and
    the same version resumes where it stood."""
    from kiln.common.storage import Store
    from training_jobs.loader import DatasetReplaced

    path, _ = dataset
    store = Store(tmp_path / "store")
    old = _publish(store, path, "read before the crash")
    stable = store.dataset_dir("token_shards")
    before = ShardLoader(stable, seq_len=SEQ, batch_size=4)
    before.next_batch()
    state = before.state_dict()
    assert state["data_version"] == old and state["position"] == 4
    same = ShardLoader(stable, seq_len=SEQ, batch_size=4)
    same.load_state_dict(state)
    assert (same.epoch, same.position) == (0, 4)
    new = _publish(store, path, "materialized again while the run was down")
    after = ShardLoader(stable, seq_len=SEQ, batch_size=4)
    assert after.sequences_per_epoch == before.sequences_per_epoch  # the counts alone would not tell
    with pytest.raises(DatasetReplaced, match=f"read version {old} of the train shards, they are now version {new}"):
        after.load_state_dict(state)
    assert (after.epoch, after.position) == (0, 0)
    after.load_state_dict({k: v for k, v in state.items() if k != "data_version"})  # written before versions
    assert after.position == 4
