#!/usr/bin/env bash
# Issue 42 on a real GPU host you do not own (hands off: no reset, no MIG change, no fault
# injected; MPS with the script's own pipe directory):
#  1. the agent with its health watcher (registered for the driver's events and waiting on
#     them) runs the whole script; status is read every second and any fault it shows is
#     printed as "FALSE UNHEALTHY" (a real card with no fault must show none);
#  2. the watcher thread's CPU (% of one core) and the agent's, over an idle window and
#     over a window with an MPS server and a CUDA client holding memory;
#  3. `gpushare-ctl status --json` timed with the watcher on and off, side by side: the two
#     agents alternate, four rounds of 30 calls each, medians per side.
# Stops every daemon it started.   tests/device/h100-health.sh BIN_DIR OUT_DIR [SECONDS]
#   (carry .carry/bin and .carry/dbus: dbus-daemon from .carry/dbus/wrap when the host has none)
set -uo pipefail
seconds=${3:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
command -v dbus-daemon >/dev/null || export PATH="$root/.carry/dbus/wrap:$PATH"
begin_run "$1" "$2"
# On any exit (a failed step, a killed run): the status loop, the CUDA client and an agent
# still running go, the agent's MPS servers with it.
cleanup() {
  touch "$work/stop-watch" 2>/dev/null
  [ -n "${client:-}" ] && kill "$client" 2>/dev/null
  if [ -n "${agent_pid:-}" ] && kill -0 "$agent_pid" 2>/dev/null; then stop_all_disabled; fi
}
trap cleanup EXIT
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv,noheader

# $work/agent.toml, hands off, with the watcher on (true) or off (false).
health_config() {
  write_hands_off_config
  printf '[health]\nenabled = %s\npoll_seconds = 1\n[cdi]\nenabled = false\n' "$1" >>"$work/agent.toml"
}

# CPU seconds of the agent's thread named $1 ("" for the whole process).
cpu_of() {
  python3 - "$agent_pid" "$1" <<'PY'
import os, sys
pid, name = sys.argv[1], sys.argv[2]
total = 0
for tid in os.listdir(f"/proc/{pid}/task"):
    try:
        comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
        ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        continue
    if not name or comm == name:
        total += ns
print(total / 1e9)
PY
}

# Prints the watcher's and the agent's CPU over $1 seconds, labelled $2.
cpu_window() {
  local w0 a0 w1 a1
  w0=$(cpu_of gpushare-health); a0=$(cpu_of "")
  sleep "$1"
  w1=$(cpu_of gpushare-health); a1=$(cpu_of "")
  python3 -c "import sys; w=(float(sys.argv[2])-float(sys.argv[1]))/float(sys.argv[5])*100; a=(float(sys.argv[4])-float(sys.argv[3]))/float(sys.argv[5])*100; print(f'$2: watcher thread {w:.3f} % of a core, whole agent {a:.3f} % over {sys.argv[5]} s')" \
    "$w0" "$w1" "$a0" "$a1" "$1"
}

# Reads status every second into $work/watch.txt until $work/stop-watch exists; a GPU
# with a fault is a false unhealthy mark on this healthy card.
watch_status() {
  rm -f "$work/stop-watch"
  while [ ! -e "$work/stop-watch" ]; do
    ctl status --json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
bad = [(g["index"], f) for g in s["gpus"] for f in g.get("health", [])]
print("FALSE UNHEALTHY", bad if bad else "", "events:", s.get("health_events")) if bad else print("healthy; events:", s.get("health_events"))
' >>"$work/watch.txt"
    sleep 1
  done
}

# 30 timed status calls: one line of milliseconds.
time_status() {
  python3 - "$bin/gpushare-ctl" <<'PY'
import subprocess, sys, time
ts = []
for _ in range(30):
    t = time.perf_counter()
    subprocess.run([sys.argv[1], "status", "--json"], stdout=subprocess.DEVNULL, check=True)
    ts.append((time.perf_counter() - t) * 1000)
print(" ".join(f"{x:.2f}" for x in ts))
PY
}

echo "== 1 and 2. the watcher for the whole run; its CPU"
health_config true
start_agent "$work/agent.log"
ctl status --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print("health_events:", s.get("health_events")); print("faults:", [f for g in s["gpus"] for f in g.get("health", [])])'
watch_status &
watcher=$!
cpu_window "$seconds" "idle, MIG off, no sharing"
ctl apply all-mps >/dev/null 2>&1 || echo "apply all-mps failed"
write_cuda_client "$work/client.py"
eval "$(ctl env 0 2>/dev/null)"
HOLD=$((seconds + 5)) python3 "$work/client.py" 4 >"$work/client.out" 2>&1 &
client=$!
sleep 3
cpu_window "$seconds" "MPS server with a CUDA client holding 4 GiB"
wait "$client"
cat "$work/client.out"
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY CUDA_VISIBLE_DEVICES
ctl apply all-disabled >/dev/null 2>&1 || echo "apply all-disabled failed"
touch "$work/stop-watch"; wait "$watcher"
echo "status reads: $(wc -l <"$work/watch.txt"), false unhealthy: $(grep -c 'FALSE UNHEALTHY' "$work/watch.txt")"
grep -m3 'FALSE UNHEALTHY' "$work/watch.txt"
grep -iE 'health|xid|event' "$work/agent.log" | head -20
cp "$work/agent.log" "$out/agent-watching.log"
stop_agent

echo "== 3. status with the watcher on and off, side by side"
for round in 1 2 3 4; do
  for side in true false; do
    health_config "$side"
    start_agent "$work/agent-$side.log"
    sleep 2
    echo "watcher=$side round=$round: $(time_status)" | tee -a "$out/status-times.txt"
    stop_agent
  done
done
python3 - "$out/status-times.txt" <<'PY'
import statistics, sys
sides = {}
for line in open(sys.argv[1]):
    head, times = line.split(": ", 1)
    side = head.split()[0]
    sides.setdefault(side, []).extend(float(t) for t in times.split())
on, off = statistics.median(sides["watcher=true"]), statistics.median(sides["watcher=false"])
print(f"status median with the watcher: {on:.2f} ms, without: {off:.2f} ms, ratio {on / off:.3f} (n={len(sides['watcher=true'])} each)")
PY
ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
