"""The same loops without gpushare, as people bench by hand: N copies started together
(a ready file each, then one go file), each counting steps for S seconds, under the
driver's time-slicing, under a hand-started `nvidia-cuda-mps-control -d`, and under MPS
with 100/N % threads and memory/N set by the daemon's two limit commands. Prints one JSON
object: per strategy and N, the aggregate steps/s and the scaling against one copy alone
under time-slicing; and the time a bare MPS start with its two limit commands takes.
With REPEAT, each run is measured that many times back to back and the median aggregate
kept, and one copy alone at least 3 times, as `gpushare-ctl bench --repeat` does.

METHOD says how a run is counted:
- `self` (the default): as people time by hand, each copy counts its own steps over its own
  S seconds from the go file, its lines going to /dev/null.
- `window`: gpushare's method without gpushare: the copies run in `units` mode, each
  writing its lines into a pipe of its own that this script drains; one window of S
  seconds opens once every copy has reported a unit and counts the lines in it for all
  copies at once; then the copies' process groups are killed. What separates this from
  `self` is the counting; what separates it from `gpushare-ctl bench` is the agent.

  python3 hand_bench.py SHAPE SECONDS N,N,... WORKDIR [REPEAT] [STRATEGY,...] [METHOD]
"""
import json
import os
import statistics
import subprocess
import sys
import time

from units_copies import LOOP, Copies

shape, seconds, counts, work = sys.argv[1], float(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")], sys.argv[4]
repeat = int(sys.argv[5]) if len(sys.argv) > 5 else 1
strategies = sys.argv[6].split(",") if len(sys.argv) > 6 and sys.argv[6] else ["time-slicing", "mps", "mps-limited"]
method = sys.argv[7] if len(sys.argv) > 7 else "self"
assert method in ("self", "window"), f"unknown METHOD {method}"
pipe = os.path.join(work, "hand-mps", "pipe")
logs = os.path.join(work, "hand-mps", "log")
os.makedirs(pipe, exist_ok=True)
os.makedirs(logs, exist_ok=True)
mps_env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logs)
total_mib = int(subprocess.check_output(
    ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"]).split()[0])


def control(command):
    subprocess.run(["nvidia-cuda-mps-control"], input=command + "\n", text=True, env=mps_env,
                   check=True, capture_output=True)


def start_mps(threads=None, mem_mib=None):
    t = time.perf_counter()
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps_env, check=True)
    if threads is not None:
        control(f"set_default_active_thread_percentage {threads}")
        control(f"set_default_device_pinned_mem_limit 0 {mem_mib}M")
    return (time.perf_counter() - t) * 1000


def mps_running():
    """Whether an MPS daemon or server still runs (zombies, left to an init that does not
    reap them in some containers, do not count)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"nvidia-cuda-mps" in cmd and stat[stat.rfind(")") + 2] != "Z":
            return True
    return False


def stop_mps():
    """Quits the daemon and waits until it is gone; how long that took, ms."""
    t = time.perf_counter()
    control("quit")
    for _ in range(2000):
        if not mps_running():
            break
        time.sleep(0.002)
    return (time.perf_counter() - t) * 1000


def run(n, env):
    tag = f"{time.monotonic_ns()}"
    ready = [os.path.join(work, f"ready-{tag}-{i}") for i in range(n)]
    go = os.path.join(work, f"go-{tag}")
    procs = [subprocess.Popen([sys.executable, LOOP, shape, "hand", ready[i], go, str(seconds)],
                              env=env, stdout=subprocess.PIPE, text=True) for i in range(n)]
    deadline = time.time() + 120
    while not all(os.path.exists(r) for r in ready) and time.time() < deadline:
        time.sleep(0.01)
    open(go, "w").close()
    rates = [float(p.communicate()[0].strip() or 0) for p in procs]
    return sum(rates), rates


def run_window(n, env):
    """n copies in `units` mode, each reporting into a pipe of its own; one common window of
    `seconds` once every copy has reported a unit. Aggregate and per-copy units/s."""
    copies = Copies(n, shape, env)
    copies.wait_working()
    marks, opened = list(copies.counts), time.perf_counter()
    time.sleep(seconds)
    ends, closed = list(copies.counts), time.perf_counter()
    copies.stop()
    rates = [(e - m) / (closed - opened) for e, m in zip(ends, marks)]
    return sum(rates), rates


def measured(n, env, times):
    """`times` runs of n copies; the one with the median aggregate (the lower middle of an
    even count), and every aggregate."""
    once = run_window if method == "window" else run
    runs = sorted((once(n, env) for _ in range(times)), key=lambda r: r[0])
    aggregate, rates = runs[(len(runs) - 1) // 2]
    return aggregate, rates, [r[0] for r in runs]


results = {"shape": shape, "seconds": seconds, "repeat": repeat, "method": method, "runs": []}
solo, _, solo_all = measured(1, dict(os.environ), max(repeat, 3))
for strategy in strategies:
    if strategy == "mps":
        start_mps()
    for n in counts:
        if strategy == "mps-limited":
            start_mps(max(1, 100 // n), (total_mib // n))
        env = dict(os.environ) if strategy == "time-slicing" else mps_env
        if strategy == "time-slicing" and n == 1:
            aggregate, rates, all_runs = solo, [solo], solo_all
        else:
            aggregate, rates, all_runs = measured(n, env, repeat)
        results["runs"].append({"strategy": strategy, "replicas": n, "aggregate_per_s": aggregate,
                                "scaling": aggregate / solo, "per_replica": rates,
                                "repeat_aggregates_per_s": all_runs})
        if strategy == "mps-limited":
            stop_mps()
    if strategy == "mps":
        stop_mps()
starts, stops = [], []
for _ in range(5):
    starts.append(start_mps(33, total_mib // 3))
    stops.append(stop_mps())
results["solo_per_s"] = solo
results["solo_runs_per_s"] = solo_all
results["bare_mps_start_with_limits_ms"] = starts
results["bare_mps_start_with_limits_median_ms"] = statistics.median(starts)
# A switch between two limited setups stops one daemon and starts the next.
results["bare_mps_stop_ms"] = stops
results["bare_mps_stop_median_ms"] = statistics.median(stops)
print(json.dumps(results))
