"""Compiled loops (numba) of `kiln.dedup.fast_minhash`: the same definitions, one pass per text instead of
numpy's many passes over temporary arrays (the signature stage's CPU per MB halved); and near dedup's verify
(`bucket_rounds.pair_jaccard`): one merge of two sorted shingle sets per candidate pair. Imported on first use only,
so a process that neither signs nor verifies does not pay numba's import. All arithmetic is on uint64 (mod 2^64, as the
scheme defines): every constant is a np.uint64, since numba turns mixed uint64/int64 arithmetic into float64.
Compiled code is cached next to this file (`cache=True`), so only a machine's first process compiles."""

from __future__ import annotations

import numba
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
_ONE = np.uint64(1)


@numba.njit(cache=True, inline="always")
def mix64(x):
    """`kiln.common.splitmix.mix64` of one uint64 (a copy: numba caches this module without looking at that one)."""
    x = x + _GOLDEN
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


@numba.njit(cache=True)
def word_hashes(data, starts, ends, base):
    """mix64(sum_k (data[s + k] + 1) * base^k) over each byte range [s, e)."""
    out = np.empty(starts.size, dtype=np.uint64)
    for w in range(starts.size):
        acc = np.uint64(0)
        power = np.uint64(1)
        for k in range(starts[w], ends[w]):
            acc += (np.uint64(data[k]) + _ONE) * power
            power *= base
        out[w] = mix64(acc)
    return out


@numba.njit(cache=True, inline="always")
def _rolled(word, poly, words, ring, slot, powers, inverse):
    """The polynomial of a text's last n words after `word` (`spaced_shingles`)."""
    n = ring.size
    if words < n:
        return poly + word * powers[words]
    return (poly - ring[slot]) * inverse + word * powers[n - 1]


@numba.njit(cache=True)
def spaced_shingles(data, ends, byte_map, n, word_base, shingle_base):
    """The shingle hashes of a chunk whose words are all spaced words (`fast_minhash._shingle_sets` without
    no-space characters), in one pass over its normalized bytes byte_map[data] (words split by a space; text t
    ends before the byte at ends[t]): every n consecutive words of a text, or all its words when it has fewer (none for
    a text without words), each mix64(sum_k word_hash_k * shingle_base^k) >> 32. Mapping each byte as it is read
    saves a pass and a copy of the chunk. The polynomial of a text's last n words is rolled from word to word
    (P' = (P - oldest) * shingle_base^-1 + newest * shingle_base^(n-1), the oldest kept in a ring): two
    multiplications a word instead of n, a quarter of the kernel's time. Returns (hashes text after text, count per
    text)."""
    texts = ends.size
    out = np.empty(data.size + texts, dtype=np.uint32)
    counts = np.zeros(texts, dtype=np.int64)
    ring = np.zeros(n, dtype=np.uint64)  # the text's last n word hashes; the oldest at `slot` once it has n words
    powers = np.empty(n, dtype=np.uint64)
    powers[0] = _ONE
    for k in range(1, n):
        powers[k] = powers[k - 1] * shingle_base
    inverse = shingle_base  # of an odd number mod 2^64, by Newton's iteration: 3 correct bits, doubled each time
    for _ in range(5):
        inverse *= np.uint64(2) - shingle_base * inverse
    k_out = 0
    start = 0
    for t in range(texts):
        end = ends[t]
        words, slot = 0, 0
        poly = np.uint64(0)
        acc = np.uint64(0)
        power = np.uint64(0)  # 0: between words (a power of an odd base is never 0)
        for i in range(start, end):
            b = byte_map[data[i]]
            if b != 0x20:
                if power == 0:
                    acc = np.uint64(0)
                    power = _ONE
                acc += (np.uint64(b) + _ONE) * power
                power *= word_base
            elif power != 0:
                word = mix64(acc)
                poly = _rolled(word, poly, words, ring, slot, powers, inverse)
                ring[slot] = word
                words += 1
                slot = slot + 1 if slot + 1 < n else 0
                power = np.uint64(0)
                if words >= n:  # the shingle of the last n words
                    out[k_out] = np.uint32(mix64(poly) >> _S32)
                    k_out += 1
        if power != 0:  # the text's end closes its last word
            word = mix64(acc)
            poly = _rolled(word, poly, words, ring, slot, powers, inverse)
            words += 1
            if words >= n:
                out[k_out] = np.uint32(mix64(poly) >> _S32)
                k_out += 1
        if 0 < words < n:  # one shingle of all the text's words
            out[k_out] = np.uint32(mix64(poly) >> _S32)
            k_out += 1
        counts[t] = max(words - n + 1, 1) if words else 0
        start = end + 1
    return out[:k_out], counts


