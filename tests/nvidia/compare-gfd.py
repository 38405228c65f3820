"""Compares NVIDIA GFD's labels with gpushare's own view of the node, field for field.

    python3 compare-gfd.py RESULTS_DIR        (tests/nvidia/gfd-by-hand.sh's results)
    python3 compare-gfd.py RUN_DIR...          (single runs)

A run directory holds labels.txt (GFD's --output-file), exit-code, strategy (GFD's
--mig-strategy), status.json (`gpushare-ctl status --json`), mig-profiles.json
(`gpushare-ctl mig profiles --json`), and plugin-config.yaml when GFD had a sharing config.

From gpushare's JSON this derives what GFD's labels must say, as GFD v0.20.0 computes them
(internal/lm/mig-strategy.go, resource.go):
  - a MIG device is a compute instance; its name is go-nvlib's: the GPU-instance profile
    (`1g.10gb`, `+` written `.`: `1g.10gb.me`) when the compute instance spans the GPU
    instance, else `<c>c.<profile>`
  - nvidia.com/mig-<name>.count (mixed): compute instances of that name on the node;
    .memory = the profile's memory_mib, .multiprocessors = its sms (a whole-instance
    compute instance only: gpushare's JSON has no SM count of a smaller one),
    .slices.gi = its compute_slices, .slices.ci = the compute instance's compute_slices,
    .engines.{copy,decoder,encoder,jpeg,ofa} = its engines
  - single: all GPUs MIG-enabled, none empty, one name: nvidia.com/gpu.* carries that MIG
    device (count, product <model>-MIG-<name>, memory, the attributes above); otherwise
    product <model>-MIG-INVALID and count 0; no MIG-enabled GPU: as none
  - none, mixed: nvidia.com/gpu.count = the GPUs, gpu.product = the model, gpu.memory =
    memory_total_bytes in MiB (rounded down); where a GPU is whole, gpu.sharing-strategy
    = status' sharing strategy of the whole GPUs (exclusive: none), gpu.replicas (and the
    product's -SHARED) = the replicas of the device-plugin config GFD was given (gpushare's
    status has no replica count for time-slicing)
  - nvidia.com/mig.strategy = the strategy, absent for none; nvidia.com/mig.capable =
    whether `mig profiles --json` lists GPUs (it answers an error on a node without MIG)
  - gpu.product: GFD's sanitised NVML name. gpushare's JSON has no NVML name (status'
    `model` is the catalog's display name: `B300-288GB` where NVML says `NVIDIA B300 SXM6
    AC`), so it is taken from the catalog entry `mig profiles --json` names
    (gpus[].catalog.key -> catalog/models/[simulator-only/]<key>.toml, nvml_name), or from
    a status field `name` where there is one; a node without MIG (no catalog key in the
    JSON): the catalog entry whose display_name is status' model

Prints one line per compared field ("ok", or "DIFF"/"MISSING"/"EXTRA" with both values),
a line per run GFD did not finish, and a summary; exits 1 on any disagreement or failed run.
"""
import json
import pathlib
import re
import sys
import tomllib

CATALOG = pathlib.Path(__file__).resolve().parent.parent.parent / "catalog" / "models"

ENGINES = {"copy": "copy", "decoder": "decoders", "encoder": "encoders", "jpeg": "jpeg", "ofa": "ofa"}


def sanitise(s):
    return "-".join(re.sub(r"[^A-Za-z0-9-_. ]", "", s).split())


def read_labels(path):
    labels = {}
    for line in path.read_text().splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            labels[k] = v
    return labels


def sharing_replicas(run):
    """(strategy, replicas) of nvidia.com/gpu in the run's device-plugin config."""
    cfg = run / "plugin-config.yaml"
    if not cfg.exists():
        return None
    text = cfg.read_text()
    strategy = "mps" if re.search(r"^\s*mps:", text, re.M) else "time-slicing"
    m = re.search(r"replicas:\s*(\d+)", text)
    return strategy, int(m.group(1)) if m else 1


