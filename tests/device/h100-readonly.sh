#!/usr/bin/env bash
# Read-only run of the real binaries on a GPU host you do not own (NVML backend).
# Changes nothing: agent.toml sets manage_mig = false and manage_compute_mode = false,
# and only read-only NVML calls are made. Compares the GPU's MIG mode and compute mode
# before and after.
#
#   tests/device/h100-readonly.sh BIN_DIR [OUT_DIR]
# BIN_DIR holds release builds of gpushare-agent, gpushare-ctl and gpushare-bench, and the
# simulated driver (libgpushare_sim_nvml.so) for the comparison with it.
set -uo pipefail
bin=$(cd "$1" && pwd)
out=${2:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/../.." && pwd)
export GPUSHARE_REPO_ROOT=$root GPUSHARE_AGENT_BIN=$bin/gpushare-agent GPUSHARE_CTL_BIN=$bin/gpushare-ctl
work=$(mktemp -d)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
query="index,name,driver_version,pci.device_id,mig.mode.current,compute_mode"

step() { echo; echo "== $*"; }

step "GPU before"
nvidia-smi --query-gpu=$query --format=csv | tee "$work/before.csv"

step "gpushare-agent --check-catalog (NVML's MIG profile tables against the catalog)"
"$bin/gpushare-agent" --check-catalog; echo "exit $?"

step "gpushare-agent --check-catalog against the simulated driver (h100-80gb:1)"
"$bin/gpushare-agent" --simulate h100-80gb:1 --state-dir "$work/sim" --config "$work/none.toml" \
  --profiles-dir "$work/profiles.d" --check-catalog; echo "exit $?"

step "NVML's answers, the real driver's against the simulated driver's (h100-80gb:1), field by field"
"$bin/gpushare-agent" --dump-nvml >"$out/nvml-real.json"; echo "real: exit $?"
"$bin/gpushare-agent" --simulate h100-80gb:1 --state-dir "$work/sim" --config "$work/none.toml" \
  --profiles-dir "$work/profiles.d" --dump-nvml >"$out/nvml-simulated.json"; echo "simulated: exit $?"
python3 "$root/tests/device/compare-nvml.py" "$out/nvml-real.json" "$out/nvml-simulated.json"
echo "exit $?"

step "agent on NVML, hands off, on a private bus"
printf '[gpu]\nmanage_mig = false\nmanage_compute_mode = false\n' >"$work/agent.toml"
start_agent "$out/agent.log"

ctl() { echo "\$ gpushare-ctl $*"; "$bin/gpushare-ctl" "$@"; echo "exit $?"; }
ctl status
ctl status --json
ctl plan all-disabled
ctl plan all-balanced
ctl apply all-disabled
ctl apply all-disabled --json
ctl apply all-balanced
ctl status
ctl export
ctl assert all-disabled
ctl assert half-balanced

stop_agent

step "timings (gpushare-bench --nvml)"
"$bin/gpushare-bench" --nvml --runs 50 2>/dev/null

step "GPU after"
nvidia-smi --query-gpu=$query --format=csv | tee "$work/after.csv"
if cmp -s "$work/before.csv" "$work/after.csv"; then echo "unchanged: yes"; else echo "unchanged: NO"; fi
