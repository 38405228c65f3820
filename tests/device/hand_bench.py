"""The same loops without gpushare, as people bench by hand: N copies started together
(a ready file each, then one go file), each counting steps for S seconds, under the
driver's time-slicing, under a hand-started `nvidia-cuda-mps-control -d`, and under MPS
with 100/N % threads and memory/N set by the daemon's two limit commands. Prints one JSON
object: per strategy and N, the aggregate steps/s and the scaling against one copy alone
under time-slicing; and the time a bare MPS start with its two limit commands takes.
With REPEAT, each run is measured that many times back to back and the median aggregate
kept, and one copy alone at least 3 times, as `gpushare-ctl bench --repeat` did before
issue 27.

  python3 hand_bench.py SHAPE SECONDS N,N,... WORKDIR [REPEAT] [STRATEGY,...] [METHOD] [-- COMMAND...]
  python3 hand_bench.py solo-spread SHAPE SECONDS ROUNDS MAX_N WORKDIR [-- COMMAND...]

METHOD says how a run is counted:
- `self` (the default): as people time by hand, each copy counts its own steps over its own
  S seconds from the go file, its lines going to /dev/null (bench_loop.py only).
- `window`: gpushare's method without gpushare: the copies run in `units` mode, each
  writing its lines into a pipe of its own that this script drains; one window of S
  seconds opens once every copy has reported a unit and counts the lines in it for all
  copies at once; then the copies' process groups are killed. What separates this from
  `self` is the counting; what separates it from `gpushare-ctl bench` is the agent.

COMMAND (after `--`): the copies run this program instead of bench_loop.py SHAPE (SHAPE is
then only a label), reporting units on the descriptor in `GPUSHARE_BENCH_REPORT` exactly as
under gpushare (README, "Benchmarking your workload"); it implies METHOD `window`.

Issue 27, set by the environment:
- `HAND_CPUS=LIST` (`0-15`; `auto`: this process's CPUs on GPU 0's NUMA node, as the agent
  picks them without --cpus): copy i pinned to the CPU set gpushare-ctl bench gives
  replica i for `--cpus LIST` and the same largest N (units_copies.pin_sets: the agent's
  rule), one copy alone on copy 0's set. Unset: unpinned, as before.
- `HAND_INTERLEAVE=1`: REPEAT is a number of rounds K, measured as `gpushare-ctl bench
  --repeat K` orders them: each round one copy alone (the baseline), then every (N,
  strategy) cell, N-major, the strategies in the given order within each N; odd rounds
  forward, even rounds reversed (the baseline first in every round); the baseline at least
  3 times (extra ones at the start of round 1 where K < 3). Each cell's median over the
  rounds, its 95 % interval (the agent's: the range of 2 or 3 values, a seeded percentile
  bootstrap of the median over more), every measurement in the order taken (`sequence`),
  the baseline's spread as the noise floor and, per N, the recommendation with the same
  "indistinguishable" rule as the agent's. Counting is `window`.
- `HAND_LIKE=REPORT.json` (a `gpushare-ctl bench --json` report): take the CPU sets from its
  `pinning.replicas` and, with HAND_INTERLEAVE, the measurement order from its `sequence`,
  so that both sides run exactly alike; whether HAND_CPUS's own division gives the same sets
  is recorded (`pinning.agrees_with_report`).

`solo-spread`: one copy alone, ROUNDS rounds, each a window pinned to copy 0's set (of
HAND_CPUS divided for MAX_N, or HAND_LIKE's) and one unpinned, which goes first
alternating from round to round (pinned first in odd rounds); per side every measurement,
median and spread (largest over smallest, minus one).
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from units_copies import LOOP, Copies, format_cpus, gpu_node_cpus, parse_cpus, pin_sets
from verdicts import MIN_NOISE_FLOOR, median, median_interval, recommend, spread, with_baseline

BASELINE_RUNS = 3  # gpushare's BENCH_BASELINE_RUNS

args, command = sys.argv[1:], None
if "--" in args:
    command = args[args.index("--") + 1:]
    args = args[:args.index("--")]
    if not command:
        sys.exit("hand_bench.py: nothing after --")
t0 = time.perf_counter()


class Stop(Exception):
    pass


def on_term(signum, frame):
    raise Stop(f"signal {signum}")


signal.signal(signal.SIGTERM, on_term)


# ---- the CPU sets -------------------------------------------------------------------------

def load_like():
    path = os.environ.get("HAND_LIKE")
    return json.load(open(path)) if path else None


def pinning_for(max_n, like):
    """Copy i's CPU set (a list of sets) and what the JSON says of it; (None, None) unpinned."""
    own = None
    spec = os.environ.get("HAND_CPUS", "").strip()
    if spec:
        if spec == "auto":
            cpus, origin = gpu_node_cpus()
        else:
            cpus, origin = parse_cpus(spec), "HAND_CPUS (gpushare's --cpus)"
        sets = pin_sets(cpus, max_n)
        own = {"cpus": format_cpus(cpus), "from": origin, "cpus_per_replica": len(sets[0]),
               "replicas": [format_cpus(s) for s in sets]}
    theirs = (like or {}).get("pinning")
    if theirs:
        info = dict(theirs, from_report=os.environ["HAND_LIKE"])
        if own is not None:
            info["own_division"] = own["replicas"]
            info["agrees_with_report"] = own["replicas"][:len(theirs["replicas"])] == theirs["replicas"]
        return [set(parse_cpus(r)) for r in theirs["replicas"]], info
    if own is None:
        return None, None
    return [set(parse_cpus(r)) for r in own["replicas"]], own


