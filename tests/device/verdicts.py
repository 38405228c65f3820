"""The agent's verdict rules (agent/src/bench/stats.rs), for results measured without it:
the median and its interval, a spread, whether two figures are told apart, and the
recommendation per N. hand_bench.py judges its own runs with these; compare-trust.py
judges a hand run's file again with them (a file written before a fix of these rules)."""
import statistics
import struct

MIN_NOISE_FLOOR = 0.02  # the agent's stats::MIN_NOISE_FLOOR
ISOLATION = ["mig", "mps-limited", "mps", "time-slicing"]  # the agent's tie-break order


def median(values):
    return statistics.median(values) if values else None


def percentile(sorted_values, p):
    rank = p / 100 * (len(sorted_values) - 1)
    lo, hi = int(rank // 1), int(-(-rank // 1))
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def median_interval(values):
    """The 95 % interval of the median: the range of 2 or 3 values, else the agent's seeded
    percentile bootstrap (2000 resamples, splitmix64 seeded from the values' bits)."""
    mask = (1 << 64) - 1
    if len(values) < 2 or any(v != v or v in (float("inf"), float("-inf")) for v in values):
        return None
    if len(values) <= 3:
        return [min(values), max(values)]
    state = 0x9E3779B97F4A7C15
    for v in values:
        state = ((state ^ struct.unpack("<Q", struct.pack("<d", v))[0]) * 0x100000001B3) & mask

    def draw():
        nonlocal state
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    n = len(values)
    medians = sorted(statistics.median([values[draw() % n] for _ in range(n)]) for _ in range(2000))
    return [percentile(medians, 2.5), percentile(medians, 97.5)]


def spread(values):
    values = [v for v in values if v is not None]
    if len(values) < 2 or min(values) <= 0:
        return None
    return max(values) / min(values) - 1


def apart(a, a_interval, b, b_interval, floor):
    """The agent's `apart`: they differ by more than `floor` (relative to the smaller) and
    their intervals, where both have one, do not overlap."""
    high, low = max(a, b), min(a, b)
    if high == low:
        return False
    if low > 0 and high / low - 1 < floor:
        return False
    if a_interval and b_interval:
        return a_interval[1] < b_interval[0] or b_interval[1] < a_interval[0]
    return True


def recommend(runs, floor):
    """Per N, the strategy with the largest median throughput, or, where others cannot be
    told apart from it, the best isolated of those, with `indistinguishable` listing them."""
    out = []
    for n in sorted({r["replicas"] for r in runs}):
        cands = [r for r in runs if r["replicas"] == n and not r.get("failed")]
        if not cands:
            continue
        top = max(cands, key=lambda r: r["aggregate_per_s"])
        alike = [r for r in cands if r is top or not apart(
            top["aggregate_per_s"], top.get("throughput_interval"),
            r["aggregate_per_s"], r.get("throughput_interval"), floor)]
        alike.sort(key=lambda r: ISOLATION.index(r["strategy"]) if r["strategy"] in ISOLATION else 9)
        if len(alike) > 1:
            out.append({"replicas": n, "strategy": alike[0]["strategy"],
                        "indistinguishable": [r["strategy"] for r in alike]})
        else:
            out.append({"replicas": n, "strategy": top["strategy"], "indistinguishable": []})
    return out


def with_baseline(runs, solo, solo_interval, strategies):
    """The candidates as the agent has them: time-slicing at 1 replica is the baseline (one
    copy alone without MPS), measured as such and kept apart from the runs."""
    have = any(r["strategy"] == "time-slicing" and r["replicas"] == 1 for r in runs)
    if "time-slicing" not in strategies or solo is None or have:
        return list(runs)
    if not any(r["replicas"] == 1 for r in runs):
        return list(runs)
    return list(runs) + [{"strategy": "time-slicing", "replicas": 1, "aggregate_per_s": solo,
                          "throughput_interval": solo_interval}]


def hand_verdicts(hand):
    """A hand run's recommendations by these rules, from its file."""
    strategies = sorted({r["strategy"] for r in hand.get("runs", [])} | {"time-slicing"})
    solo_all = hand.get("solo_runs_per_s") or []
    floor = max(spread(solo_all) or 0.0, MIN_NOISE_FLOOR)
    runs = with_baseline(hand.get("runs", []), hand.get("solo_per_s"),
                         hand.get("solo_interval") or median_interval(solo_all), strategies)
    return recommend(runs, floor)
