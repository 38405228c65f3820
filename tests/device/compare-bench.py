"""Scaling gpushare-ctl bench measured against the same loops run by hand in the same run.

  python3 tests/device/compare-bench.py BENCH.json HAND.json

Prints one table row per strategy and N: gpushare's scaling (aggregate units/s over its
baseline), the hand run's (aggregate steps/s over one copy alone), their ratio, and the
agent's own CPU over the window; exits 1 if any ratio is off by more than 10 %.
"""
import json
import sys

bench, hand = (json.load(open(p)) for p in sys.argv[1:3])
hand_runs = {(r["strategy"], r["replicas"]): r for r in hand["runs"]}
worst = 0.0
print(f"{'strategy':<13}{'N':>3}{'gpushare':>10}{'by hand':>9}{'ratio':>7}{'agent CPU':>11}")
for s in bench["strategies"]:
    for run in s["runs"]:
        h = hand_runs.get((s["strategy"], run["replicas"]))
        if h is None or run.get("scaling") is None:
            print(f"{s['strategy']:<13}{run['replicas']:>3}  {run.get('error') or 'no figure'}")
            continue
        ratio = run["scaling"] / h["scaling"]
        worst = max(worst, abs(ratio - 1))
        cpu = run.get("agent_cpu_percent")
        print(f"{s['strategy']:<13}{run['replicas']:>3}{run['scaling']:>9.2f}x{h['scaling']:>8.2f}x"
              f"{ratio:>7.3f}{cpu if cpu is None else f'{cpu:.2f} %':>11}")
print(f"baseline {bench['baseline']['throughput_per_s']:.1f} units/s; by hand alone {hand['solo_per_s']:.1f} steps/s;"
      f" largest difference {worst * 100:.1f} %")
sys.exit(1 if worst > 0.10 else 0)