# ---- MPS by hand --------------------------------------------------------------------------

work = None
pipe = logs = mps_env = None
total_mib = None


def setup_mps(workdir):
    global work, pipe, logs, mps_env
    work = workdir
    pipe = os.path.join(work, "hand-mps", "pipe")
    logs = os.path.join(work, "hand-mps", "log")
    os.makedirs(pipe, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    mps_env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logs)


def gpu_total_mib():
    global total_mib
    if total_mib is None:
        total_mib = int(subprocess.check_output(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"]).split()[0])
    return total_mib


def control(command):
    subprocess.run(["nvidia-cuda-mps-control"], input=command + "\n", text=True, env=mps_env,
                   check=True, capture_output=True)


daemon_up = False


def start_mps(threads=None, mem_mib=None):
    global daemon_up
    t = time.perf_counter()
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps_env, check=True)
    daemon_up = True
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
    global daemon_up
    t = time.perf_counter()
    control("quit")
    daemon_up = False
    for _ in range(2000):
        if not mps_running():
            break
        time.sleep(0.002)
    return (time.perf_counter() - t) * 1000


def quit_daemon_quietly():
    """On the way out, also after a failure: our daemon (our pipe directory) quits."""
    if daemon_up and mps_env is not None:
        try:
            stop_mps()
        except Exception as e:  # noqa: BLE001 - reported, not raised on the way out
            print(f"hand_bench.py: quitting the MPS daemon: {e}", file=sys.stderr)


# ---- measuring ----------------------------------------------------------------------------

def popen_pinned(argv, env, cpus, **kw):
    """Popen with the child's affinity `cpus` (None: inherited), set on this thread for
    the fork and put back."""
    if not cpus:
        return subprocess.Popen(argv, env=env, **kw)
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        return subprocess.Popen(argv, env=env, **kw)
    finally:
        os.sched_setaffinity(0, own)


def run_self(n, env, shape, seconds, sets):
    tag = f"{time.monotonic_ns()}"
    ready = [os.path.join(work, f"ready-{tag}-{i}") for i in range(n)]
    go = os.path.join(work, f"go-{tag}")
    procs = [popen_pinned([sys.executable, LOOP, shape, "hand", ready[i], go, str(seconds)], env,
                          sets[i] if sets else None, stdout=subprocess.PIPE, text=True) for i in range(n)]
    deadline = time.time() + 120
    while not all(os.path.exists(r) for r in ready) and time.time() < deadline:
        time.sleep(0.01)
    open(go, "w").close()
    rates = [float(p.communicate()[0].strip() or 0) for p in procs]
    return sum(rates), rates


def run_window(n, env, shape, seconds, sets, strategy=None, detail=None):
    """n copies in `units` mode, each reporting into a pipe of its own; one common window of
    `seconds` once every copy has reported a unit. Aggregate and per-copy units/s (0 and
    `failed` in `detail` where a copy never reported)."""
    copies = Copies(n, shape, env, command=command, cpu_sets=sets[:n] if sets else None, strategy=strategy)
    working = copies.wait_working()
    if detail is not None:
        detail["affinities"] = copies.affinities()
    if not working:
        copies.stop()
        if detail is not None:
            detail["failed"] = True
        return 0.0, [0.0] * n
    marks, opened = list(copies.counts), time.perf_counter()
    time.sleep(seconds)
    ends, closed = list(copies.counts), time.perf_counter()
    exited = [p.poll() is not None for p in copies.procs]
    copies.stop()
    rates = [(e - m) / (closed - opened) for e, m in zip(ends, marks)]
    if detail is not None and any(exited):
        detail["failed"] = True
    return sum(rates), rates


# ---- statistics as the agent's (agent/src/bench/stats.rs) ---------------------------------

# ---- the modes ----------------------------------------------------------------------------

def plan_order(counts, strategies, rounds, like):
    """[(round, strategy, N)] in gpushare's order (`baseline` for one copy alone)."""
    if like and like.get("sequence"):
        return [(m["round"], m["strategy"], m["replicas"]) for m in like["sequence"]], "the report's sequence"
    cells = [(s, n) for n in counts for s in strategies]
    order = []
    for r in range(1, rounds + 1):
        extra = max(0, BASELINE_RUNS - rounds) if r == 1 else 0
        order += [(r, "baseline", 1)] * (1 + extra)
        order += [(r, s, n) for s, n in (cells if r % 2 == 1 else cells[::-1])]
    return order, "hand_bench.py's own (issue 27's rule)"


def env_for(strategy):
    return dict(os.environ) if strategy in ("baseline", "time-slicing") else mps_env


def ensure_daemon(current, strategy, n):
    """Brings the hand daemon to what `strategy` at n needs; the new state."""
    wanted = None if strategy in ("baseline", "time-slicing") else (strategy, n if strategy == "mps-limited" else 0)
    if wanted == current:
        return current
    if current is not None:
        stop_mps()
    if wanted is not None:
        if strategy == "mps-limited":
            start_mps(max(1, 100 // n), gpu_total_mib() // n)
        else:
            start_mps()
    return wanted


def interleaved(shape, seconds, counts, rounds, strategies, like):
    order, order_from = plan_order(counts, strategies, rounds, like)
    max_n = max(n for _, _, n in order)
    sets, pin_info = pinning_for(max_n, like)
    results = {"shape": shape, "command": command, "seconds": seconds, "repeat": rounds,
               "method": "window", "interleaved": True, "order_from": order_from,
               "pinning": pin_info, "sequence": [], "runs": []}
    current = None
    try:
        for r, strategy, n in order:
            current = ensure_daemon(current, strategy, n)
            detail = {}
            at = time.perf_counter() - t0
            aggregate, rates = run_window(n, env_for(strategy), shape, seconds, sets,
                                          "time-slicing" if strategy == "baseline" else strategy, detail)
            m = {"round": r, "strategy": strategy, "replicas": n, "at_seconds": round(at, 3),
                 "throughput_per_s": aggregate, "per_replica": rates}
            m.update(detail)
            results["sequence"].append(m)
            print(f"round {r} {strategy} N={n}: {aggregate:.1f}/s", file=sys.stderr, flush=True)
    finally:
        if current is not None:
            quit_daemon_quietly()
    base = [m for m in results["sequence"] if m["strategy"] == "baseline" and not m.get("failed")]
    solo_all = [m["throughput_per_s"] for m in base]
    solo = median(solo_all)
    floor = max(spread(solo_all) or 0.0, MIN_NOISE_FLOOR)
    results["solo_per_s"] = solo
    results["solo_runs_per_s"] = solo_all
    results["solo_interval"] = median_interval(solo_all)
    results["noise"] = {"baseline_spread": spread(solo_all), "floor": floor}
    cells = []
    for _, s, n in order:
        if s != "baseline" and (s, n) not in cells:
            cells.append((s, n))
    cells.sort(key=lambda c: (strategies.index(c[0]) if c[0] in strategies else 9, c[1]))
    for s, n in cells:
        ms = [m for m in results["sequence"] if (m["strategy"], m["replicas"]) == (s, n)]
        all_runs = [m["throughput_per_s"] for m in ms]
        failed = any(m.get("failed") for m in ms)
        agg = median(all_runs)
        mid = sorted(ms, key=lambda m: m["throughput_per_s"])[(len(ms) - 1) // 2]
        results["runs"].append({
            "strategy": s, "replicas": n, "aggregate_per_s": agg,
            "scaling": agg / solo if solo else None, "per_replica": mid["per_replica"],
            "repeat_aggregates_per_s": all_runs, "measurements": [m["throughput_per_s"] for m in ms],
            "throughput_interval": None if failed else median_interval(all_runs), "failed": failed})
    # Time-slicing at 1 is the baseline, a candidate like any run (as the agent has it).
    results["recommendations"] = recommend(
        with_baseline(results["runs"], solo, results["solo_interval"], strategies), floor)
    print(f"baseline: median {solo or 0:.1f}/s of {' '.join(f'{x:.1f}' for x in solo_all)}", file=sys.stderr)
    for r in results["runs"]:
        print(f"{r['strategy']} N={r['replicas']}: median {r['aggregate_per_s']:.1f}/s of "
              f"{' '.join(f'{x:.1f}' for x in r['measurements'])}", file=sys.stderr)
    return results


def legacy(shape, seconds, counts, repeat, strategies, method, like):
    """The pre-issue-27 order: one copy alone (at least 3 times), then strategy after
    strategy, each run `repeat` times back to back, the median kept."""
    sets, pin_info = pinning_for(max(counts), like)

    def measured(n, env, times, strategy):
        if method == "window":
            once = lambda: run_window(n, env, shape, seconds, sets, strategy)  # noqa: E731
        else:
            once = lambda: run_self(n, env, shape, seconds, sets)  # noqa: E731
        runs = sorted((once() for _ in range(times)), key=lambda r: r[0])
        aggregate, rates = runs[(len(runs) - 1) // 2]
        return aggregate, rates, [r[0] for r in runs]

    results = {"shape": shape, "command": command, "seconds": seconds, "repeat": repeat, "method": method,
               "pinning": pin_info, "runs": []}
    solo, _, solo_all = measured(1, dict(os.environ), max(repeat, BASELINE_RUNS), "time-slicing")
    try:
        for strategy in strategies:
            if strategy == "mps":
                start_mps()
            for n in counts:
                if strategy == "mps-limited":
                    start_mps(max(1, 100 // n), (gpu_total_mib() // n))
                env = dict(os.environ) if strategy == "time-slicing" else mps_env
                if strategy == "time-slicing" and n == 1:
                    aggregate, rates, all_runs = solo, [solo], solo_all
                else:
                    aggregate, rates, all_runs = measured(n, env, repeat, strategy)
                results["runs"].append({"strategy": strategy, "replicas": n, "aggregate_per_s": aggregate,
                                        "scaling": aggregate / solo, "per_replica": rates,
                                        "repeat_aggregates_per_s": all_runs})
                if strategy == "mps-limited":
                    stop_mps()
            if strategy == "mps":
                stop_mps()
    finally:
        quit_daemon_quietly()
    results["solo_per_s"] = solo
    results["solo_runs_per_s"] = solo_all
    return results


def bare_switch_timings(results):
    starts, stops = [], []
    try:
        for _ in range(5):
            starts.append(start_mps(33, gpu_total_mib() // 3))
            stops.append(stop_mps())
    finally:
        quit_daemon_quietly()
    results["bare_mps_start_with_limits_ms"] = starts
    results["bare_mps_start_with_limits_median_ms"] = statistics.median(starts)
    # A switch between two limited setups stops one daemon and starts the next.
    results["bare_mps_stop_ms"] = stops
    results["bare_mps_stop_median_ms"] = statistics.median(stops)


def solo_spread(shape, seconds, rounds, max_n, like):
    sets, pin_info = pinning_for(max_n, like)
    if not sets:
        sys.exit("hand_bench.py solo-spread: give HAND_CPUS (or HAND_LIKE) for the pinned side")
    unpinned_cpus = format_cpus(os.sched_getaffinity(0))
    out = {"mode": "solo-spread", "shape": shape, "command": command, "seconds": seconds, "rounds": rounds,
           "pinning": pin_info, "pinned_cpus": format_cpus(sets[0]), "unpinned_cpus": unpinned_cpus,
           "sequence": []}
    for r in range(1, rounds + 1):
        for pinned in ((True, False) if r % 2 == 1 else (False, True)):
            detail = {}
            at = time.perf_counter() - t0
            aggregate, _ = run_window(1, dict(os.environ), shape, seconds, [sets[0]] if pinned else None,
                                      "time-slicing", detail)
            m = {"round": r, "pinned": pinned, "at_seconds": round(at, 3), "throughput_per_s": aggregate}
            m.update(detail)
            out["sequence"].append(m)
            print(f"round {r} {'pinned' if pinned else 'unpinned'}: {aggregate:.1f}/s", file=sys.stderr, flush=True)
    for side, pinned in (("pinned", True), ("unpinned", False)):
        per_s = [m["throughput_per_s"] for m in out["sequence"] if m["pinned"] == pinned and not m.get("failed")]
        out[side] = {"per_s": per_s, "median": median(per_s), "spread": spread(per_s),
                     "min": min(per_s) if per_s else None, "max": max(per_s) if per_s else None}
    return out


def main():
    if args and args[0] == "solo-spread":
        if len(args) != 6:
            sys.exit("usage: hand_bench.py solo-spread SHAPE SECONDS ROUNDS MAX_N WORKDIR [-- COMMAND...]")
        shape, seconds, rounds, max_n = args[1], float(args[2]), int(args[3]), int(args[4])
        setup_mps(args[5])
        print(json.dumps(solo_spread(shape, seconds, rounds, max_n, load_like())))
        return
    if len(args) < 4:
        sys.exit(__doc__)
    shape, seconds, counts, workdir = args[0], float(args[1]), [int(x) for x in args[2].split(",")], args[3]
    repeat = int(args[4]) if len(args) > 4 else 1
    strategies = args[5].split(",") if len(args) > 5 and args[5] else ["time-slicing", "mps", "mps-limited"]
    unknown = [s for s in strategies if s not in ("time-slicing", "mps", "mps-limited")]
    if unknown:
        sys.exit(f"hand_bench.py: strategies {unknown}: only time-slicing, mps and mps-limited are run by hand")
    method = args[6] if len(args) > 6 else ("window" if command else "self")
    assert method in ("self", "window"), f"unknown METHOD {method}"
    if command and method != "window":
        sys.exit("hand_bench.py: a COMMAND reports units: METHOD must be window")
    setup_mps(workdir)
    like = load_like()
    if os.environ.get("HAND_INTERLEAVE") == "1":
        results = interleaved(shape, seconds, counts, repeat, strategies, like)
    else:
        results = legacy(shape, seconds, counts, repeat, strategies, method, like)
    bare_switch_timings(results)
    results["wall_seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(results))


try:
    main()
except (Stop, KeyboardInterrupt) as e:
    quit_daemon_quietly()
    sys.exit(f"hand_bench.py: stopped ({e})")
