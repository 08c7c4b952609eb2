"""This process's own peak resident memory."""

from __future__ import annotations

import resource
import sys


def peak_rss_bytes() -> int:
    """The process's peak resident set (Linux: VmHWM). Not ru_maxrss, which a child exec'd from a fork starts at its
    parent's RSS: bench/refresh_history.py's decisions read ~390 MiB (their parent's) before their first stage."""
    if sys.platform.startswith("linux"):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # macOS: bytes, and no fork inheritance to undo
