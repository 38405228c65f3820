#!/usr/bin/env bash
# Where a switch that replaces a served MPS server goes: one bench of the small loop under
# mps-limited at 1 and 3 replicas (the second setup stops the first server, whose client
# just left, and starts another), the agent logging every external program and
# observation with its time (GPUSHARE_LOG=debug). MIG, compute mode and time-slice policy
# untouched; stops every daemon it started.
#   tests/device/h100-replace-switch.sh BIN_DIR OUT_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
agent_log_level=debug start_agent "$out/agent.log"
ctl bench --replicas 1,3,5 --strategies mps-limited --duration 2s --json -- \
  python3 "$root/tests/device/bench_loop.py" small units >"$out/bench.json"
echo "bench exit $?"
stop_agent
python3 - "$out/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["strategies"]:
    for run in s["runs"]:
        print(s["strategy"], run["replicas"], "setup_ms", run.get("setup_ms"))
PY
ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
