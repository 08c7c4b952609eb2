"""peak_rss_bytes is the process's own peak: it sees what the process touched, and in a child started from a big
parent it does not start at the parent's RSS, as ru_maxrss does (the reason it exists)."""

import subprocess
import sys

import numpy as np

from kiln.common.memory import peak_rss_bytes

MIB = 2**20


def test_peak_rss_counts_what_this_process_touches():
    resident = _current_rss()
    block = np.ones(200 * MIB // 8)  # 200 MiB, every page written
    assert peak_rss_bytes() >= resident + 190 * MIB
    del block


def _current_rss() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) * 1024


def test_a_child_of_a_big_parent_reports_its_own_peak_not_the_parents():
    block = np.ones(400 * MIB // 8)  # the parent holds 400 MiB when it forks the child
    child = ("import resource; from kiln.common.memory import peak_rss_bytes; "
             "print(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    own, maxrss = map(int, subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                                          check=True).stdout.split())
    assert maxrss >= 400 * MIB  # ru_maxrss starts at the parent's RSS at the fork
    assert own < 200 * MIB  # a Python importing numpy via kiln: tens of MiB
    del block
