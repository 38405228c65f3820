#!/usr/bin/env bash
# The simulated nvidia-smi against the real one on the same host, read-only (issue 25):
# `-L`, `-q` and `--query-gpu` of a simulated node of the host's model, compared line by
# line apart from ids (UUID, serial, PCI bus id, board id, timestamps). The real tool is
# only asked to read.
#
#   tests/device/nvidia-smi-sim-vs-real.sh SIM_BIN_DIR MODEL OUT_DIR
# SIM_BIN_DIR holds gpushare-sim-nvidia-smi (release build); MODEL the simulator's key of
# the host's GPU (h100-80gb).
set -uo pipefail
bin=$(cd "$1" && pwd)
model=$2
out=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
state=$(mktemp -d)
export GPUSHARE_SIM_NODE=$model:1 GPUSHARE_SIM_STATE=$state/node.json
# The simulated node is made by the simulated driver's first nvmlInit; the tool only reads
# an existing one, so let the library create it.
python3 - "$bin/libgpushare_sim_nvml.so" <<'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
assert lib.nvmlInit_v2() == 0 and lib.nvmlShutdown() == 0
PY
fields=index,name,pci.device_id,pci.sub_device_id,driver_version,persistence_mode,compute_mode,mig.mode.current,mig.mode.pending,memory.total,memory.reserved,memory.used,memory.free,count
run() { # name, args...
  local name=$1
  shift
  { nvidia-smi "$@" 2>&1; echo "exit $?"; } >"$out/real-$name.txt"
  { "$bin/gpushare-sim-nvidia-smi" "$@" 2>&1; echo "exit $?"; } >"$out/sim-$name.txt"
}
run L -L
run q -q
run query --query-gpu=$fields --format=csv
run query-nounits --query-gpu=$fields --format=csv,noheader,nounits
run lgip mig -lgip
run lgipp mig -lgipp
python3 "$root/tests/nvidia/compare-smi.py" "$out"
echo "compare: exit $?"
rm -rf "$state"
