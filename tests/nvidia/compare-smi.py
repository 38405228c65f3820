#!/usr/bin/env python3
"""Compares the real nvidia-smi's outputs with the simulated one's, written by
tests/device/nvidia-smi-sim-vs-real.sh as DIR/real-NAME.txt and DIR/sim-NAME.txt.

Plain outputs (-L, --query-gpu, mig -lgip, -lgipp) must be equal line for line once ids
are masked; `-q`, of which the simulator prints a subset, must give every key it prints
the real tool's value (ids masked), in the real tool's order. Prints each difference and
a summary; exits 1 when there is one.
"""

import os
import re
import sys

# UUIDs, serials, bus ids, board ids and times differ between a board and a simulated one.
MASKS = [
    (re.compile(r"GPU-[0-9a-f-]{36}"), "GPU-<uuid>"),
    (re.compile(r"MIG-[0-9a-f-]{36}"), "MIG-<uuid>"),
    (re.compile(r"\b[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9]\b"), "<bus-id>"),
    (re.compile(r"\b[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9]\b"), "<bus-id>"),
]
# -q keys whose value names the board or the moment.
Q_IDS = {"Timestamp", "Serial Number", "GPU UUID", "Board ID", "Bus", "Device", "Bus Id",
         "GPU PDI", "Minor Number", "Module Id"}
# --query-gpu columns that are ids.
QUERY_IDS = {"uuid", "serial", "pci.bus_id"}


def mask(line):
    for pattern, replacement in MASKS:
        line = pattern.sub(replacement, line)
    return line


def read(path):
    with open(path) as f:
        return f.read().splitlines()


def plain(real, sim):
    out = []
    if len(real) != len(sim):
        out.append("%d lines real, %d simulated" % (len(real), len(sim)))
    for i, (r, s) in enumerate(zip(real, sim)):
        if mask(r) != mask(s):
            out.append("line %d: real %r, simulated %r" % (i + 1, r, s))
    return out


def q_entries(lines):
    """(path, value) per `key : value` line, the path being the keys above it by indent."""
    entries, stack = [], []
    for line in lines:
        m = re.match(r"^( *)(\S.*?)\s*(?::\s(.*))?$", line)
        if not m or not line.strip() or line.startswith("="):
            continue
        depth = len(m.group(1)) // 4
        key = mask(m.group(2).rstrip(" :"))
        stack = stack[:depth] + [key]
        if m.group(3) is not None:
            entries.append(("/".join(stack), m.group(3).strip()))
    return entries


def q(real, sim):
    out = []
    real_entries = q_entries(real)
    real_values = {}
    for path, value in real_entries:
        real_values.setdefault(path, value)
    last = -1
    order = [p for p, _ in real_entries]
    for path, value in q_entries(sim):
        key = path.split("/")[-1]
        if path not in real_values:
            out.append("-q %s: printed by the simulator, not by the real tool" % path)
            continue
        if key not in Q_IDS and mask(real_values[path]) != mask(value):
            out.append("-q %s: real %r, simulated %r" % (path, real_values[path], value))
        where = order.index(path)
        if where < last:
            out.append("-q %s: out of the real tool's order" % path)
        last = max(last, where)
    return out


def query(real, sim):
    out = plain(real[:1], sim[:1])  # the header
    header = [h.strip().split(" ")[0] for h in real[0].split(",")] if real else []
    if len(real) != len(sim):
        out.append("%d rows real, %d simulated" % (len(real), len(sim)))
    for i, (r, s) in enumerate(zip(real[1:], sim[1:])):
        if len(r.split(",")) != len(s.split(",")):
            out.append("query row %d: %d columns real, %d simulated"
                       % (i + 1, len(r.split(",")), len(s.split(","))))
        for col, (a, b) in enumerate(zip(r.split(","), s.split(","))):
            name = header[col] if col < len(header) else str(col)
            if name not in QUERY_IDS and a.strip() != b.strip():
                out.append("query row %d %s: real %r, simulated %r" % (i + 1, name, a, b))
    return out


def main():
    directory = sys.argv[1]
    names = sorted(f[5:-4] for f in os.listdir(directory) if f.startswith("real-"))
    total = 0
    for name in names:
        real = read(os.path.join(directory, "real-%s.txt" % name))
        sim = read(os.path.join(directory, "sim-%s.txt" % name))
        if name == "q":
            differences = q(real, sim)
        elif name == "query":
            differences = query(real, sim)
        else:
            differences = plain(real, sim)
        for d in differences:
            print("%s: %s" % (name, d))
        print("%s: %d differences" % (name, len(differences)))
        total += len(differences)
    print("total: %d differences" % total)
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
