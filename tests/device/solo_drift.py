"""Where a latency-bound loop's solo rate moves: one copy of bench_loop.py's small loop
alone, with the GPU's clocks and the copy's CPU sampled beside it. Read-only (NVML through
nvidia-smi's query loop); no MPS, no setting touched.

  python3 solo_drift.py LONG_SECONDS SHORT_RUNS SHORT_SECONDS > drift.json

- long: one copy for LONG_SECONDS, its units counted every 0.5 s: does one process's rate
  drift within its life?
- short: SHORT_RUNS fresh copies one after another, each counted over SHORT_SECONDS once
  it has reported a unit (the window bench uses): how far apart are fresh processes?
Each interval carries the CPU the copy last ran on and its voluntary/involuntary context
switches; `clocks` is nvidia-smi's 100 ms samples (SM and memory clock, P-state,
utilisation, power) over the whole run.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from units_copies import Copies

long_seconds, short_runs, short_seconds = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
t0 = time.time()


def where(pid):
    """The CPU the process last ran on, and its context switches so far."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
        cpu = int(stat[stat.rfind(")") + 2:].split()[36])
        status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
        return cpu, int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"])
    except (OSError, ValueError, KeyError):
        return None, None, None


def started():
    """One fresh copy, once it has reported a unit."""
    copies = Copies(1, "small", os.environ)
    copies.wait_working()
    return copies


def interval(copies, seconds):
    start, mark = time.perf_counter(), copies.counts[0]
    time.sleep(seconds)
    end, units = time.perf_counter(), copies.counts[0] - mark
    cpu, vol, invol = where(copies.procs[0].pid)
    return {"t": round(time.time() - t0, 3), "per_s": units / (end - start), "cpu": cpu,
            "voluntary": vol, "involuntary": invol}


clocks_file = tempfile.NamedTemporaryFile("w+", suffix=".csv")
sampler = subprocess.Popen(
    ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,pstate,utilization.gpu,power.draw",
     "--format=csv,noheader,nounits", "-lms", "100"], stdout=clocks_file)
result = {"long": [], "short": []}
copies = started()
while time.time() - t0 < long_seconds:
    result["long"].append(interval(copies, 0.5))
copies.stop()
for _ in range(short_runs):
    copies = started()
    result["short"].append(interval(copies, short_seconds))
    copies.stop()
sampler.terminate()
sampler.wait()
clocks_file.seek(0)
result["clocks"] = [line.strip() for line in clocks_file if line.strip()]
result["t0"] = t0
print(json.dumps(result))
