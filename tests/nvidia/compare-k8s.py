"""Compares what NVIDIA's GFD and device plugin made of gpushare's files with gpushare's
own view of the node, field for field (tests/nvidia/k8s-by-hand.sh's results).

    python3 compare-k8s.py RESULTS_DIR

Each NODE/PROFILE directory holds apply-exit-code and apply.txt, the agent's
device-plugin.yaml and labels.txt, status.json (`gpushare-ctl status --json`),
export-device-plugin.yaml and export-labels.txt, gfd/ (GFD's labels) and plugin/
(standin.json from tests/nvidia/kubelet-standin, mps-pipe.txt under MPS).

From status.json this derives what each must say (the contract of issue 40):
  - whole GPUs are those without MIG; a MIG device is a compute instance spanning its GPU
    instance (the plugin exposes no other), named by its profile with `+` written `.`
  - migStrategy: none without a MIG GPU, single when every GPU has MIG and one device kind,
    else mixed
  - the whole GPUs' sharing (status' gpus[].sharing.strategy): mps -> replicas = 100 /
    active_thread_percentage; time-slicing -> status' replicas, or, where status has none,
    the profile's (the run's profile.toml, else agent/src/profile/builtin/NAME.toml), said so
  - gpushare's config: version v1, flags.migStrategy, flags.mpsRoot (= the MPS root, two
    levels above status' pipe_directory) only under MPS, sharing.{mps,timeSlicing} with
    one resource nvidia.com/gpu and the replicas; export --format device-plugin parses to
    the same
  - gpushare's labels: gpushare.io/profile, /state=success, per GPU .sharing and the MIG
    counts, MPS replicas/thread-percentage/memory-limit-mib, time-slicing replicas/interval;
    every key and value valid under NFD's rules; no nvidia.com/ or kubernetes.io key;
    export --format labels says the same
  - GFD: tests/nvidia/compare-gfd.py's field-for-field check (the strategy and replicas
    from gpushare's config), and gpu.replicas, gpu.sharing-strategy, the -SHARED suffix,
    mps.capable, mig.strategy and mig-<kind>.count against gpushare's labels
  - the device plugin: the resources registered and their device counts (replicas
    included), device ids (UUIDs, `::n` for replicas) against status' UUIDs, all healthy,
    NVIDIA_VISIBLE_DEVICES of the Allocate; under MPS CUDA_MPS_PIPE_DIRECTORY =
    /mps/nvidia.com/gpu/pipe and a mount whose host path is <mpsRoot>/nvidia.com/gpu/pipe,
    resolving to status' pipe_directory
  - a refused apply (the only one expected: all-mps on a node of several GPUs, the
    plugin's one MPS daemon per resource) leaves both files byte for byte as they were

Prints one line per compared field ("ok", or "DIFF"/"MISSING"/"EXTRA"/"FAIL"), "note"
lines, and a summary; exits 1 on any disagreement.
"""
import importlib.util
import json
import os
import pathlib
import re
import sys
import tomllib

try:
    import yaml
except ImportError:
    sys.exit("compare-k8s.py: PyYAML is needed (python3 -m pip install pyyaml)")

HERE = pathlib.Path(__file__).resolve().parent
BUILTIN = HERE.parent.parent / "agent" / "src" / "profile" / "builtin"
_spec = importlib.util.spec_from_file_location("compare_gfd", HERE / "compare-gfd.py")
compare_gfd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_gfd)

NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MIB = 1 << 20


class Out:
    def __init__(self):
        self.lines, self.n, self.bad = [], 0, 0

    def eq(self, tag, field, got, want, a="got", b="gpushare"):
        self.n += 1
        if got == want:
            if len(show(got)) > 100:
                self.lines.append("  ok    %s %s %s=%s: the same (%d characters)" % (tag, field, a, b, len(show(got))))
            else:
                self.lines.append("  ok    %s %s %s=%s %s=%s" % (tag, field, a, show(got), b, show(want)))
            return True
        self.bad += 1
        kind = "MISSING" if got is None else "EXTRA" if want is None else "DIFF"
        self.lines.append("%-7s %s %s %s=%s %s=%s" % (kind, tag, field, a, show(got), b, show(want)))
        return False

    def fail(self, tag, what):
        self.n += 1
        self.bad += 1
        self.lines.append("FAIL    %s %s" % (tag, what))

    def note(self, tag, what):
        self.lines.append("note    %s %s" % (tag, what))