@numba.njit(cache=True)
def sorted_unique_sets(bounds, hashes):
    """Each text's hashes[bounds[t]:bounds[t + 1]] sorted and unique: (values, text after text; counts per text).
    A stable radix sort of the whole chunk by hash (11 + 11 + 10 bits), then by text (counting sort): linear
    time, ~3x a comparison sort of each text's hashes."""
    texts = bounds.size - 1
    n = hashes.size
    keys = hashes.copy()
    owner = np.empty(n, dtype=np.int32)
    for t in range(texts):
        owner[bounds[t]:bounds[t + 1]] = t
    keys2 = np.empty(n, dtype=np.uint32)
    owner2 = np.empty(n, dtype=np.int32)
    for shift in (0, 11, 22):
        count = np.zeros(2049, dtype=np.int64)
        for i in range(n):
            count[((keys[i] >> shift) & 2047) + 1] += 1
        for d in range(2048):
            count[d + 1] += count[d]
        for i in range(n):
            d = (keys[i] >> shift) & 2047
            at = count[d]
            keys2[at] = keys[i]
            owner2[at] = owner[i]
            count[d] = at + 1
        keys, keys2 = keys2, keys
        owner, owner2 = owner2, owner
    at = bounds[:-1].copy()  # by text, stable: each text's run sorted by hash
    for i in range(n):
        t = owner[i]
        keys2[at[t]] = keys[i]
        at[t] += 1
    out = np.empty(n, dtype=np.uint32)
    counts = np.zeros(texts, dtype=np.int64)
    k = 0
    for t in range(texts):
        for i in range(bounds[t], bounds[t + 1]):
            if i == bounds[t] or keys2[i] != keys2[i - 1]:
                out[k] = keys2[i]
                k += 1
                counts[t] += 1
    return out[:k], counts


@numba.njit(cache=True)
def sketches(bounds, shingles, num_perm, key):
    """Fast similarity sketching (`fast_minhash.similarity_sketches`), text by text: rounds r = 0, 1, ... until
    every bin holds a draw (a later round cannot beat an earlier one), each bin keeping the smallest
    (round, low 32 bits of h); a text without shingles keeps every bin empty (all ones)."""
    texts = bounds.size - 1
    perm = np.uint64(num_perm)
    out = np.empty((texts, num_perm), dtype=np.uint32)
    best = np.empty(num_perm, dtype=np.uint64)
    for t in range(texts):
        a, b = bounds[t], bounds[t + 1]
        best[:] = _EMPTY
        filled = 0
        if a < b:
            for r in range(2 * num_perm):
                shifted = np.uint64(r) << _S32
                for i in range(a, b):
                    keyed = np.uint64(shingles[i]) ^ key
                    h = mix64(keyed ^ shifted)
                    if r < num_perm:
                        cell = ((h >> _S32) * perm) >> _S32
                    else:  # from round num_perm on: the next bin after round num_perm's
                        start = ((mix64(keyed ^ (perm << _S32)) >> _S32) * perm) >> _S32
                        cell = (start + np.uint64(r - num_perm)) % perm
                    value = shifted | (h & _LOW32)
                    if value < best[cell]:
                        if best[cell] == _EMPTY:
                            filled += 1
                        best[cell] = value
                if filled == num_perm:
                    break
        for j in range(num_perm):
            out[t, j] = np.uint32(best[j] & _LOW32)
    return out


@numba.njit(cache=True)
def sets_sorted(values, offsets):
    """Whether every set values[offsets[i]:offsets[i + 1]] is strictly increasing (sorted and unique)."""
    for i in range(offsets.size - 1):
        for k in range(offsets[i] + 1, offsets[i + 1]):
            if values[k] <= values[k - 1]:
                return False
    return True


@numba.njit(cache=True)
def pair_intersections(a_values, a_offsets, b_values, b_offsets, b_rows):
    """|A_i & B_b_rows[i]| for each pair i (A_i = a_values[a_offsets[i]:a_offsets[i + 1]], B_r likewise), every
    set strictly increasing: one merge of the two sets, linear in their sizes."""
    out = np.empty(b_rows.size, dtype=np.int64)
    for i in range(b_rows.size):
        x, x_end = a_offsets[i], a_offsets[i + 1]
        y, y_end = b_offsets[b_rows[i]], b_offsets[b_rows[i] + 1]
        inter = 0
        while x < x_end and y < y_end:
            u, v = a_values[x], b_values[y]
            if u < v:
                x += 1
            elif v < u:
                y += 1
            else:
                inter += 1
                x += 1
                y += 1
        out[i] = inter
    return out
