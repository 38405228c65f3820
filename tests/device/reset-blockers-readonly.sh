#!/usr/bin/env bash
# Read-only: what the agent's reset-blocker rules read on a real host (NVML's
# virtualization mode, the GPU's PCI reset methods, nvidia_drm's modeset parameter,
# NVSwitches and Fabric Manager) next to the agent's verdict (`--check-driver` names each
# GPU whose reset the host would block). Resets nothing, enables nothing.
#
#   tests/device/reset-blockers-readonly.sh BIN_DIR
set -uo pipefail
bin=$(cd "$1" && pwd)
echo "== gpushare-agent --check-driver"
"$bin/gpushare-agent" --check-driver; echo "exit $?"
echo "== what the rules read"
nvidia-smi -q | grep -E "Product Name|Product Architecture|Virtualization Mode|Host VGPU Mode|Bus Id" | sed 's/^ *//'
for bus in $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader); do
  dev=/sys/bus/pci/devices/$(echo "$bus" | tr 'A-F' 'a-f' | sed 's/^0000//')
  echo "$bus reset_method: $(cat "$dev/reset_method" 2>&1)"
done
echo "nvidia_drm modeset: $(cat /sys/module/nvidia_drm/parameters/modeset 2>&1)"
echo "NVSwitches (NVIDIA PCI class 0x0680): $(grep -l 0x068000 /sys/bus/pci/devices/*/class 2>/dev/null | xargs -r -n1 dirname | xargs -r -I{} cat {}/vendor | grep -c 0x10de)"
echo "nv-fabricmanager running: $(pgrep -c nv-fabricmanage || true)"