def mig_devices(status, profiles):
    """[(gpu index, name, attrs)] for every compute instance on MIG-enabled GPUs."""
    out = []
    for gpu in status["gpus"]:
        if not gpu.get("mig_enabled"):
            continue
        table = {p["name"]: p for p in profiles_of(profiles, gpu["index"])}
        for inst in gpu.get("instances", []):
            prof = table.get(inst["profile"])
            for ci in inst.get("compute_instances", []):
                g = prof["compute_slices"] if prof else None
                c = ci["compute_slices"]
                base = inst["profile"].replace("+", ".")
                name = base if c == g else "%dc.%s" % (c, base)
                attrs = {}
                if prof:
                    attrs["memory"] = prof["memory_mib"]
                    if c == g:
                        attrs["multiprocessors"] = prof["sms"]
                    attrs["slices.gi"] = g
                    attrs["slices.ci"] = c
                    for label, key in ENGINES.items():
                        attrs["engines." + label] = prof["engines"][key]
                out.append((gpu["index"], name, attrs))
    return out


def nvml_name(gpu, profiles):
    """The GPU's NVML name as gpushare knows it (see the module's notes)."""
    if gpu.get("name"):
        return gpu["name"]
    for g in profiles.get("gpus", []):
        key = (g.get("catalog") or {}).get("key") if g["index"] == gpu["index"] else None
        for path in (CATALOG / (str(key) + ".toml"), CATALOG / "simulator-only" / (str(key) + ".toml")):
            if key and path.exists():
                return tomllib.loads(path.read_text())["nvml_name"]
    for path in sorted(CATALOG.glob("**/*.toml")):  # a node without MIG: by display name
        entry = tomllib.loads(path.read_text())
        if entry.get("display_name") == gpu["model"] and "nvml_name" in entry:
            return entry["nvml_name"]
    return "NVIDIA " + gpu["model"]


def profiles_of(profiles, index):
    for gpu in profiles.get("gpus", []):
        if gpu["index"] == index:
            return gpu["profiles"]
    return []


