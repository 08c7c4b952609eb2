import pytest

from kiln.planning.hardware import GPUS, UnknownGpu, lookup_gpu


def test_peaks_are_dense_bf16():
    assert lookup_gpu("H100-SXM").peak_flops == 989e12
    assert lookup_gpu("h200").peak_flops == 989e12
    assert lookup_gpu("A100").peak_flops == 312e12  # alias of A100-80GB
    assert lookup_gpu("H200").memory_gib > lookup_gpu("H100").memory_gib


def test_unknown_gpu_lists_known_names():
    with pytest.raises(UnknownGpu, match="unknown GPU 'X100'") as info:
        lookup_gpu("X100")
    assert all(name in str(info.value) for name in GPUS)
    assert isinstance(info.value, ValueError)


def test_peak_override():
    assert lookup_gpu("H100", peak_flops=1979e12).peak_flops == 1979e12
    with pytest.raises(ValueError):
        lookup_gpu("H100", peak_flops=-1.0)
