#!/usr/bin/env bash
# Issue 22 on a real GPU host you do not own (MIG, compute mode and time-slice policy
# untouched: the hands-off agent.toml of lib.sh): bench replicas started through their
# gates (this host has no systemd: a new session each) run real CUDA work — the probe's
# built-in launch workload and a PyTorch loop — and are measured, their GPU memory
# attributed through their sessions, their output kept in the caller's log directory, and
# what they hide stopped. Stops every daemon it started.
#   tests/device/h100-isolation.sh BIN_DIR OUT_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv,noheader
export XDG_STATE_HOME=$work/caller-state
start_agent "$work/agent.log"
trap 'echo "== agent log (last 30 lines)"; tail -n 30 "$work/agent.log"' EXIT

echo "== built-in launch workload, 1 and 3 replicas, time-slicing and MPS, 5 s windows"
ctl bench --builtin launch --replicas 1,3 --strategies time-slicing,mps --duration 5s \
  --json >"$out/builtin.json"
echo "exit $?"
echo "== PyTorch loop (bench_loop.py small), 1 and 3 replicas, MPS and MPS-limited, 5 s windows"
ctl bench --replicas 1,3 --strategies mps,mps-limited --duration 5s --json \
  -- python3 "$root/tests/device/bench_loop.py" small units >"$out/torch.json"
echo "exit $?"
python3 - "$out/builtin.json" "$out/torch.json" <<'PY'
import json, os, stat, sys
for path in sys.argv[1:]:
    r = json.load(open(path))
    print(f"-- {os.path.basename(path)}: restored: {r['restored']}")
    runs = [("baseline", r["baseline"])] + [(s["strategy"], run) for s in r["strategies"] for run in s["runs"]]
    for name, run in runs:
        mem = [p["gpu_memory_bytes"] for p in run["per_replica"]]
        print(f"{name:13} N={run['replicas']} units/s {run['throughput_per_s']:10.1f} "
              f"p50 {run['p50_ms']} p99 {run['p99_ms']} failed {run['failed']} "
              f"agent cpu {run['agent_cpu_percent']} % memory/replica {mem} "
              f"outcomes {[p['outcome'] for p in run['per_replica']]}")
    logs = r["logs_dir"]
    mode = lambda p: oct(stat.S_IMODE(os.stat(p).st_mode))
    print(f"logs {logs} {mode(logs)}; report {r['saved_to']} {mode(r['saved_to'])}")
    for run_dir in sorted(os.listdir(logs))[:2]:
        d = os.path.join(logs, run_dir)
        if os.path.isdir(d):
            print(f"  {run_dir} {mode(d)}: {sorted(os.listdir(d))}")
PY

echo "== a replica that hides processes (setsid, a double fork): none survives the bench"
cat >"$work/hide.sh" <<'EOF'
#!/bin/sh
setsid sleep 600.2222 &
( ( sleep 600.2222 & ) & ) &
python3 -c 'import torch; torch.ones(1, device="cuda"); print("cuda ok")'
echo >&3
EOF
chmod +x "$work/hide.sh"
ctl bench --replicas 2 --strategies mps --until-exit -- "$work/hide.sh" | tail -n 12
sleep 0.5
left=$(pgrep -fc 'sleep 600.2222' || true)
echo "hidden processes left after the bench: $left"
pkill -f 'sleep 600.2222' 2>/dev/null || true

stop_agent
# Zombies (an init that does not reap, in some containers) are not daemons left running.
ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