def expected(run):
    status = json.loads((run / "status.json").read_text())
    profiles = json.loads((run / "mig-profiles.json").read_text())
    strategy = (run / "strategy").read_text().strip()
    gpus = status["gpus"]
    names_nvml = {nvml_name(g, profiles) for g in gpus}
    product = sanitise(names_nvml.pop()) if len(names_nvml) == 1 else None
    exp = {}  # label -> value (str), or None: must be absent
    share = sharing_replicas(run)
    whole = [g for g in gpus if not g.get("mig_enabled")]
    migs = [g for g in gpus if g.get("mig_enabled")]
    devices = mig_devices(status, profiles)
    names = {}
    for _, name, attrs in devices:
        names.setdefault(name, {"count": 0, "attrs": attrs})["count"] += 1

    def full_gpu_labels():
        exp["nvidia.com/gpu.count"] = str(len(gpus))
        if product:
            shared = share is not None and share[1] > 1 and whole
            exp["nvidia.com/gpu.product"] = product + ("-SHARED" if shared else "")
        exp["nvidia.com/gpu.memory"] = str(gpus[0]["memory_total_bytes"] // (1 << 20))
        if whole:  # the whole GPUs' labeler comes last, and carries the sharing config
            exp["nvidia.com/gpu.replicas"] = str(share[1] if share else 1)
            # gpushare's own word for how the whole GPUs are shared (exclusive: none)
            kinds = {g.get("sharing", {}).get("strategy", "exclusive") for g in whole}
            kind = kinds.pop() if len(kinds) == 1 else "(GPUs differ: %s)" % ", ".join(sorted(kinds))
            exp["nvidia.com/gpu.sharing-strategy"] = "none" if kind == "exclusive" else kind
        else:
            exp["nvidia.com/gpu.replicas"] = "0"
            exp["nvidia.com/gpu.sharing-strategy"] = "none"

    exp["nvidia.com/mig.strategy"] = None if strategy == "none" else strategy
    # gpushare lists MIG profiles for a node where a GPU has MIG, else answers an error
    exp["nvidia.com/mig.capable"] = "true" if profiles.get("gpus") else "false"
    if strategy in ("none", "mixed"):
        full_gpu_labels()
    if strategy == "mixed":
        for name, d in names.items():
            prefix = "nvidia.com/mig-%s." % name
            exp[prefix + "count"] = str(d["count"])
            for k, v in d["attrs"].items():
                exp[prefix + k] = str(v)
    if strategy == "single":
        empty = any(not g.get("instances") for g in migs)
        if not migs:
            full_gpu_labels()
        elif empty or whole or len(names) != 1:
            exp["nvidia.com/gpu.count"] = "0"
            if product:
                exp["nvidia.com/gpu.product"] = product + "-MIG-INVALID"
            exp["nvidia.com/gpu.memory"] = "0"
        else:
            (name, d), = names.items()
            exp["nvidia.com/gpu.count"] = str(d["count"])
            if product:
                exp["nvidia.com/gpu.product"] = product + "-MIG-" + name
            for k, v in d["attrs"].items():
                exp["nvidia.com/gpu." + k] = str(v)
    return exp, set(names)


def compare(run, out):
    """Lines into out; returns (fields compared, disagreements)."""
    tag = "/".join(run.parts[-3:])
    rc = (run / "exit-code").read_text().strip() if (run / "exit-code").exists() else "?"
    labels_file = run / "labels.txt"
    if rc != "0" or not labels_file.exists():
        err = ""
        stderr = run / "stderr.txt"
        if stderr.exists():
            errs = [l for l in stderr.read_text().splitlines() if re.match(r"^[EF]\d{4} ", l)]
            err = errs[-1].split("] ", 1)[-1] if errs else ""
        out.append("FAIL    %s: GFD exited %s, no labels to compare: %s" % (tag, rc, err))
        return 0, 1
    labels = read_labels(labels_file)
    exp, names = expected(run)
    n = bad = 0
    for key in sorted(exp):
        want, got = exp[key], labels.get(key)
        n += 1
        if want == got:
            out.append("  ok    %s %s gfd=%s gpushare=%s" % (tag, key, got or "(absent)", want or "(absent)"))
        elif got is None:
            bad += 1
            out.append("MISSING %s %s gfd=(absent) gpushare=%s" % (tag, key, want))
        elif want is None:
            bad += 1
            out.append("EXTRA   %s %s gfd=%s gpushare=(absent)" % (tag, key, got))
        else:
            bad += 1
            out.append("DIFF    %s %s gfd=%s gpushare=%s" % (tag, key, got, want))
    # MIG labels GFD wrote for a device gpushare does not have
    for key in sorted(labels):
        m = re.match(r"^nvidia\.com/mig-(.+)\.count$", key)
        if m and key not in exp:
            n += 1
            bad += 1
            out.append("EXTRA   %s %s gfd=%s gpushare=(no such MIG device; has %s)"
                       % (tag, key, labels[key], ", ".join(sorted(names)) or "none"))
    return n, bad


def main():
    args = [pathlib.Path(a) for a in sys.argv[1:]]
    if not args:
        sys.exit("usage: compare-gfd.py RESULTS_DIR | RUN_DIR...")
    runs = []
    for a in args:
        if (a / "strategy").exists():
            runs.append(a)
        else:
            runs.extend(sorted(p.parent for p in a.glob("*/*/gfd-*/strategy")))
    if not runs:
        sys.exit("compare-gfd.py: no GFD runs under %s" % ", ".join(map(str, args)))
    out = []
    fields = bad = failed = 0
    for run in runs:
        n, b = compare(run, out)
        fields += n
        bad += b if n else 0
        failed += 0 if n else 1
    print("\n".join(out))
    print("summary: %d GFD runs, %d finished, %d fields compared, %d agree, %d disagree"
          % (len(runs), len(runs) - failed, fields, fields - bad, bad))
    sys.exit(1 if bad or failed else 0)


if __name__ == "__main__":
    main()
