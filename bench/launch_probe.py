"""bench/launch_bench.py's stand-in for training_jobs.train: reports when its rank is up, then exits."""

import time

print(f"kiln-probe-up {time.time()}", flush=True)
