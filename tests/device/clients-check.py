"""Checks a clients-attribution.sh run (its OUT_DIR, unpacked): at each point (A, B, C),
for every PyTorch client, gpushare's `clients --json` entry against NVML's compute list
and against what the client allocated (torch_client.py's JSON): the user, how it reaches
the GPU (mps or gpu), and the memory, each difference in per cent (the issue asks for
5 % at most). Prints a Markdown table; exits 1 when a client is missing or off by more.

  python3 tests/device/clients-check.py OUT_DIR
"""
import glob
import json
import os
import sys

out = sys.argv[1]
clients = {}
for path in glob.glob(os.path.join(out, "client-*.json")):
    try:
        with open(path) as f:
            c = json.loads(f.readline())
    except (OSError, ValueError):
        continue
    clients[c["pid"]] = (os.path.basename(path)[len("client-"):-len(".json")], c)

bad = 0
print("| point | client | uid | via | gpushare MiB | NVML MiB | allocated MiB | vs NVML | vs allocated |")
print("|---|---|---|---|---|---|---|---|---|")
for tag in ("A", "B", "C"):
    try:
        with open(os.path.join(out, f"clients-{tag}.json")) as f:
            table = json.load(f)
        with open(os.path.join(out, f"nvml-{tag}.json")) as f:
            nvml = json.load(f)
    except (OSError, ValueError):
        print(f"| {tag} | (no record) | | | | | | | |")
        bad += 1
        continue
    listed = {p["pid"]: p for g in nvml["gpus"] for p in g["compute"]}
    mps = {p["pid"] for g in nvml["gpus"] for p in g["mps"]}
    seen = {c["pid"]: c for c in table["clients"]}
    for pid, (label, own) in sorted(clients.items()):
        if pid not in listed:
            continue  # not alive at this point
        mine = seen.get(pid)
        nv = listed[pid]["used_memory_bytes"]
        if mine is None:
            print(f"| {tag} | {label} ({pid}) | {own['uid']} | MISSING | | {nv / 2**20:.0f} | | | |")
            bad += 1
            continue
        got = mine.get("memory_bytes")
        via_ok = mine["via"] == ("mps" if pid in mps else "gpu") and mine.get("uid") == own["uid"]
        vs_nvml = abs(got - nv) / nv * 100 if got and nv else float("nan")
        vs_alloc = abs(got - own["allocated_bytes"]) / own["allocated_bytes"] * 100 if got else float("nan")
        ok = via_ok and vs_nvml <= 5 and vs_alloc <= 5
        bad += not ok
        print(f"| {tag} | {label} ({pid}) | {own['uid']} | {mine['via']}{'' if via_ok else ' WRONG'} | "
              f"{(got or 0) / 2**20:.0f} | {nv / 2**20:.0f} | {own['allocated_bytes'] / 2**20:.0f} | "
              f"{vs_nvml:.2f} % | {vs_alloc:.2f} %{'' if ok else ' (over 5 %)'} |")
sys.exit(1 if bad else 0)
