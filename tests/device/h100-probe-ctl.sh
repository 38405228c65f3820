#!/usr/bin/env bash
# `gpushare-ctl probe` end to end on a real GPU host you do not own: the NVML agent with
# MIG and compute modes left alone, a probe under the driver's time-slicing, then under an
# MPS server the agent starts (no limits), then back to no sharing. Stops every daemon.
#   tests/device/h100-probe-ctl.sh BIN_DIR [OUT_DIR]
set -uo pipefail
bin=$(cd "$1" && pwd)
out=${2:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
ctl() { "$bin/gpushare-ctl" "$@"; }
printf '[gpu]\nmanage_mig = false\nmanage_compute_mode = false\n[mps]\nroot = "%s/mps"\n' "$work" >"$work/agent.toml"
printf 'name = "probe-mps"\n[[gpu]]\nselect = "all"\nmig = "disabled"\nsharing.mps = {}\n' >"$work/mps.toml"
start_agent "$out/agent-probe.log"

echo "== probe under the driver's time-slicing"
ctl probe --workload launch,compute --clients 1,4,7 --seconds 3
echo "exit $?"
echo "== probe under MPS"
ctl apply -f "$work/mps.toml" 2>/dev/null
ctl probe --workload launch,compute --clients 1,4,7 --seconds 3
echo "exit $?"
ctl probe --workload memory --clients 1,2 --seconds 2 --json | head -c 600; echo
ctl apply all-disabled 2>/dev/null
ctl mps status
stop_agent
pgrep -fa "nvidia-cuda-mps-control" | grep -v pgrep || echo "no MPS daemon left"
ls "$work/state/probe" | sed 's/^/kept: /'