def show(v):
    return "(absent)" if v is None else str(v)


def read_labels(path):
    labels = {}
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        k, _, v = line.partition("=")
        labels[k] = v
    return labels


def spans(inst):
    """Whether a GPU instance is one compute instance of all its slices (`3g` -> 3)."""
    cis = inst.get("compute_instances", [])
    m = re.match(r"^(\d+)g", inst["profile"])
    return len(cis) == 1 and m is not None and cis[0].get("compute_slices") == int(m.group(1))


def mig_kinds(gpu):
    """{kind: count} of the MIG devices the plugin exposes on a GPU, and those it does not."""
    kinds, hidden = {}, []
    for inst in gpu.get("instances", []):
        base = inst["profile"].replace("+", ".")
        if spans(inst):
            kinds[base] = kinds.get(base, 0) + 1
        else:
            hidden.append(base)
    return kinds, hidden


def profile_replicas(name, run):
    """The time-slicing replicas of the run's profile.toml (the script's), or the built-in."""
    path = run / "profile.toml"
    if not path.exists():
        path = BUILTIN / (str(name) + ".toml")
    if not path.exists():
        return None
    for rule in tomllib.loads(path.read_text()).get("gpu", []):
        ts = (rule.get("sharing") or {}) if isinstance(rule.get("sharing"), dict) else {}
        r = (ts.get("time-slicing") or {}).get("replicas")
        if r:
            return r
    return None


