"""bench/dedup_scaling.py's trial order and ratios, on hand-made trials."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("dedup_scaling", ROOT / "bench" / "dedup_scaling.py")
scaling = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scaling)


def trial(half: int, engine: str, workers: int, wall: float, cpu: float, steal: float = 0.0) -> dict:
    return {"half": half, "engine": engine, "stage": "near", "workers": workers, "wall_s": wall, "cpu_s": cpu,
            "machine": {"cpu_steal_s": steal}}


def test_abba_over_engines_and_worker_counts():
    assert scaling.schedule(["local", "ray"], 1) == [
        (0, "local", 1), (0, "ray", 1), (0, "local", 2), (0, "ray", 2),
        (1, "ray", 2), (1, "local", 2), (1, "ray", 1), (1, "local", 1)]
    assert len(scaling.schedule(["local"], 2)) == 8


def test_half_round_ratios_medians_and_ray_over_pool():
    # a host that slows down in the second half-round (every arm ~1.5x slower):
    #   pool: 60 / 30 = 2.0, then 90 / 40 = 2.25; medians 75 / 35 = 2.143
    #   Ray:  66 / 36 = 1.833, then 99 / 50 = 1.98; medians 82.5 / 43 = 1.919
    #   Ray's CPU over the pool's, 1 worker: 66 / 60 = 1.1, 99 / 90 = 1.1; 2 workers: 72 / 60 = 1.2, 100 / 80 = 1.25
    trials = [trial(0, "local", 1, 60, 60), trial(0, "ray", 1, 66, 66), trial(0, "local", 2, 30, 60),
              trial(0, "ray", 2, 36, 72), trial(1, "ray", 2, 50, 100, steal=4.0), trial(1, "local", 2, 40, 80),
              trial(1, "ray", 1, 99, 99), trial(1, "local", 1, 90, 90)]
    got = scaling.summary(trials)
    assert got["local:near"]["half_round_ratios"] == [2.0, 2.25] and got["local:near"]["median_ratio"] == 2.143
    assert got["ray:near"]["half_round_ratios"] == [1.833, 1.98] and got["ray:near"]["median_ratio"] == 1.919
    assert got["ray:near"]["steal_s"] == [0.0, 0.0, 4.0, 0.0]
    assert got["ray_cpu_over_pool:near:1"] == {"half_rounds": [1.1, 1.1], "of_medians": 1.1}
    assert got["ray_cpu_over_pool:near:2"] == {"half_rounds": [1.2, 1.25], "of_medians": 1.229}
