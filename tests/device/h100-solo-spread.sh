#!/usr/bin/env bash
# How much one copy of a bench loop varies from run to run alone on the GPU: gpushare-ctl
# bench's baseline and the hand harness's solo copy, alternated, N times each.
#   tests/device/h100-solo-spread.sh BIN_DIR small|big [N] [SECONDS]
set -uo pipefail
bin=$(cd "$1" && pwd)
shape=$2
n=${3:-4}
seconds=${4:-4}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
write_hands_off_config
loop="$root/tests/device/bench_loop.py"
start_agent "$work/agent.log"
for i in $(seq "$n"); do
  "$bin/gpushare-ctl" bench --replicas 1 --strategies time-slicing --duration "${seconds}s" --json \
    -- python3 "$loop" "$shape" units >"$work/b.json"
  g=$(python3 -c "import json,sys; print(round(json.load(open('$work/b.json'))['baseline']['throughput_per_s']))")
  touch "$work/go-$i"
  h=$(python3 "$loop" "$shape" hand "$work/ready-$i" "$work/go-$i" "$seconds")
  echo "run $i: gpushare baseline $g units/s, by hand $h steps/s"
done
stop_agent