def expected(status, out, tag, run):
    """What status says, as the plugin and the labels should see it."""
    gpus = status["gpus"]
    whole = [g for g in gpus if not g.get("mig_enabled")]
    migs = [g for g in gpus if g.get("mig_enabled")]
    kinds = {}
    for g in migs:
        k, hidden = mig_kinds(g)
        for name, c in k.items():
            kinds[name] = kinds.get(name, 0) + c
        if hidden:
            out.note(tag, "GPU %d has MIG instances in several compute instances (%s): not exposed by the plugin" % (g["index"], ", ".join(hidden)))
    if not migs:
        strategy = "none"
    elif not whole and len(kinds) == 1:
        strategy = "single"
    else:
        strategy = "mixed"
    sharing = {g.get("sharing", {}).get("strategy", "exclusive") for g in whole}
    share = None  # (kind, replicas) of nvidia.com/gpu
    if len(sharing) > 1:
        out.fail(tag, "whole GPUs shared differently (%s): the plugin cannot say it" % ", ".join(sorted(sharing)))
    elif sharing == {"mps"}:
        tps = {g["sharing"]["mps"]["active_thread_percentage"] for g in whole}
        tp = tps.pop() if len(tps) == 1 else None
        share = ("mps", 100 // tp if tp else None)
    elif sharing == {"time-slicing"}:
        reps = {g["sharing"].get("replicas") for g in whole}
        r = reps.pop() if len(reps) == 1 else None
        if r is None:
            r = profile_replicas(status.get("active_profile"), run)
            out.note(tag, "status has no time-slicing replica count; the profile %s says %s" % (status.get("active_profile"), r))
        share = ("time-slicing", r)
    return {"whole": whole, "migs": migs, "kinds": kinds, "strategy": strategy, "share": share}


def check_config(run, tag, status, exp, out):
    cfg_file = run / "device-plugin.yaml"
    if not cfg_file.exists():
        out.fail(tag, "no device-plugin.yaml")
        return None
    cfg = yaml.safe_load(cfg_file.read_text()) or {}
    flags = cfg.get("flags") or {}
    out.eq(tag, "config version", cfg.get("version"), "v1")
    out.eq(tag, "config flags.migStrategy", flags.get("migStrategy"), exp["strategy"])
    sharing = cfg.get("sharing") or {}
    share = exp["share"]
    key = {"mps": "mps", "time-slicing": "timeSlicing"}.get(share[0]) if share else None
    out.eq(tag, "config sharing", ",".join(sorted(sharing)) or None, key)
    if key and key in sharing:
        res = sharing[key].get("resources") or []
        out.eq(tag, "config sharing.%s.resources[].name" % key, ",".join(r.get("name", "?") for r in res), "nvidia.com/gpu")
        out.eq(tag, "config sharing.%s.resources[0].replicas" % key, res[0].get("replicas") if res else None, share[1])
    if share and share[0] == "mps":
        pipe = exp["whole"][0]["sharing"]["mps"]["pipe_directory"]
        out.eq(tag, "config flags.mpsRoot", flags.get("mpsRoot"), os.path.dirname(os.path.dirname(pipe)))
    else:
        out.eq(tag, "config flags.mpsRoot", flags.get("mpsRoot"), None)
    exported = run / "export-device-plugin.yaml"
    if exported.exists() and exported.stat().st_size:
        out.eq(tag, "export --format device-plugin (parsed)", json.dumps(yaml.safe_load(exported.read_text()), sort_keys=True),
               json.dumps(cfg, sort_keys=True), "export", "file")
    else:
        out.fail(tag, "export --format device-plugin printed nothing: %s" % (run / "export-device-plugin.stderr").read_text().strip())
    return cfg


def check_labels(run, tag, status, exp, out):
    labels = read_labels(run / "labels.txt")
    if labels is None:
        out.fail(tag, "no labels file")
        return {}
    want = {"gpushare.io/profile": status.get("active_profile"), "gpushare.io/state": "success"}
    for g in status["gpus"]:
        p = "gpushare.io/gpu-%d." % g["index"]
        if g.get("mig_enabled"):
            want[p + "sharing"] = "mig"
            kinds, _ = mig_kinds(g)
            for name, c in kinds.items():
                want[p + "mig." + name] = str(c)
            continue
        s = g.get("sharing", {})
        kind = s.get("strategy", "exclusive")
        want[p + "sharing"] = kind
        if kind == "mps":
            m = s["mps"]
            want[p + "mps.replicas"] = str(100 // m["active_thread_percentage"])
            want[p + "mps.thread-percentage"] = str(m["active_thread_percentage"])
            want[p + "mps.memory-limit-mib"] = str(m["pinned_memory_limit_bytes"] // MIB)
        if kind == "time-slicing":
            want[p + "time-slicing.replicas"] = str(exp["share"][1]) if exp["share"] else None
            want[p + "time-slicing.interval"] = s.get("interval")
    for k in sorted(want):
        out.eq(tag, "label " + k, labels.get(k), want[k])
    for k in sorted(set(labels) - set(want)):
        out.note(tag, "label %s=%s not checked against status" % (k, labels[k]))
    # NFD's rules: <prefix>/<name>, name and value <= 63 of [A-Za-z0-9._-], alphanumeric at the ends
    for k, v in sorted(labels.items()):
        prefix, _, name = k.rpartition("/")
        ok = bool(NAME.match(name)) and (v == "" or bool(NAME.match(v))) and (prefix == "" or bool(PREFIX.match(prefix)))
        ok = ok and not prefix.endswith("kubernetes.io") and not prefix.endswith("k8s.io") and prefix != "nvidia.com"
        if not ok:
            out.fail(tag, "label %s=%s is not valid for NFD's local source (or not gpushare's to write)" % (k, v))
        else:
            out.n += 1
    exported = read_labels(run / "export-labels.txt")
    out.eq(tag, "export --format labels", json.dumps(exported, sort_keys=True), json.dumps(labels, sort_keys=True), "export", "file")
    return labels


def check_gfd(run, tag, status, exp, labels, out):
    gr = run / "gfd"
    if not (gr / "strategy").exists():
        out.fail(tag, "no GFD run")
        return
    lines = []
    n, bad = compare_gfd.compare(gr, lines)
    out.lines.extend(l.replace(" gpushare=", " status=") for l in lines)
    out.n += n
    out.bad += bad if n else 1
    gfd = compare_gfd.read_labels(gr / "labels.txt") if (gr / "labels.txt").exists() else {}
    # against gpushare's labels
    whole = [g["index"] for g in exp["whole"]]
    sharings = {labels.get("gpushare.io/gpu-%d.sharing" % i) for i in whole}
    if whole and len(sharings) == 1:
        s = sharings.pop()
        reps = "1"
        if s in ("mps", "time-slicing"):
            reps = labels.get("gpushare.io/gpu-%d.%s.replicas" % (whole[0], s))
        out.eq(tag, "gfd nvidia.com/gpu.replicas", gfd.get("nvidia.com/gpu.replicas"), reps, "gfd", "labels")
        out.eq(tag, "gfd nvidia.com/gpu.sharing-strategy", gfd.get("nvidia.com/gpu.sharing-strategy"),
               "none" if s == "exclusive" else s, "gfd", "labels")
        product = gfd.get("nvidia.com/gpu.product", "")
        out.eq(tag, "gfd nvidia.com/gpu.product ends -SHARED", product.endswith("-SHARED"), reps not in ("1", None), "gfd", "labels")
        out.eq(tag, "gfd nvidia.com/mps.capable", gfd.get("nvidia.com/mps.capable"), "true" if s == "mps" else "false", "gfd", "labels")
    if any(k.startswith("nvidia.com/mps.capable") for k in labels):
        out.fail(tag, "gpushare's labels carry nvidia.com/mps.capable")
    cfg = yaml.safe_load((run / "device-plugin.yaml").read_text()) or {}
    want = (cfg.get("flags") or {}).get("migStrategy")
    out.eq(tag, "gfd nvidia.com/mig.strategy", gfd.get("nvidia.com/mig.strategy"), None if want == "none" else want, "gfd", "config")
    counts = {}
    for k, v in labels.items():
        m = re.match(r"^gpushare\.io/gpu-\d+\.mig\.(.+)$", k)
        if m and re.match(r"^\d+$", v):
            counts[m.group(1)] = counts.get(m.group(1), 0) + int(v)
    if want == "mixed":
        for kind in sorted(set(counts) | {k[len("nvidia.com/mig-"):-len(".count")] for k in gfd if re.match(r"^nvidia\.com/mig-.+\.count$", k)}):
            out.eq(tag, "gfd nvidia.com/mig-%s.count" % kind, gfd.get("nvidia.com/mig-%s.count" % kind),
                   str(counts[kind]) if kind in counts else None, "gfd", "labels")
    if want == "single" and len(counts) == 1:
        (kind, c), = counts.items()
        out.eq(tag, "gfd nvidia.com/gpu.count (single)", gfd.get("nvidia.com/gpu.count"), str(c), "gfd", "labels")
        out.eq(tag, "gfd nvidia.com/gpu.product ends -MIG-<kind>", gfd.get("nvidia.com/gpu.product", "").endswith("-MIG-" + kind), True, "gfd", "labels")


def check_plugin(run, tag, status, exp, cfg, out):
    pr = run / "plugin"
    try:
        got = json.loads((pr / "standin.json").read_text())
    except Exception as e:
        tail = (pr / "plugin.log").read_text().splitlines()[-3:] if (pr / "plugin.log").exists() else []
        out.fail(tag, "no stand-in JSON (%s); plugin log: %s" % (e, " | ".join(tail)))
        return
    out.eq(tag, "plugin still serving when the stand-in was done", (pr / "plugin-exit").read_text().strip(), "running (stopped by the script)", "plugin", "expected")
    share = exp["share"]
    reps = share[1] if share else 1
    want = {}  # resource -> base ids
    if exp["strategy"] == "single":
        want["nvidia.com/gpu"] = sorted(i["compute_instances"][0]["uuid"] for g in exp["migs"] for i in g.get("instances", []) if spans(i))
    else:
        if exp["whole"]:
            want["nvidia.com/gpu"] = sorted(g["uuid"] for g in exp["whole"])
        if exp["strategy"] == "mixed":
            for g in exp["migs"]:
                for inst in g.get("instances", []):
                    if spans(inst):
                        want.setdefault("nvidia.com/mig-" + inst["profile"].replace("+", "."), []).append(inst["compute_instances"][0]["uuid"])
    resources = {r["registration"]["resource_name"]: r for r in got.get("resources", [])}
    out.eq(tag, "plugin resources", ",".join(sorted(resources)), ",".join(sorted(want)), "plugin", "status")
    for name in sorted(set(want) & set(resources)):
        r = resources[name]
        n = reps if name == "nvidia.com/gpu" else 1
        out.eq(tag, "plugin %s count" % name, r["count"], len(want[name]) * n, "plugin", "status")
        out.eq(tag, "plugin %s healthy" % name, r["healthy"], r["count"], "plugin", "listed")
        ids = [d["id"] for d in r["devices"]]
        base = sorted({i.split("::")[0] for i in ids})
        out.eq(tag, "plugin %s device UUIDs" % name, ",".join(base), ",".join(sorted(want[name])), "plugin", "status")
        if n > 1:
            out.eq(tag, "plugin %s ids per UUID" % name, sorted({sum(1 for i in ids if i.split("::")[0] == u) for u in base}), [n], "plugin", "replicas")
        a = r.get("allocate") or {}
        if a.get("error"):
            out.fail(tag, "plugin %s Allocate: %s" % (name, a["error"]))
            continue
        if a.get("device_ids"):
            out.eq(tag, "plugin %s Allocate NVIDIA_VISIBLE_DEVICES" % name, a["envs"].get("NVIDIA_VISIBLE_DEVICES"),
                   a["device_ids"][0].split("::")[0], "plugin", "allocated")
        if name == "nvidia.com/gpu" and share and share[0] == "mps":
            root = (cfg.get("flags") or {}).get("mpsRoot")
            out.eq(tag, "plugin Allocate CUDA_MPS_PIPE_DIRECTORY", a["envs"].get("CUDA_MPS_PIPE_DIRECTORY"), "/mps/nvidia.com/gpu/pipe", "plugin", "chart")
            mounts = {m["container_path"]: m["host_path"] for m in a.get("mounts", [])}
            out.eq(tag, "plugin Allocate mount of /mps/nvidia.com/gpu/pipe", mounts.get("/mps/nvidia.com/gpu/pipe"),
                   os.path.join(root, "nvidia.com/gpu/pipe") if root else None, "plugin", "mpsRoot")
            resolved = None
            for line in (pr / "mps-pipe.txt").read_text().splitlines() if (pr / "mps-pipe.txt").exists() else []:
                parts = line.split()
                if parts and parts[0] == "/mps/nvidia.com/gpu/pipe":
                    resolved = parts[-1]
            pipes = {g["sharing"]["mps"]["pipe_directory"] for g in exp["whole"]}
            out.eq(tag, "plugin Allocate mount host path, resolved", resolved, os.path.realpath(pipes.pop()) if len(pipes) == 1 else sorted(pipes),
                   "plugin", "status.pipe_directory")
    for name in sorted(set(resources) - set(want)):
        out.fail(tag, "plugin registered %s, which gpushare did not make" % name)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: compare-k8s.py RESULTS_DIR")
    res = pathlib.Path(sys.argv[1])
    runs = sorted(p.parent for p in res.glob("*/*/apply-exit-code"))
    if not runs:
        sys.exit("compare-k8s.py: no runs under %s" % res)
    out = Out()
    summary = []
    for run in runs:
        tag = "/".join(run.parts[-2:])
        status = json.loads((run / "status.json").read_text())
        ngpus = len(status["gpus"])
        before = out.bad
        rc = (run / "apply-exit-code").read_text().strip()
        if rc != "0":
            why = [l for l in (run / "apply.txt").read_text().splitlines() if l.strip()]
            why = why[-1] if why else "(nothing said)"
            expected_refusal = run.name == "all-mps" and ngpus > 1
            if expected_refusal:
                out.note(tag, "refused, as the plugin's one MPS daemon per resource wants: %s" % why)
            else:
                out.fail(tag, "apply refused: %s" % why)
            for line in (run / "unchanged.txt").read_text().splitlines():
                out.eq(tag, "after the refusal: " + line.split(":")[0], line.split(": ", 1)[1], "unchanged", "files", "expected")
            summary.append("%s: refused%s (%s)" % (tag, "" if expected_refusal else " UNEXPECTEDLY", why))
            continue
        exp = expected(status, out, tag, run)
        cfg = check_config(run, tag, status, exp, out)
        labels = check_labels(run, tag, status, exp, out)
        check_gfd(run, tag, status, exp, labels, out)
        check_plugin(run, tag, status, exp, cfg or {}, out)
        summary.append("%s: %s" % (tag, "agree" if out.bad == before else "%d disagreements" % (out.bad - before)))
    print("\n".join(out.lines))
    print("\n".join("run " + s for s in summary))
    print("summary: %d runs, %d fields compared, %d agree, %d disagree" % (len(runs), out.n, out.n - out.bad, out.bad))
    sys.exit(1 if out.bad else 0)


if __name__ == "__main__":
    main()
