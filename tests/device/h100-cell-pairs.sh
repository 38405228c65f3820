#!/usr/bin/env bash
# The small (latency-bound) loop's scaling, one strategy and replica count at a time:
# for each N, `gpushare-ctl bench --strategies STRATEGY --replicas N` (its baseline, one
# replica alone measured three times, then the N replicas) and the same by hand
# (hand_bench.py: one copy alone three times, then N copies), back to back, which side goes
# first alternating. Each scaling then divides by a solo rate taken within a minute of its
# own run, on both sides: on the shared H100 host this loop's solo rate drifted by a fifth
# from one minute to the next (h100-small-repeat.sh), which a whole bench spreads over its
# minutes. MIG, compute mode and time-slice policy untouched; stops every daemon it started.
# Files are named by ROUND too, so that rounds into one OUT_DIR add up (compare-bench.py
# takes the median of each side's runs of a cell).
# METHODS (default `self`) lists hand_bench.py's ways of counting to run by hand, each a
# side of its own (`window` is gpushare's counting without the agent); the sides' order
# rotates from one N to the next, and from one ROUND (a number) to the next. Each side's
# line says what the host was doing meanwhile: its load average, and the share of CPU time
# the hypervisor took (steal).
#   tests/device/h100-cell-pairs.sh BIN_DIR OUT_DIR STRATEGY N,N,... [SECONDS] [ROUND] [METHODS]
set -uo pipefail
strategy=$3
counts=$4
seconds=${5:-2}
round=${6:-1}
methods=${7:-self}
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
loop="$root/tests/device/bench_loop.py"
# The whole CPU line of /proc/stat: total and steal jiffies.
cpu_jiffies() { awk '/^cpu /{t=0; for (i = 2; i <= NF; i++) t += $i; print t, $9}' /proc/stat; }
# One side's line: what it was, its exit, its wall time and the host meanwhile.
side_line() {
  local rc=$1 start_ns=$2 before=$3 after
  after=$(cpu_jiffies)
  echo "$strategy N=$n: $side exit $rc after $((($(date +%s%N) - start_ns) / 1000000)) ms;" \
    "steal $(echo "$before $after" | awk '{d = $3 - $1; printf "%.1f", d ? 100 * ($4 - $2) / d : 0}') %," \
    "load $(cut -d' ' -f1 /proc/loadavg)"
}
bench() {
  side=bench
  start_agent "$work/agent-$n.log"
  local t before
  t=$(date +%s%N) before=$(cpu_jiffies)
  ctl bench --replicas "$n" --strategies "$strategy" --duration "${seconds}s" --objective throughput \
    --json -- python3 "$loop" small units >"$out/bench-$strategy-$n-r$round.json"
  side_line $? "$t" "$before"
  stop_agent
}
by_hand() {
  local method=$1 t before name=hand
  [ "$method" = self ] || name=hand-$method
  side="by hand ($method)"
  t=$(date +%s%N) before=$(cpu_jiffies)
  python3 "$root/tests/device/hand_bench.py" small "$seconds" "$n" "$work" 1 "$strategy" "$method" \
    >"$out/$name-$strategy-$n-r$round.json"
  side_line $? "$t" "$before"
}
sides=(bench)
for m in ${methods//,/ }; do sides+=("hand:$m"); done
# Round r starts the rotation r-1 places on, so that rounds differ in who goes first.
k=$((round - 1))
for n in ${counts//,/ }; do
  for i in "${!sides[@]}"; do
    s=${sides[$(((i + k) % ${#sides[@]}))]}
    if [ "$s" = bench ]; then bench; else by_hand "${s#hand:}"; fi
  done
  k=$((k + 1))
done
python3 "$root/tests/device/compare-bench.py" "$(ls "$out"/bench-*.json | paste -sd,)" \
  "$(ls "$out"/hand-"$strategy"-*.json | paste -sd,)"
for m in ${methods//,/ }; do
  [ "$m" = self ] && continue
  python3 "$root/tests/device/compare-bench.py" "$(ls "$out"/bench-*.json | paste -sd,)" \
    "$(ls "$out"/hand-"$m"-*.json | paste -sd,)" "gpushare,$m"
  python3 "$root/tests/device/compare-bench.py" "$(ls "$out"/hand-"$m"-*.json | paste -sd,)" \
    "$(ls "$out"/hand-"$strategy"-*.json | paste -sd,)" "$m,self"
done
ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
