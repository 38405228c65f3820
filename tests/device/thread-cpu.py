#!/usr/bin/env python3
"""Where a process's CPU goes, by thread: samples /proc/PID/task/*/schedstat (stat where it is missing) every INTERVAL
seconds until the process ends or SECONDS pass, and prints per interval the CPU (% of one
core) of each group of threads (the thread name without its trailing number, so the
agent's `bench-report-0..6` are one group) and the whole process. Read-only.

  thread-cpu.py PID SECONDS [INTERVAL]
"""
import os
import re
import sys
import time

pid, seconds = int(sys.argv[1]), float(sys.argv[2])
interval = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
tick = os.sysconf("SC_CLK_TCK")


def sample():
    """(thread id -> (group, cpu seconds)) of every live thread."""
    threads = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        try:
            # Nanoseconds on a CPU: finer than stat's clock ticks (10 ms).
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu = int(f.read().split()[0]) / 1e9
        except (FileNotFoundError, IndexError, ValueError):
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        threads[tid] = (re.sub(r"-?\d+$", "", name), cpu)
    return threads


start = time.monotonic()
before = sample()
while before is not None and time.monotonic() - start < seconds:
    time.sleep(interval)
    after = sample()
    if after is None:
        break
    groups = {}
    for tid, (group, cpu) in after.items():
        # A thread born in the interval counts from 0.
        groups[group] = groups.get(group, 0.0) + cpu - before.get(tid, (group, 0.0))[1]
    # Threads that ended in the interval: their last interval is lost (small).
    total = sum(groups.values())
    parts = "  ".join(f"{g}={100 * c / interval:.2f}" for g, c in sorted(groups.items()) if c > 0)
    print(f"t={time.monotonic() - start:6.1f}s  all={100 * total / interval:.2f}%  {parts}", flush=True)
    before = after
