#!/usr/bin/env python3
"""Compares two documents of tests/nvidia/pynvml_readonly.py (a real GPU's, the
simulator's) field for field; prints each difference and exits 1 when there is one.

Left out: what names one board rather than a kind of GPU (UUID, serial, board id, PCI
domain, bus and device numbers and bus ids). Everything else, the engine counts of every
MIG profile and the count of compute processes included, must be equal (record and
compare on idle GPUs).
"""

import json
import sys

IDS = {"uuid", "serial", "board_id", "busId", "busIdLegacy", "bus", "device", "domain"}


def walk(real, sim, path, out):
    if isinstance(real, dict) and isinstance(sim, dict):
        for key in sorted(set(real) | set(sim)):
            if key in IDS:
                continue
            walk(real.get(key, "<missing>"), sim.get(key, "<missing>"), path + "." + key, out)
    elif isinstance(real, list) and isinstance(sim, list) and len(real) == len(sim):
        for i, (a, b) in enumerate(zip(real, sim)):
            walk(a, b, "%s[%d]" % (path, i), out)
    elif real != sim:
        out.append("%s: real %r, simulated %r" % (path, real, sim))


def main():
    with open(sys.argv[1]) as f:
        real = json.load(f)
    with open(sys.argv[2]) as f:
        sim = json.load(f)
    differences = []
    walk(real, sim, "", differences)
    for line in differences:
        print(line)
    print("%d differences" % len(differences))
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
