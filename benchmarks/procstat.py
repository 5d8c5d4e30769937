"""This process's memory figures from /proc (Linux), for the memory rows of both suites."""
from __future__ import annotations


def proc_status() -> dict[str, int]:
    """/proc/self/status sizes in bytes (VmRSS, VmHWM, RssAnon, ...)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                out[key] = int(rest.split()[0]) * 1024
    return out
