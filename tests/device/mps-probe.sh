#!/usr/bin/env bash
# Read-only facts about the real MPS control daemon on a GPU host: the exact answers of
# nvidia-cuda-mps-control's commands, limits enforced on a client, and the time of a
# client's first CUDA context through a bare daemon. Starts one daemon with its own pipe
# directory and stops it before exiting; changes no GPU setting.
#   tests/device/mps-probe.sh [OUT_DIR]
set -uo pipefail
out=${1:-$(mktemp -d)}
work=$(mktemp -d)
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
export CUDA_MPS_PIPE_DIRECTORY=$work/pipe CUDA_MPS_LOG_DIRECTORY=$work/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
ctl() { echo "> $*"; echo "$*" | nvidia-cuda-mps-control; echo "[exit $?]"; }
trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; sleep 0.5; pkill -f "nvidia-cuda-mps-control -d" 2>/dev/null; true' EXIT

command -v nvidia-cuda-mps-control; nvidia-cuda-mps-control -h 2>&1 | head -20
t0=$(date +%s%N)
nvidia-cuda-mps-control -d; echo "[start exit $?]"
ctl get_server_list
ctl set_default_active_thread_percentage 25
ctl get_default_active_thread_percentage
ctl set_default_device_pinned_mem_limit 0 2G
ctl get_default_device_pinned_mem_limit 0
t1=$(date +%s%N); echo "daemon start + two limits set and read back: $(( (t1 - t0) / 1000000 )) ms"
ctl get_default_device_pinned_mem_limit 1
ctl set_default_active_thread_percentage 250
ctl bogus_command
ls -la "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
cat "$CUDA_MPS_PIPE_DIRECTORY"/*.pid 2>/dev/null; echo

write_cuda_client "$work/client.py"
echo "== client through the daemon (1 GiB then 4 GiB; limit 2G)"
HOLD=3 python3 "$work/client.py" 1 4 &
cpid=$!
sleep 1.5
ctl get_server_list
srv=$(echo get_server_list | nvidia-cuda-mps-control | head -1)
ctl get_client_list "$srv"
ctl get_device_client_list
ctl get_active_thread_percentage "$srv"
ctl ps
wait $cpid
echo "== first-context times through the bare daemon (10 runs)"
for i in $(seq 10); do python3 "$work/client.py"; done
ctl quit
sleep 1
echo "== without MPS (10 runs)"
unset CUDA_MPS_PIPE_DIRECTORY
for i in $(seq 10); do python3 "$work/client.py"; done
cp -r "$CUDA_MPS_LOG_DIRECTORY" "$out/mps-log" 2>/dev/null
nvidia-smi compute-policy -l 2>&1 | head -20
nvidia-smi --query-gpu=compute_mode --format=csv
