#!/usr/bin/env bash
# Where the time of an MPS strategy switch and the agent's CPU over a bench window go, on a
# real GPU host you do not own (MIG, compute mode and time-slice policy untouched):
#  1. the parts of a switch timed alone (mps-switch-parts.py: nvidia-smi, -d, commands);
#  2. five applies of an MPS profile with limits, the agent logging every external program
#     and observation with its time (GPUSHARE_LOG=debug), against the bare start;
#  3. the agent's CPU by thread (thread-cpu.py) over benches of 7 replicas of the big loop
#     under MPS and the small loop under MPS with limits.
# Stops every daemon it started.   tests/device/h100-switch-cpu.sh BIN_DIR OUT_DIR [SECONDS]
set -uo pipefail
seconds=${3:-10}
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
loop="$root/tests/device/bench_loop.py"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv,noheader

echo "== 1. the parts of a switch, alone"
python3 "$root/tests/device/mps-switch-parts.py" "$work"

echo "== 2. applies of an MPS profile with limits (agent, debug log) vs a bare start"
agent_log_level="info,gpushare_agent=debug" start_agent "$work/agent.log"
time_agent_switches
cp "$work/agent.log" "$out/switch-agent-debug.log"
# In the agent: from its "apply started" (the plan made) to "job succeeded" (the server
# started, limits set and read back, verified, the journal committed).
python3 - "$work/agent.log" <<'PY'
import re, statistics, sys
from datetime import datetime
started, spans = {}, []
for line in open(sys.argv[1]):
    m = re.match(r"(\S+Z)\s+\w+ .*?(apply started|job succeeded) job=(\S+)(?: profile=(\S+)| what=(\S+))", line)
    if not m:
        continue
    at = datetime.fromisoformat(m[1].replace("Z", "+00:00"))
    if m[2] == "apply started" and m[4] == "switch":
        started[m[3]] = at
    elif m[2] == "job succeeded" and m[3] in started:
        spans.append((at - started.pop(m[3])).total_seconds() * 1000)
print("in the agent, apply started -> job succeeded ms:", " ".join(f"{s:.1f}" for s in spans),
      "median", f"{statistics.median(spans):.1f}")
PY
python3 "$root/tests/device/bare-switch.py" "$work"

echo "== 3. the agent's CPU by thread over bench windows of ${seconds}s"
for part in big:mps small:mps-limited; do
  shape=${part%%:*}; strategy=${part#*:}
  echo "-- $shape loop, 7 replicas, $strategy"
  python3 "$root/tests/device/thread-cpu.py" "$agent_pid" $((4 * seconds + 40)) 2 >"$work/threads-$shape.txt" &
  sampler=$!
  ctl bench --replicas 3,7 --strategies "$strategy" --duration "${seconds}s" --json \
    -- python3 "$loop" "$shape" units >"$work/bench-$shape.json"
  echo "exit $?"
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  python3 - "$work/bench-$shape.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
runs = [("baseline", r["baseline"])] + [(s["strategy"], x) for s in r["strategies"] for x in s["runs"]]
for name, x in runs:
    print(f"{name} N={x['replicas']}: {x['throughput_per_s']:.0f} units/s agent_cpu_percent={x.get('agent_cpu_percent')}"
          f" setup_ms={x.get('setup_ms')}")
PY
  cat "$work/threads-$shape.txt"
done
stop_agent
ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
