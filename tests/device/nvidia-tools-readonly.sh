#!/usr/bin/env bash
# Records what NVIDIA's own tools answer on a real GPU, read-only, for the simulator to be
# checked against (issue 25): nvidia-ml-py's answers (tests/nvidia/pynvml_readonly.py)
# and nvidia-smi's texts and exit codes for the commands an operator reads with. Changes
# nothing: no -pm, -mig, -r, -c, mig -cgi/-dgi or compute-policy --set are run.
#
#   tests/device/nvidia-tools-readonly.sh PYNVML_DIR OUT_DIR
# PYNVML_DIR holds nvidia-ml-py's pynvml.py (the wheel unpacked).
set -uo pipefail
pynvml=$(cd "$1" && pwd)
out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out/nvidia-smi"

PYTHONPATH=$pynvml python3 "$root/tests/nvidia/pynvml_readonly.py" >"$out/pynvml-readonly.json"
echo "pynvml: exit $?"

# nvidia-smi: one file per command, its output then `exit N`.
smi() {
  local name=$1
  shift
  { nvidia-smi "$@" 2>&1; echo "exit $?"; } >"$out/nvidia-smi/$name.txt"
}
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -n1)
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n1)
short=${bus#0000}          # 00000000:1B:00.0 -> 0000:1B:00.0
sysfs=$(tr 'A-F' 'a-f' <<<"$short")
smi L -L
smi q -q
smi q-i0 -q -i 0
smi query-csv --query-gpu=index,name,uuid,serial,pci.bus_id,pci.device_id,pci.sub_device_id,driver_version,persistence_mode,compute_mode,mig.mode.current,mig.mode.pending,memory.total,memory.reserved,memory.used,memory.free,count,vbios_version,gom.current --format=csv
smi query-noheader --query-gpu=index,name,memory.total,mig.mode.current --format=csv,noheader
smi query-nounits --query-gpu=index,memory.total,memory.used --format=csv,noheader,nounits
smi query-unknown --query-gpu=index,no.such.field --format=csv
smi query-noformat --query-gpu=index
# -i in every form the tool takes (-L takes no -i: that is an error of its own).
iq() { local name=$1; shift; smi "$name" -i "$@" --query-gpu=index,pci.bus_id --format=csv,noheader; }
iq i-index 0
iq i-uuid "$uuid"
iq i-bus "$bus"
iq i-short "$short"
iq i-sysfs "$sysfs"
iq i-nodomain "${bus#00000000:}"
iq i-missing 99
iq i-badbus 0000:ff:00.0
iq i-garbage not-a-gpu
smi L-with-i -L -i 0
smi q-i-uuid -q -i "$uuid" -d MEMORY
smi lgip mig -lgip
smi lgipp mig -lgipp
smi lgi mig -lgi
smi lci mig -lci
smi lcip mig -lcip
smi lgip-i mig -i 0 -lgip
smi compute-policy-l compute-policy -l
smi unknown-option --no-such-option
smi help-head -h
echo "nvidia-smi: $(ls "$out/nvidia-smi" | wc -l) files"
nvidia-smi --version >"$out/nvidia-smi-version.txt" 2>&1
