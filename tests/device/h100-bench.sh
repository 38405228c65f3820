#!/usr/bin/env bash
# `gpushare-ctl bench` on a real GPU host you do not own (MIG, compute mode and time-slice
# policy untouched: manage_mig and manage_compute_mode false, no time-slice change), against
# the same PyTorch loops run by hand (hand_bench.py: a hand-started nvidia-cuda-mps-control)
# in the same run. Stops every daemon it started.
#   tests/device/h100-bench.sh BIN_DIR OUT_DIR small|big|prometheus [SECONDS]
set -uo pipefail
part=$3
seconds=${4:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
loop="$root/tests/device/bench_loop.py"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv,noheader

start_agent "$work/agent.log"
trap 'echo "== agent log (last 40 lines)"; tail -n 40 "$work/agent.log"' EXIT
case $part in
small | big)
  echo "== gpushare-ctl bench: $part loop, 1,3,5,7 replicas, ${seconds}s windows"
  t=$(date +%s%N)
  ctl bench --replicas 1,3,5,7 --strategies time-slicing,mps,mps-limited,mig \
    --duration "${seconds}s" --objective throughput --slo slowdown=2 --fleet 100 \
    --report "$out/bench-$part.html" --json -- python3 "$loop" "$part" units >"$out/bench-$part.json"
  echo "exit $? after $(( ($(date +%s%N) - t) / 1000000 )) ms"
  ctl bench --replicas 1,3 --strategies mps --duration 2s -- python3 "$loop" "$part" units | tail -n 25
  [ "$part" = small ] && ctl probe --compare --workload launch --clients 1,4 --seconds 2 | tail -n 25
  stop_agent
  echo "== the same loops by hand (no agent)"
  python3 "$root/tests/device/hand_bench.py" "$part" "$seconds" 1,3,5,7 "$work" >"$out/hand-$part.json"
  echo "exit $?"
  ;;
prometheus)
  echo "== gpushare-ctl bench --histogram (prometheus_client from ${PYTHONPATH:-site-packages})"
  ctl bench --replicas 1,3 --strategies time-slicing,mps --duration "${seconds}s" \
    --histogram step_latency_seconds --objective latency --slo p99=5ms \
    --report "$out/bench-prometheus.html" --json -- python3 "$loop" small metrics >"$out/bench-prometheus.json"
  echo "exit $?"
  echo "== strategy switch: apply an MPS profile with limits (agent) vs a bare MPS start + 2 limit commands"
  time_agent_switches
  stop_agent
  python3 "$root/tests/device/bare-switch.py" "$work"
  ;;
esac
# Zombies (an init that does not reap, in some containers) are not daemons left running.
ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
