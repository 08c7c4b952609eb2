"""The vectorized signer (SCHEME_FAST) against a plain Python implementation of the same definitions, and
its LSH quality against the S-curve and datasketch.

The reference below is written from the definitions in `kiln/dedup/fast_minhash.py` with integers and loops
only (no numpy, none of the fast path's helpers): words from `normalized_words`, word and shingle hashes as
polynomials mod 2^64 finished by splitmix64, fast similarity sketching round by round.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasketch import MinHash
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.common.config import NearDedup, ShingleNormalization
from kiln.common.text_units import NO_SPACE_BLOCKS
from kiln.dedup import fast_minhash, minhash, signing
from kiln.dedup.fast_minhash import SHINGLE_BASE, WORD_BASE, sign_batch, similarity_sketches
from kiln.dedup.lsh import candidate_probability, choose_bands
from kiln.dedup.minhash import SCHEME, SCHEME_FAST, jaccard, sign_texts
from kiln.dedup.text import normalized_words

M64 = 1 << 64


# ---------------------------------------------------------------------------------------- reference

def ref_mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) % M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % M64
    return x ^ (x >> 31)


def ref_polynomial(values: list[int], base: int) -> int:
    return sum(v * pow(base, k, M64) for k, v in enumerate(values)) % M64


@lru_cache(maxsize=None)
def ref_word_hash(word: str) -> int:
    return ref_mix64(ref_polynomial([b + 1 for b in word.encode("utf-8", "surrogatepass")], WORD_BASE))


def ref_is_unit(word: str) -> bool:
    return any(a <= ord(word[0]) <= b for a, b, _ in NO_SPACE_BLOCKS) and word[0].isalnum()


# Thai, Lao, Tibetan, Myanmar, Khmer (+ symbols), Tai Le, New Tai Lue, Tai Tham, Myanmar Extended-A/B, Tai Viet: a
# letter there weighs 1/4 of a word (2 of 8), a Han character or kana 5/8.
REF_ABUGIDA = ((0x0E00, 0x0FFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x1950, 0x19FF), (0x1A20, 0x1AAF),
               (0xA9E0, 0xA9FF), (0xAA60, 0xAADF))


def ref_weight(word: str) -> int:
    if not ref_is_unit(word):
        return 8
    return 2 if any(a <= ord(word[0]) <= b for a, b in REF_ABUGIDA) else 5


def ref_shingles(text: str, near: NearDedup) -> list[int]:
    """Shingles: from each word, the words up to the first that brings the weight to n words (a Han character or kana
    weighs 5/8 of a word, a Thai, Khmer ... letter 1/4); no start reaches it: one shingle of all the words (no words:
    no shingles)."""
    words, n = normalized_words(text, near.normalization), near.shingle_size
    grams = []
    for i in range(len(words)):
        weight = 0
        for j in range(i, len(words)):
            weight += ref_weight(words[j])
            if weight >= 8 * n:
                grams.append(words[i:j + 1])
                break
    grams = grams or ([words] if words else [])
    return sorted({ref_mix64(ref_polynomial([ref_word_hash(w) for w in g], SHINGLE_BASE)) >> 32 for g in grams})


def ref_bin(h: int, num_perm: int) -> int:
    return (h >> 32) * num_perm >> 32


def ref_signature(shingles: list[int], num_perm: int, seed: int) -> list[int]:
    key = ref_mix64(seed % M64)
    best: list[tuple[int, int] | None] = [None] * num_perm
    for r in range(2 * num_perm):
        for x in shingles:
            h = ref_mix64(((r << 32) | x) ^ key)
            if r < num_perm:
                b = ref_bin(h, num_perm)
            else:  # walk the bins from where round num_perm put x
                b = (ref_bin(ref_mix64(((num_perm << 32) | x) ^ key), num_perm) + r - num_perm) % num_perm
            if best[b] is None or (r, h & 0xFFFFFFFF) < best[b]:
                best[b] = (r, h & 0xFFFFFFFF)
        if None not in best:
            break  # a later round cannot beat an earlier one
    return [0xFFFFFFFF if b is None else b[1] for b in best]  # an empty set leaves every bin empty: all ones


def assert_matches_reference(texts: list[str], near: NearDedup) -> None:
    signatures, values, offsets = sign_batch(texts, near)
    assert signatures.shape == (len(texts), near.num_perm) and signatures.dtype == np.uint32
    assert values.dtype == np.uint32 and offsets.dtype == np.int64 and offsets[0] == 0
    for i, text in enumerate(texts):
        expected = ref_shingles(text, near)
        assert values[offsets[i]:offsets[i + 1]].tolist() == expected, repr(text[:200])
        assert signatures[i].tolist() == ref_signature(expected, near.num_perm, near.seed), repr(text[:200])


# ------------------------------------------------------------------------------------ bit for bit

NORMALIZATIONS = [ShingleNormalization(),
                  ShingleNormalization(lowercase=False, strip_punctuation=False, digits="keep"),
                  ShingleNormalization(digits="remove"),
                  ShingleNormalization(strip_punctuation=False, digits="remove")]

HAND_PICKED = [
    "", " ", "\n\n", "!!! ... ???", "word", "two words", "one two three four", "one two three four five",
    "The quick brown fox jumps over the lazy dog, again and again: 1984 and 2024.",
    "ΟΔΟΣ ΑΣ σ Σ aΣ1b aΣ1 Σ1", "İstanbul KELVIN \u212a ß ǅ ﬁ", "a\u0307b e\u0301 \u0345",
    "lone \ud800 surrogate \udfff", "a\ud83d\ude00b pair as two code points", "emoji 😀😀 mid😀word",
    "\x00a\x00 nul", "tab\tsep\x1cfile\x1dgroup\x85next\xa0nbsp\u2028line\u3000ideographic",
    "١٢٣ ٤٥٦ arabic digits ۱۲", "ＡＢＣ ｆｕｌｌ１２ width", "日本語のテキスト 中文文本 한국어 텍스트",
    "under_score snake_case __dunder__ 0x1F v1.2.3", "12345 67890 000", "A" * 5000,
    "word " * 3000, " ".join(f"w{i}" for i in range(2000)),
]


@pytest.mark.parametrize("norm", NORMALIZATIONS, ids=lambda n: f"{n.lowercase}-{n.strip_punctuation}-{n.digits}")
@pytest.mark.parametrize("shingle_size", [1, 2, 5])
def test_hand_picked_texts_match_the_reference(norm, shingle_size):
    assert_matches_reference(HAND_PICKED, NearDedup(shingle_size=shingle_size, num_perm=32, normalization=norm))


def test_default_settings_and_other_seeds_match_the_reference():
    for seed in (1, 0, -7, 2**40 + 3):
        assert_matches_reference(HAND_PICKED[:12], NearDedup(seed=seed))
    assert_matches_reference(HAND_PICKED[:6], NearDedup(num_perm=1024, shingle_size=3))
    assert_matches_reference(HAND_PICKED[:6], NearDedup(num_perm=100, shingle_size=3))  # not a power of two


def test_a_very_long_text_matches_the_reference():
    rng = np.random.default_rng(3)
    vocab = ["alpha", "Beta", "γάμμα", "δ1", "x" * 40_000, "\ud834", "ǈ", "naïve", "2024"]
    text = " ".join(vocab[i] for i in rng.integers(0, len(vocab), 3000)) + " " + "y" * 100_000
    assert_matches_reference([text, "short", text[:7000]], NearDedup())


CHARACTERS = st.one_of(
    st.sampled_from(list(" \t\n.,;:!?'\"-_0123456789") + ["Σ", "σ", "ς", "İ", "ß", "\u212a", "\u0307", "\ud800",
                                                          "\udc00", "😀", "ǅ", "١", "Ａ", "\x00", "\x1c", "\xa0"]),
    st.characters(codec=None, exclude_categories=()),  # any code point, lone surrogates included
    st.characters(min_codepoint=ord("A"), max_codepoint=ord("z")),
)
NEARS = st.builds(
    NearDedup, shingle_size=st.integers(1, 6), num_perm=st.sampled_from([16, 32, 128]), seed=st.integers(-5, 2**33),
    normalization=st.builds(ShingleNormalization, lowercase=st.booleans(), strip_punctuation=st.booleans(),
                            digits=st.sampled_from(["keep", "zero", "remove"])))


@settings(max_examples=120, deadline=None)
@given(st.lists(st.text(alphabet=CHARACTERS, max_size=120), min_size=1, max_size=6), NEARS)
def test_generated_texts_match_the_reference(texts, near):
    assert_matches_reference(texts, near)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["a", "B", "ΣΑΣ", "x1", "9", "\ud800", "ﬁ", "e\u0301", "__"]), max_size=60),
       st.lists(st.sampled_from([" ", "\n", ", ", "-", "\u3000"]), min_size=1, max_size=4), NEARS)
def test_generated_word_sequences_match_the_reference(words, separators, near):
    text = "".join(w + separators[i % len(separators)] for i, w in enumerate(words))
    assert_matches_reference([text, text.upper(), text[: len(text) // 2]], near)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=CHARACTERS, max_size=200), NEARS)
def test_the_fast_word_view_is_normalized_words(text, near):
    data = fast_minhash._normalized_bytes([text, "next text"], near.normalization)[0].tobytes()
    first, second, end = data.split(b"\n")
    norm = near.normalization
    assert first.split() == [w.encode("utf-8", "surrogatepass") for w in normalized_words(text, norm)]
    assert second.split() == [w.encode() for w in normalized_words("next text", norm)] and end == b""


def test_a_text_signs_the_same_alone_in_any_batch_and_across_chunks(monkeypatch):
    near = NearDedup(num_perm=64)
    texts = [t for t in HAND_PICKED if len(t) < 1000] * 3
    together = sign_batch(texts, near)
    monkeypatch.setattr(fast_minhash, "_CHUNK_CHARS", 40)
    monkeypatch.setattr(fast_minhash, "_CHUNK_TEXTS", 3)
    chunked = sign_batch(texts, near)
    assert all(np.array_equal(a, b) for a, b in zip(together, chunked))
    for i, text in enumerate(texts[:10]):
        sig, values, _ = sign_batch([text], near)
        assert np.array_equal(sig[0], together[0][i])
        assert np.array_equal(values, together[1][together[2][i]:together[2][i + 1]])


def test_a_varied_batch_matches_the_reference_and_sketches_take_shingles_in_any_order():
    """Batches of texts from 0 to 1,500 words (so per-text round counts from 1 to 2 num_perm) against the reference:
    ASCII only (one byte table instead of the code point map and str.lower), spaced words only (the compiled
    one-pass shingler), and with no-space characters and combining marks mixed in; the sketch of shingles given out
    of text order, and of a text with no shingles (every bin empty: all ones)."""
    rng = np.random.default_rng(36)
    ascii_words = ["alpha", "Beta", "X1", "2024", "_", "don't", "a-b", "\t", "\x00", "~"]
    spaced = ascii_words + ["e\u0301", "ΣΑΣ", "😀", "क्ष"]
    near = NearDedup(num_perm=64, seed=5)
    for vocab in (ascii_words, spaced, spaced + ["日本", "語", "ไทย"]):
        texts = [" ".join(rng.choice(vocab, size=n)) for n in (0, 1, 2, 4, 5, 9, 40, 300, 1500)]
        for norm in NORMALIZATIONS if vocab is ascii_words else NORMALIZATIONS[:1]:
            assert_matches_reference(texts, near.model_copy(update={"normalization": norm}))
    signatures, values, offsets = sign_batch(texts, near)
    text_of = np.repeat(np.arange(len(texts)), np.diff(offsets))
    order = rng.permutation(values.size)
    assert np.array_equal(similarity_sketches(text_of[order], values[order], len(texts), 64, 5), signatures)
    lone = similarity_sketches(np.array([0]), np.array([7], np.uint32), 2, 16, 1)
    assert lone[0].tolist() == ref_signature([7], 16, 1) and lone[1].tolist() == [0xFFFFFFFF] * 16


def test_an_empty_batch():
    signatures, values, offsets = sign_batch([], NearDedup())
    assert signatures.shape == (0, 128) and values.size == 0 and offsets.tolist() == [0]


def test_the_scheme_is_chosen_by_a_parameter_or_by_dedup_near_scheme_whose_default_is_the_fast_one():
    texts = HAND_PICKED[:10]
    assert NearDedup().scheme == SCHEME_FAST
    old = sign_texts(texts, NearDedup(scheme=SCHEME))
    for i, text in enumerate(texts):
        sh = minhash.shingle_hashes(text, NearDedup())
        assert np.array_equal(old[1][old[2][i]:old[2][i + 1]], sh)
        assert np.array_equal(old[0][i], minhash.signature(sh, 128, 1))
    fast = sign_batch(texts, NearDedup())
    for got in (sign_texts(texts, NearDedup()), sign_texts(texts, NearDedup(scheme=SCHEME), SCHEME_FAST)):
        assert all(np.array_equal(a, b) for a, b in zip(got, fast))
    assert sign_texts(texts, NearDedup(), SCHEME)[1].tolist() == old[1].tolist()
    with pytest.raises(ValueError, match="unknown signature scheme"):
        sign_texts(texts, NearDedup(), "md5")


@pytest.mark.parametrize("scheme", [SCHEME_FAST, SCHEME])
def test_signatures_recomputed_from_stored_shingle_sets_equal_those_signed_from_the_texts(scheme, monkeypatch):
    near = NearDedup(num_perm=64, scheme=scheme)
    texts = HAND_PICKED * 2
    signatures, values, offsets = sign_texts(texts, near)
    assert np.array_equal(minhash.sign_shingles(values, offsets, near), signatures)
    monkeypatch.setattr(minhash, "_CHUNK_CHARS", 50)  # many chunks of a few sets
    monkeypatch.setattr(minhash, "_CHUNK_TEXTS", 3)
    assert np.array_equal(minhash.sign_shingles(values, offsets, near), signatures)


# ------------------------------------------------------------------------------------- signature stage

def _valid(texts: list[str]) -> list[str]:
    """Texts Parquet can hold (no lone surrogates: intake quarantines those)."""
    return [t for t in texts if t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t)]


def _documents(path, texts: list[str]) -> None:
    from kiln.curation.documents import DOCUMENT_SCHEMA, Document

    pq.write_table(pa.Table.from_pylist([Document(f"d{i}", "web", t).to_row() for i, t in enumerate(texts)],
                                        schema=DOCUMENT_SCHEMA), path)


@pytest.mark.parametrize("rows", [2048, 7])
def test_the_signature_stage_writes_sign_batch_output_under_the_default_config(tmp_path, monkeypatch, rows):
    """compute_signatures signs whole batches (`rows` documents at a time, so several batches and a short last one
    at 7); each row's signature and sorted unique shingle set are sign_batch's (itself checked against the plain
    Python reference above) for that text."""
    monkeypatch.setattr(signing, "_SIGN_ROWS", rows)
    near = NearDedup()
    texts = _valid(HAND_PICKED) * 3 + ["", "short text"]
    _documents(tmp_path / "in.parquet", texts)
    n = signing.compute_signatures([[tmp_path / "in.parquet"]], [tmp_path / "sig.parquet"], near,
                                   progress=False).documents
    table = pq.read_table(tmp_path / "sig.parquet")
    assert n == len(texts) == table.num_rows
    assert table.schema.equals(minhash.signature_schema(near.num_perm))
    signatures, values, offsets = sign_batch(texts, near)
    assert table.column("doc_id").to_pylist() == [f"d{i}" for i in range(len(texts))]
    assert table.column("source").to_pylist() == ["web"] * len(texts)
    assert table.column("chars").to_pylist() == [len(t) for t in texts]
    got = table.column("signature").to_pylist()
    # Each set stored as its uint32 hashes' little-endian bytes (minhash.SHINGLES_TYPE), read here by hand.
    shingles = [np.frombuffer(b, "<u4").tolist() for b in table.column("shingles").to_pylist()]
    for i, text in enumerate(texts):
        assert got[i] == signatures[i].tolist()
        assert shingles[i] == values[offsets[i]:offsets[i + 1]].tolist() == sorted(set(shingles[i]))
        if i < 10:
            assert shingles[i] == ref_shingles(text, near)


def test_the_signature_stage_under_affine32_is_the_per_document_datasketch_path(tmp_path, monkeypatch):
    monkeypatch.setattr(signing, "_SIGN_ROWS", 5)
    near = NearDedup(scheme=SCHEME)
    texts = _valid(HAND_PICKED)[:12]
    _documents(tmp_path / "in.parquet", texts)
    signing.compute_signatures([[tmp_path / "in.parquet"]], [tmp_path / "sig.parquet"], near, progress=False)
    table = pq.read_table(tmp_path / "sig.parquet")
    for i, text in enumerate(texts):
        sh = minhash.shingle_hashes(text, near)
        assert np.frombuffer(table.column("shingles")[i].as_py(), "<u4").tolist() == sh.tolist()
        assert table.column("signature")[i].as_py() == minhash.signature(sh, near.num_perm, near.seed).tolist()


def test_an_empty_part_signs_to_an_empty_table(tmp_path):
    _documents(tmp_path / "in.parquet", [])
    n = signing.compute_signatures([[tmp_path / "in.parquet"]], [tmp_path / "sig.parquet"], NearDedup(),
                                   progress=False).documents
    table = pq.read_table(tmp_path / "sig.parquet")
    assert n == 0 == table.num_rows and table.schema.equals(minhash.signature_schema(128))


def test_jaccard_on_fast_shingle_sets_is_exact():
    near = NearDedup()
    base = " ".join(f"word{i % 97} token{i % 13}" for i in range(400))
    variants = [base, base.replace("word5 ", "edited "), base[:1500], base.upper()]
    _, values, offsets = sign_batch(variants, near)
    for i in range(len(variants)):
        for j in range(len(variants)):
            a, b = set(ref_shingles(variants[i], near)), set(ref_shingles(variants[j], near))
            got = jaccard(values[offsets[i]:offsets[i + 1]], values[offsets[j]:offsets[j + 1]])
            assert got == len(a & b) / len(a | b)


# ------------------------------------------------------------------------------------------ quality

def planted_pairs(rng, pairs: int, common: int, only: int) -> tuple[np.ndarray, np.ndarray]:
    """Shingle sets built directly: each pair shares `common` values and has `only` of its own on each side,
    so its Jaccard is exactly common / (common + 2 only)."""
    v = rng.integers(0, 2**32, (pairs, common + 2 * only), dtype=np.uint64).astype(np.uint32)
    while len(repeated := np.flatnonzero((np.diff(np.sort(v, axis=1), axis=1) == 0).any(axis=1))):
        v[repeated] = rng.integers(0, 2**32, (len(repeated), v.shape[1]), dtype=np.uint64).astype(np.uint32)
    a = v[:, :common + only]
    b = np.concatenate([v[:, :common], v[:, common + only:]], axis=1)
    return a, b


def fast_signatures(sets: np.ndarray, num_perm: int, seed: int = 1) -> np.ndarray:
    text_of = np.repeat(np.arange(len(sets)), sets.shape[1])
    return similarity_sketches(text_of, sets.reshape(-1), len(sets), num_perm, seed)


def datasketch_signatures(sets: np.ndarray, num_perm: int, seed: int = 1) -> np.ndarray:
    out = []
    for s in sets:
        m = MinHash(num_perm=num_perm, seed=seed, hashfunc=int)
        m.update_batch(s.tolist())
        out.append(m.hashvalues.astype(np.uint32))
    return np.array(out)


def check_s_curve(sig_a: np.ndarray, sig_b: np.ndarray, common: int, only: int, bands: int, rows: int,
                  independent_rows: bool) -> None:
    """Each position agrees with probability j (the mean agreement is within 4.5 standard errors of j); each band
    collides with probability j^rows, and a pair is a candidate with the S-curve's probability, within 4.5
    binomial standard deviations.

    A sketch whose bins hold distinct elements samples without replacement: a band then collides with a
    probability between prod_k (i - k) / (u - k) (i shared of u elements) and j^rows, a little below j^rows for
    small sets (and its bands are a little less correlated, so candidates come a little more often than the
    S-curve says). Independent permutations (datasketch) are held to j^rows and the S-curve exactly."""
    pairs, j = len(sig_a), common / (common + 2 * only)
    agree = sig_a == sig_b
    estimates = agree.mean(axis=1)
    assert abs(estimates.mean() - j) <= 4.5 * estimates.std() / np.sqrt(pairs)
    band_hits = agree[:, :bands * rows].reshape(pairs, bands, rows).all(axis=2)
    p_band = j ** rows
    lowest = p_band if independent_rows else np.prod([(common - k) / (common + 2 * only - k) for k in range(rows)])
    tolerance = 4.5 * np.sqrt(p_band * (1 - p_band) / pairs)
    assert np.all((band_hits.mean(axis=0) >= lowest - tolerance) & (band_hits.mean(axis=0) <= p_band + tolerance))
    p_candidate = candidate_probability(j, bands, rows)
    tolerance = 4.5 * np.sqrt(p_candidate * (1 - p_candidate) / pairs)
    assert band_hits.any(axis=1).mean() >= p_candidate - tolerance
    if independent_rows:
        assert band_hits.any(axis=1).mean() <= p_candidate + tolerance


# (common, only): Jaccard 0.8 (the default threshold) on tiny to large sets, and below it.
# Many pairs where a fixed pattern across bins would show (tiny sets), fewer where each pair costs more.
PLANTED = [(8, 1, 20_000), (40, 5, 10_000), (160, 20, 6_000), (800, 100, 3_000), (120, 40, 5_000), (100, 50, 5_000)]


@pytest.mark.parametrize("common, only, pairs", PLANTED)
def test_lsh_bands_catch_pairs_as_the_s_curve_says(common, only, pairs):
    near = NearDedup()
    bands, rows = choose_bands(near.num_perm, near.threshold, near.min_recall)
    a, b = planted_pairs(np.random.default_rng(common), pairs, common, only)
    check_s_curve(fast_signatures(a, near.num_perm), fast_signatures(b, near.num_perm), common, only, bands, rows,
                  independent_rows=False)


@pytest.mark.parametrize("common, only", [(40, 5), (160, 20)])
def test_datasketch_passes_the_same_s_curve_check(common, only):
    """The reference implementation (independent permutations) under the same check: the check is fair."""
    near = NearDedup()
    bands, rows = choose_bands(near.num_perm, near.threshold, near.min_recall)
    a, b = planted_pairs(np.random.default_rng(common + 1), 1_500, common, only)
    check_s_curve(datasketch_signatures(a, near.num_perm), datasketch_signatures(b, near.num_perm), common, only,
                  bands, rows, independent_rows=True)


def test_recall_at_the_threshold_is_at_least_min_recall():
    """A precise measurement at the threshold: 30,000 pairs of 45-shingle sets with Jaccard exactly 0.8."""
    near = NearDedup()
    bands, rows = choose_bands(near.num_perm, near.threshold, near.min_recall)
    a, b = planted_pairs(np.random.default_rng(11), 30_000, 40, 5)
    agree = fast_signatures(a, near.num_perm) == fast_signatures(b, near.num_perm)
    recall = agree[:, :bands * rows].reshape(len(a), bands, rows).all(axis=2).any(axis=1).mean()
    assert recall >= near.min_recall


def test_curated_parts_are_joined_into_signature_parts_in_order(tmp_path):
    """Parts of 3, 0, 4, 2, 6 and 1 documents, joined until a group holds at least 5: 3+0+4 = 7, then 2+6 = 8, then
    the last 1 alone. Each group signs to one part holding its documents in order, as each part alone would."""
    texts = _valid(HAND_PICKED)
    sizes, parts, start = [3, 0, 4, 2, 6, 1], [], 0
    for i, n in enumerate(sizes):
        parts.append(tmp_path / f"part-{i}.parquet")
        _documents(parts[-1], texts[start:start + n])
        start += n
    groups = signing.signature_groups(parts, 5)
    assert groups == [tuple(parts[:3]), tuple(parts[3:5]), (parts[5],)]
    outputs = [tmp_path / f"sig-{g}.parquet" for g in range(len(groups))]
    signed = signing.compute_signatures(groups, outputs, NearDedup(), progress=False)
    assert signed.documents == sum(sizes)
    assert [pq.ParquetFile(o).metadata.num_rows for o in outputs] == [7, 8, 1]
    one_each = [tmp_path / f"alone-{i}.parquet" for i in range(len(parts))]
    signing.compute_signatures([[p] for p in parts], one_each, NearDedup(), progress=False)
    assert pa.concat_tables(map(pq.read_table, outputs)).equals(pa.concat_tables(map(pq.read_table, one_each)))
    # Distinct shingles per document, as the asset's metadata reports their median.
    lengths = pa.concat_tables(map(pq.read_table, outputs)).column("shingles").to_pylist()
    assert signed.median_shingles() == float(np.median([len(s) // 4 for s in lengths]))  # 4 bytes a shingle
