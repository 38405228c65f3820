#!/usr/bin/env bash
# The small (latency-bound) loop's scaling, gpushare-ctl bench against the same loop by
# hand (hand_bench.py, a hand-started nvidia-cuda-mps-control), PAIRS times in one run,
# which side goes first alternating, so that compare-bench.py can compare medians: this loop's solo rate, which every
# scaling divides by, varies by a third from run to run on a shared host. MIG, compute mode
# and time-slice policy untouched; stops every daemon it started.
# REPEAT measures each run that many times on both sides (`bench --repeat`), the median
# kept; STRATEGIES narrows both sides to some strategies (time-slicing always comes first:
# it is the baseline).
#   tests/device/h100-small-repeat.sh BIN_DIR OUT_DIR PAIRS [SECONDS] [FIRST] [REPEAT] [STRATEGIES]
set -uo pipefail
pairs=$3
seconds=${4:-3}
first=${5:-1}
repeat=${6:-1}
strategies=${7:-time-slicing,mps,mps-limited}
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
loop="$root/tests/device/bench_loop.py"
bench() {
  start_agent "$work/agent-$k.log"
  t=$(date +%s%N)
  ctl bench --replicas 1,3,5,7 --strategies "$strategies" --duration "${seconds}s" \
    --repeat "$repeat" --objective throughput --json -- python3 "$loop" small units \
    >"$out/bench-small-$k.json"
  echo "pair $k: bench exit $? after $(( ($(date +%s%N) - t) / 1000000 )) ms"
  stop_agent
}
by_hand() {
  t=$(date +%s%N)
  python3 "$root/tests/device/hand_bench.py" small "$seconds" 1,3,5,7 "$work" "$repeat" "$strategies" \
    >"$out/hand-small-$k.json"
  echo "pair $k: by hand exit $? after $(( ($(date +%s%N) - t) / 1000000 )) ms"
}
# Alternated: which side goes first changes from pair to pair.
for k in $(seq "$first" $((first + pairs - 1))); do
  if [ $((k % 2)) = 1 ]; then bench; by_hand; else by_hand; bench; fi
done
benches=$(ls "$out"/bench-small-*.json | paste -sd,)
hands=$(ls "$out"/hand-small-*.json | paste -sd,)
python3 "$root/tests/device/compare-bench.py" "$benches" "$hands"
ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
