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
#   tests/device/h100-cell-pairs.sh BIN_DIR OUT_DIR STRATEGY N,N,... [SECONDS] [ROUND]
set -uo pipefail
strategy=$3
counts=$4
seconds=${5:-2}
round=${6:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
loop="$root/tests/device/bench_loop.py"
bench() {
  start_agent "$work/agent-$n.log"
  t=$(date +%s%N)
  ctl bench --replicas "$n" --strategies "$strategy" --duration "${seconds}s" --objective throughput \
    --json -- python3 "$loop" small units >"$out/bench-$strategy-$n-r$round.json"
  echo "$strategy N=$n: bench exit $? after $((($(date +%s%N) - t) / 1000000)) ms"
  stop_agent
}
by_hand() {
  t=$(date +%s%N)
  python3 "$root/tests/device/hand_bench.py" small "$seconds" "$n" "$work" 1 "$strategy" \
    >"$out/hand-$strategy-$n-r$round.json"
  echo "$strategy N=$n: by hand exit $? after $((($(date +%s%N) - t) / 1000000)) ms"
}
k=0
for n in ${counts//,/ }; do
  k=$((k + 1))
  if [ $((k % 2)) = 1 ]; then bench; by_hand; else by_hand; bench; fi
done
python3 "$root/tests/device/compare-bench.py" "$(ls "$out"/bench-*.json | paste -sd,)" \
  "$(ls "$out"/hand-*.json | paste -sd,)"
ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
