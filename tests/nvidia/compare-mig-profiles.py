#!/usr/bin/env python3
"""Compares `gpushare-ctl mig profiles GPU --json` with what NVML itself reports for that
GPU (`mig_profiles_nvml.py GPU`), profile by profile and field by field: id, name, slice
count, instance count, SMs, memory, engines, placements. Prints each difference and a
summary line; exits 1 when there is any.

    compare-mig-profiles.py CTL.json NVML.json
"""

import json
import sys


def main():
    ctl = json.load(open(sys.argv[1]))
    nvml = json.load(open(sys.argv[2]))
    gpu = next(g for g in ctl["gpus"] if g["index"] == nvml["index"])
    ours = {p["nvml_enum"]: p for p in gpu["profiles"]}
    theirs = {p["nvml_enum"]: p for p in nvml["profiles"]}
    differences = []
    for e in sorted(set(ours) | set(theirs)):
        if e not in ours:
            differences.append("enum %d (%s): NVML reports it, mig profiles lacks it" % (e, theirs[e]["name"]))
            continue
        if e not in theirs:
            differences.append("enum %d (%s): in mig profiles, NVML does not report it" % (e, ours[e]["name"]))
            continue
        o, t = ours[e], theirs[e]
        engines = o["engines"]
        size = o["memory_slices"]
        pairs = [
            ("id", o["id"], t["id"]),
            ("name", o["name"], t["name"]),
            ("compute slices", o["compute_slices"], t["slice_count"]),
            ("instances", o["instances_total"], t["instance_count"]),
            ("SMs", o["sms"], t["sms"]),
            ("memory MiB", o["memory_mib"], t["memory_mib"]),
            ("engines CE/DEC/ENC/JPEG/OFA",
             [engines["copy"], engines["decoders"], engines["encoders"], engines["jpeg"], engines["ofa"]],
             t["engines"]),
            ("placements", [[s, size] for s in o["placements"]], t["placements"]),
        ]
        for what, a, b in pairs:
            if a != b:
                differences.append("enum %d (%s): %s: mig profiles %r, NVML %r" % (e, t["name"], what, a, b))
    for d in differences:
        print(d)
    print("%d profiles compared on GPU %d (%s, driver %s): %d differences" % (
        len(set(ours) & set(theirs)), nvml["index"], nvml["name"], nvml["driver_version"], len(differences)))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
