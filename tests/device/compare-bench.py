"""Scaling gpushare-ctl bench measured against the same loops run by hand in the same run.

  python3 tests/device/compare-bench.py BENCH.json[,BENCH.json...] HAND.json[,HAND.json...] [A,B]

Prints one table row per strategy and N: gpushare's scaling (aggregate units/s over its
baseline), the hand run's (aggregate steps/s over one copy alone), their ratio, the ratio
of the aggregates themselves (no solo in it), and the agent's own CPU over the window;
exits 1 if any scaling ratio is off by more than 10 %. Given several runs of each side
(alternated in the same session), each figure is the median of its side's runs: a latency-bound loop's solo rate, which every scaling divides by, varies
by a third from one run to the next on a shared host. Either side may be hand_bench.py's
JSON (two ways of measuring by hand compared with each other); A,B name the two sides in
the table (default `gpushare,by hand`).
"""
import json
import statistics
import sys

benches = [json.load(open(p)) for p in sys.argv[1].split(",")]
hands = [json.load(open(p)) for p in sys.argv[2].split(",")]
label_a, label_b = (sys.argv[3] if len(sys.argv) > 3 else "gpushare,by hand").split(",")


def aggregate(run):
    """A run's aggregate units/s, in either side's JSON."""
    return run.get("throughput_per_s", run.get("aggregate_per_s"))


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


bench_runs, hand_runs = {}, {}
for bench in benches:
    if "strategies" not in bench:  # hand_bench.py's JSON on this side too
        for r in bench["runs"]:
            bench_runs.setdefault((r["strategy"], r["replicas"]), []).append(r)
        continue
    for s in bench["strategies"]:
        for run in s["runs"]:
            bench_runs.setdefault((s["strategy"], run["replicas"]), []).append(run)
for hand in hands:
    for r in hand["runs"]:
        hand_runs.setdefault((r["strategy"], r["replicas"]), []).append(r)

worst = 0.0
print(f"{len(benches)} run(s) {label_a}, {len(hands)} {label_b}; medians")
print(f"{'strategy':<13}{'N':>3}{label_a:>10}{label_b:>9}{'ratio':>7}{'agg.':>7}{'agent CPU':>11}  each {label_a} / {label_b}")
for (strategy, n), runs in bench_runs.items():
    scaling = median(r.get("scaling") for r in runs)
    hand = hand_runs.get((strategy, n), [])
    hand_scaling = median(h["scaling"] for h in hand)
    if scaling is None or hand_scaling is None:
        errors = {r.get("error") for r in runs if r.get("error")}
        print(f"{strategy:<13}{n:>3}  {'; '.join(errors) or 'no figure'}")
        continue
    ratio = scaling / hand_scaling
    worst = max(worst, abs(ratio - 1))
    aggregates = median(aggregate(r) for r in runs) / median(aggregate(h) for h in hand)
    cpu = median(r.get("agent_cpu_percent") for r in runs)
    each = " ".join(f"{r['scaling']:.2f}" for r in runs if r.get("scaling") is not None)
    each_hand = " ".join(f"{h['scaling']:.2f}" for h in hand)
    print(f"{strategy:<13}{n:>3}{scaling:>9.2f}x{hand_scaling:>8.2f}x{ratio:>7.3f}{aggregates:>7.3f}"
          f"{'-' if cpu is None else f'{cpu:.2f} %':>11}  {each} / {each_hand}")
# Strategy switches: what the agent's setups took (planned, set up, verified) against a
# bare start with the two limit commands, and a bare stop then start where the setup
# replaced a running server (every mps-limited setup), in the same runs.
starts = [m for h in hands for m in h.get("bare_mps_start_with_limits_ms", [])]
stops = [m for h in hands for m in h.get("bare_mps_stop_ms", [])]
if starts:
    bare_start = statistics.median(starts)
    bare_stop = statistics.median(stops) if stops else None
    print(f"bare start + 2 limit commands: median {bare_start:.1f} ms"
          + (f"; bare stop (quit until gone): median {bare_stop:.1f} ms" if bare_stop else ""))
    for (strategy, n), runs in bench_runs.items():
        setups = [r["setup_ms"] for r in runs if r.get("setup_ms") is not None]
        if not setups or strategy == "time-slicing":
            continue
        # In the order these runs go (time-slicing, mps, mps-limited), every mps-limited
        # setup replaces a running server: mps's, or the previous N's.
        replaces = strategy == "mps-limited"
        bare = bare_start + (bare_stop or 0) if replaces else bare_start
        what = "stop + start" if replaces else "start"
        print(f"  {strategy} N={n}: setup {statistics.median(setups):.1f} ms against bare {what}"
              f" {bare:.1f} ms: {statistics.median(setups) / bare:.2f}x")
def measurements(median, all_runs):
    """`29507` for one measurement, `29507 (22418-34465 of 3)` for several."""
    if len(all_runs) < 2:
        return f"{median:.0f}"
    return f"{median:.0f} ({min(all_runs):.0f}-{max(all_runs):.0f} of {len(all_runs)})"


def baseline(side):
    if "baseline" not in side:
        return measurements(side["solo_per_s"], side.get("solo_runs_per_s", []))
    return measurements(side["baseline"]["throughput_per_s"],
                        side["baseline"].get("repeat_throughputs_per_s", []))


solo = " ".join(baseline(b) for b in benches)
solo_hand = " ".join(baseline(h) for h in hands)
print(f"baselines (units/s): {label_a} {solo}; {label_b} {solo_hand}; largest difference {worst * 100:.1f} %")
sys.exit(1 if worst > 0.10 else 0)
