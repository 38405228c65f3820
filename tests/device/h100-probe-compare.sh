#!/usr/bin/env bash
# `gpushare-ctl probe --compare` on a real GPU host you do not own: the NVML agent with MIG
# and compute modes left alone runs launch and compute with 1, 4 and 7 clients under
# time-slicing, MPS and MPS with 100/N % threads (MPS servers it starts and stops itself),
# restores the sharing, and recommends a strategy per workload. Stops every daemon.
#   tests/device/h100-probe-compare.sh BIN_DIR [OUT_DIR]
set -uo pipefail
bin=$(cd "$1" && pwd)
out=${2:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
ctl() { "$bin/gpushare-ctl" "$@"; }
printf '[gpu]\nmanage_mig = false\nmanage_compute_mode = false\n[mps]\nroot = "%s/mps"\n' "$work" >"$work/agent.toml"
start_agent "$out/agent-compare.log"
ctl status
start=$(date +%s)
ctl probe --compare --workload launch,compute --clients 1,4,7 --seconds 3
echo "exit $? after $(( $(date +%s) - start )) s"
echo "== after: the sharing as before"
ctl status
ctl mps status
stop_agent
pgrep -fa "nvidia-cuda-mps-control" | grep -v pgrep || echo "no MPS daemon left"
