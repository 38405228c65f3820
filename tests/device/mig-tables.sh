#!/usr/bin/env bash
# Issue 26's read-only acceptance on a real MIG-capable GPU you do not own (MIG is never
# enabled; nothing is written): the MIG table the agent reads from the driver equals the
# built-in catalog field for field (`--check-catalog`, and no "differs from the catalog"
# warning in the agent's log), and `gpushare-ctl mig profiles --json` matches what NVML
# itself reports through nvidia-ml-py, field by field.
#
#   tests/device/mig-tables.sh BIN_DIR OUT_DIR [PYNVML_DIR]
# BIN_DIR holds release builds of gpushare-agent and gpushare-ctl, and dbus/ (a carried
# dbus-daemon, see the developers' brief); PYNVML_DIR a directory with nvidia-ml-py.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
[ -n "${3:-}" ] && export PYTHONPATH=$(cd "$3" && pwd)${PYTHONPATH:+:$PYTHONPATH}
query="index,name,driver_version,pci.device_id,mig.mode.current,mig.mode.pending,compute_mode"
nvidia-smi --query-gpu=$query --format=csv | tee "$out/before.csv"

echo "== gpushare-agent --check-catalog (the driver's MIG tables against the catalog)"
"$bin/gpushare-agent" --check-catalog 2>&1 | tee "$out/check-catalog.txt"; echo "exit ${PIPESTATUS[0]}"

echo "== agent on NVML, hands off, on a private bus"
agent_log_level=info start_agent "$out/agent.log"
ctl status
ctl mig profiles | tee "$out/mig-profiles.txt"
ctl mig profiles --json >"$out/mig-profiles.json"; echo "mig profiles --json: exit $?"
stop_agent
if grep -q "differs from the catalog" "$out/agent.log"; then
  echo "agent log: the driver's table differs from the catalog:"; grep "differs" "$out/agent.log"
else
  echo "agent log: no difference between the driver's table and the catalog"
fi

echo "== NVML's own answers (nvidia-ml-py), compared with mig profiles"
for index in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
  python3 "$root/tests/nvidia/mig_profiles_nvml.py" "$index" >"$out/nvml-$index.json"
  python3 "$root/tests/nvidia/compare-mig-profiles.py" "$out/mig-profiles.json" "$out/nvml-$index.json"
  echo "exit $?"
done

nvidia-smi --query-gpu=$query --format=csv | tee "$out/after.csv"
if cmp -s "$out/before.csv" "$out/after.csv"; then echo "unchanged: yes"; else echo "unchanged: NO"; fi
