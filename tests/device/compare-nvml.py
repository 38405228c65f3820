#!/usr/bin/env python3
"""Compares two `gpushare-agent --dump-nvml` documents field by field: a real driver's
answers and the simulated driver's for the same model (e.g. the H100 and
`--simulate h100-80gb:1`). Values that differ by nature between two GPUs (the UUID, the
device node's number) are compared by format; the GPU's state (MIG mode, compute mode,
persistence mode, instances, processes) is printed side by side, not counted.

    compare-nvml.py REAL.json SIMULATED.json
Prints one line per field and the number of differences; exits 1 when there are any.
"""
import json
import re
import sys

UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
NODE = re.compile(r"^/dev/nvidia[0-9]+$")
COMPARED = ["name", "pci_device_id", "model", "memory_total_bytes"]
STATE = ["mig_enabled", "mig_pending", "compute_mode", "persistence_mode", "instances", "processes"]


def main(real_path, sim_path):
    real = json.load(open(real_path))["gpus"]
    sim = json.load(open(sim_path))["gpus"]
    differences = 0

    def line(what, a, b, same):
        nonlocal differences
        differences += 0 if same else 1
        print(f"{'same' if same else 'DIFF'}  {what}: real {a!r}, simulated {b!r}")

    line("GPU count", len(real), len(sim), len(real) == len(sim))
    for r, s in zip(real, sim):
        g = f"GPU {r['index']}"
        for key in COMPARED:
            line(f"{g} {key}", r[key], s[key], r[key] == s[key])
        line(f"{g} uuid format", r["uuid"], s["uuid"],
             bool(UUID.match(r["uuid"])) and bool(UUID.match(s["uuid"])))
        line(f"{g} device node format", r["device_node"], s["device_node"],
             bool(NODE.match(r["device_node"] or "")) and bool(NODE.match(s["device_node"] or "")))
        rp = {p["nvml_enum"]: p for p in (r["profiles"] or [])}
        sp = {p["nvml_enum"]: p for p in (s["profiles"] or [])}
        line(f"{g} profile enums", sorted(rp), sorted(sp), sorted(rp) == sorted(sp))
        for e in sorted(set(rp) & set(sp)):
            for key in ["id", "name", "slice_count", "instance_count", "sms", "memory_mib", "placements"]:
                a, b = rp[e][key], sp[e][key]
                line(f"{g} profile enum {e} {key}", a, b, a == b)
        ra = {a["enum"]: a["answer"] for a in r["profile_enum_answers"]}
        sa = {a["enum"]: a["answer"] for a in s["profile_enum_answers"]}
        for e in sorted(set(ra) | set(sa)):
            line(f"{g} profile enum {e} answer", ra.get(e), sa.get(e), ra.get(e) == sa.get(e))
        for key in STATE:
            print(f"state {g} {key}: real {r.get(key)!r}, simulated {s.get(key)!r}")
    print(f"{differences} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
