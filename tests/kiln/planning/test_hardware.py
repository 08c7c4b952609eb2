import pytest

from kiln.planning.hardware import GPUS, UnknownGpu, lookup_gpu


def test_peaks_are_dense_bf16():
    assert lookup_gpu("H100-SXM").peak_flops == 989e12
    assert lookup_gpu("h200").peak_flops == 989e12
    assert lookup_gpu("A100").peak_flops == 312e12  # alias of A100-80GB
    assert lookup_gpu("H200").memory_gib > lookup_gpu("H100").memory_gib


@pytest.mark.parametrize("gpu, total_mib", [("A100-80GB", 81_920), ("H100-SXM", 81_559), ("A10", 23_028),
                                             ("A10G", 23_028), ("L4", 23_034), ("L40S", 46_068)])
def test_memory_is_what_the_device_offers_within_one_percent(gpu, total_mib):
    """nvidia-smi's memory.total on each card, as reported by their users (modal-labs/modal-client#2797 lists these
    six). The GDDR6 cards keep 1/16 for ECC: the marketed 24 and 48 GB overstated them by 6.7%, and a plan could
    count on memory the card does not have."""
    assert lookup_gpu(gpu).memory_gib == pytest.approx(total_mib / 1024, rel=0.01)


def test_unknown_gpu_lists_known_names():
    with pytest.raises(UnknownGpu, match="unknown GPU 'X100'") as info:
        lookup_gpu("X100")
    assert all(name in str(info.value) for name in GPUS)
    assert isinstance(info.value, ValueError)


def test_peak_override():
    assert lookup_gpu("H100", peak_flops=1979e12).peak_flops == 1979e12
    with pytest.raises(ValueError):
        lookup_gpu("H100", peak_flops=-1.0)
