"""splitmix64 (Steele, Lea & Flood 2014; Vigna's splitmix64.c): the one 64-bit integer mix Kiln hashes with. MinHash
words and shingles, near dedup's bucket keys and partitions, token_shards' shuffle keys and the loader's shuffled
epochs all go through it, so they agree on one definition; their outputs are stored, so it never changes.

numpy only: the training loader imports it in processes that import nothing else of Kiln's. The compiled signature
loops keep a numba copy (`kiln.dedup._kernels.mix64`, checked equal by the tests): numba's cache would not see a change
to a function of another module."""

from __future__ import annotations

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment, 2^64 / φ made odd
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK = (1 << 64) - 1
_U64 = np.uint64


def finalize(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of a uint64 array, wrapping mod 2^64: a bijection whose every output bit depends on
    every input bit."""
    x = (x ^ (x >> _U64(30))) * _U64(_M1)
    x = (x ^ (x >> _U64(27))) * _U64(_M2)
    return x ^ (x >> _U64(31))


def finalize_int(x: int) -> int:
    """`finalize` of one Python int in [0, 2^64), for paths that mix one value at a time: 0.3 µs a call on the 2-core
    VM, against 6 µs for numpy on a one-element array."""
    x = ((x ^ (x >> 30)) * _M1) & _MASK
    x = ((x ^ (x >> 27)) * _M2) & _MASK
    return x ^ (x >> 31)


def mix64(x: np.ndarray) -> np.ndarray:
    """The output of one splitmix64 step from state x (any integer array, read as uint64): finalize(x + GOLDEN).
    Seeded with 0 the generator's states are k·GOLDEN, so mix64 of 0, GOLDEN, ... are its published first outputs,
    0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, ..."""
    with np.errstate(over="ignore"):  # uint64 wraps by definition
        return finalize(np.asarray(x).astype(np.uint64, copy=False) + _U64(GOLDEN))


def mix64_int(x: int) -> int:
    """`mix64` of one Python int (taken mod 2^64)."""
    return finalize_int((x + GOLDEN) & _MASK)
