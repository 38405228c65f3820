#!/usr/bin/env python3
"""Helpers of tests/nvidia/mig-parted-by-hand.sh's matrix (MATRIX=1).

  mig_parted_matrix.py configs MODEL.toml FILE...
                                                the FILE:NAME of every config that matches
                                                the model, in file order: it has an entry
                                                for the model's GPUs (no device-filter, or
                                                one naming a PCI id of the model) and every
                                                such entry names only MIG profiles of the
                                                model (`2c.3g.40gb`: its 3g.40gb); on a
                                                model without MIG, entries with MIG off and
                                                `all-enabled`
  mig_parted_matrix.py mixed CATALOG_DIR OUT    writes a mig-parted file of compute
                                                instances of mixed sizes, configs per MIG
                                                model of the catalog (device-filter: its
                                                PCI ids), named mixed-<model>-<what>
  mig_parted_matrix.py packing STATE.json        GPU 0 of the simulated node's state file
                                                as its GPU instances hold compute instances:
                                                `on 3g.40gb[2c+1c] 3g.40gb[1c+1c]` (sorted;
                                                placements left out), or `off`
  mig_parted_matrix.py same A B                 whether two exports (mig-parted's
                                                `export`, gpushare's `export --format
                                                mig-parted`) say the same of GPU 0: MIG on or
                                                off and the nonzero counts of mig-devices;
                                                exit 1 and one line saying how they differ
"""
import glob
import json
import os
import sys
import tomllib

import yaml


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def filters(entry):
    f = entry.get("device-filter")
    if f is None:
        return None
    return [int(str(x), 16) for x in (f if isinstance(f, list) else [f])]


def configs(model_path, files):
    with open(model_path, "rb") as f:
        model = tomllib.load(f)
    ids = [int(x, 16) for x in model["pci_device_ids"]]
    names = {p["name"] for p in model.get("mig_profile", [])}

    def known(name):
        head, _, rest = name.partition("c.")
        gi = rest if head.isdigit() and rest else name
        return gi in names

    for path in files:
        for name, entries in load(path)["mig-configs"].items():
            mine = [e for e in entries if filters(e) is None or set(ids) & set(filters(e))]
            if not mine:
                continue
            if names:
                ok = all(known(d) for e in mine for d, n in (e.get("mig-devices") or {}).items() if n)
            else:
                ok = all(not e.get("mig-enabled") or not e.get("mig-devices") for e in mine)
            if ok:
                print(f"{path}:{name}")


def plain(model, slices):
    for p in model.get("mig_profile", []):
        if p["compute_slices"] == slices and "+" not in p["name"] and "-" not in p["name"]:
            return p
    return None


def mixed(catalog, out):
    """Mixed compute-instance sizes per model: what fits one GPU instance, what spills
    into a second, what only another order packs, and what fits no order."""
    doc = {"version": "v1", "mig-configs": {}}
    paths = sorted(glob.glob(os.path.join(catalog, "*.toml")))
    paths += sorted(glob.glob(os.path.join(catalog, "simulator-only", "*.toml")))
    for path in paths:
        with open(path, "rb") as f:
            model = tomllib.load(f)
        if not model.get("mig_profile"):
            continue
        key = model["key"]
        ids = list(model["pci_device_ids"])
        wanted = {}
        g3, g4, g7, g2 = (plain(model, n) for n in (3, 4, 7, 2))
        if g3:
            n = g3["name"]
            wanted["3g-2c-1c"] = {f"2c.{n}": 1, f"1c.{n}": 1}
            wanted["3g-spill"] = {f"2c.{n}": 1, f"1c.{n}": 3}
            wanted["3g-whole-2c-1c"] = {n: 1, f"2c.{n}": 1, f"1c.{n}": 1}
            if g3["max_count"] >= 2:
                wanted["3g-second-order"] = {f"2c.{n}": 2, f"1c.{n}": 2}
        if g4:
            n = g4["name"]
            wanted["4g-2c-1c-1c"] = {f"2c.{n}": 1, f"1c.{n}": 2}
        if g7:
            n = g7["name"]
            wanted["7g-4c-3c"] = {f"4c.{n}": 1, f"3c.{n}": 1}
            wanted["7g-4c-2c-1c"] = {f"4c.{n}": 1, f"2c.{n}": 1, f"1c.{n}": 1}
            wanted["7g-overflow"] = {f"4c.{n}": 1, f"3c.{n}": 1, f"2c.{n}": 1}
        if g2:
            n = g2["name"]
            wanted["2g-1c-1c"] = {f"1c.{n}": 2}
        for what, devices in wanted.items():
            doc["mig-configs"][f"mixed-{key}-{what}"] = [
                {"devices": "all", "device-filter": list(ids), "mig-enabled": True, "mig-devices": devices}
            ]
    with open(out, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)


def gpu0(path):
    doc = load(path)
    entries = next(iter(doc["mig-configs"].values()))
    for e in reversed(entries):  # the last entry for a GPU wins in mig-parted
        d = e.get("devices")
        if d == "all" or (isinstance(d, list) and 0 in d):
            devices = {k: v for k, v in (e.get("mig-devices") or {}).items() if v}
            return bool(e.get("mig-enabled")), devices
    return None


def packing(state, catalog):
    with open(state) as f:
        gpu = json.load(f)["gpus"][0]
    if not gpu["mig_enabled"]:
        return "off"
    names = {}
    for path in glob.glob(os.path.join(catalog, "*.toml")) + glob.glob(os.path.join(catalog, "simulator-only", "*.toml")):
        with open(path, "rb") as f:
            m = tomllib.load(f)
        if m["key"] == gpu["model"] or m.get("nvml_name") == gpu["model"]:
            names = {p["id"]: p["name"] for p in m.get("mig_profile", [])}
    gis = []
    for gi in gpu["instances"]:
        sizes = sorted((ci["size"] for ci in gi.get("compute_instances", [])), reverse=True)
        gis.append(f"{names.get(gi['profile_id'], gi['profile_id'])}[{'+'.join(f'{c}c' for c in sizes)}]")
    return " ".join(["on"] + sorted(gis))


def same(a, b):
    x, y = gpu0(a), gpu0(b)
    if x == y:
        return 0
    print(f"exports differ: {a}: {x}; {b}: {y}")
    return 1


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "configs":
        configs(args[0], args[1:])
    elif cmd == "mixed":
        mixed(args[0], args[1])
    elif cmd == "packing":
        print(packing(args[0], args[1]))
    elif cmd == "same":
        sys.exit(same(args[0], args[1]))
    else:
        sys.exit(__doc__)
