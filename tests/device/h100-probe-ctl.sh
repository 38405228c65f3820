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
ctl() { "$bin/gpushare-ctl" "$@"; }
printf '[gpu]\nmanage_mig = false\nmanage_compute_mode = false\n[mps]\nroot = "%s/mps"\n' "$work" >"$work/agent.toml"
printf 'name = "probe-mps"\n[[gpu]]\nselect = "all"\nmig = "disabled"\nsharing.mps = {}\n' >"$work/mps.toml"
dbus-daemon --config-file="$root/tests/dbus/session.conf" --address="unix:path=$work/bus" \
  --nofork --nopidfile --print-address=1 >"$work/address" 2>/dev/null &
bus_pid=$!
for _ in $(seq 100); do [ -s "$work/address" ] && break; sleep 0.05; done
export GPUSHARE_BUS_ADDRESS=$(head -n1 "$work/address")
"$bin/gpushare-agent" --bus "$GPUSHARE_BUS_ADDRESS" --config "$work/agent.toml" \
  --state-dir "$work/state" --profiles-dir "$work/none" 2>"$out/agent-probe.log" &
agent_pid=$!
for _ in $(seq 200); do ctl status --json >/dev/null 2>&1 && break; sleep 0.05; done

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
kill $agent_pid; wait $agent_pid 2>/dev/null
kill $bus_pid
pgrep -fa "nvidia-cuda-mps-control" | grep -v pgrep || echo "no MPS daemon left"
ls "$work/state/probe" | sed 's/^/kept: /'
