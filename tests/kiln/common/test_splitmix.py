"""splitmix64 against its published outputs, and every form Kiln computes it in against the others."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kiln.common.splitmix import GOLDEN, finalize, finalize_int, mix64, mix64_int
from kiln.dedup import _kernels

# Vigna's splitmix64.c seeded with 0: the generator's state after k steps is k·GOLDEN, its k+1-th output mix64 of it.
PUBLISHED = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
M64 = 1 << 64


def test_the_generator_from_state_zero_gives_its_published_outputs():
    states = [k * GOLDEN % M64 for k in range(3)]
    assert mix64(np.array(states, np.uint64)).tolist() == PUBLISHED
    assert [mix64_int(s) for s in states] == PUBLISHED
    assert [int(_kernels.mix64(np.uint64(s))) for s in states] == PUBLISHED


@given(st.lists(st.integers(0, M64 - 1), min_size=1, max_size=50))
def test_the_array_int_and_compiled_forms_agree(values):
    array = np.array(values, np.uint64)
    assert finalize(array).tolist() == [finalize_int(v) for v in values]
    assert mix64(array).tolist() == [mix64_int(v) for v in values] == [int(_kernels.mix64(np.uint64(v)))
                                                                          for v in values]
    assert mix64(np.array(values, np.uint64).view(np.int64)).tolist() == mix64(array).tolist()  # read as uint64


def test_finalize_is_a_bijection_on_a_sample():
    """Distinct inputs, distinct outputs (it is invertible: each step is an xorshift or an odd multiplier)."""
    x = np.arange(1 << 16, dtype=np.uint64) << np.uint64(40)
    assert len(np.unique(finalize(x))) == len(x)
