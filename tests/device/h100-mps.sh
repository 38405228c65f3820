#!/usr/bin/env bash
# MPS through gpushare on a real GPU host you do not own: the NVML backend with MIG and
# compute modes left alone (manage_mig = false, manage_compute_mode = false), an MPS
# server at 25 % threads and a 2 GiB pinned memory limit started by the agent, a CUDA
# client connected with `gpushare-ctl env`, allocations against the limit, and the
# timings of issue 4. Every daemon started here is stopped before the script ends.
#   tests/device/h100-mps.sh BIN_DIR [OUT_DIR]
set -uo pipefail
bin=$(cd "$1" && pwd)
out=${2:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
ctl() { "$bin/gpushare-ctl" "$@"; }
show() { echo "\$ gpushare-ctl $*"; ctl "$@"; echo "exit $?"; }
step() { echo; echo "== $*"; }
ms() { python3 -c "import statistics,sys; v=sorted(float(x) for x in sys.argv[1:]); print(f'median {statistics.median(v):.1f} ms, min {v[0]:.1f}, max {v[-1]:.1f} (n={len(v)})')" "$@"; }

cat >"$work/agent.toml" <<TOML
[gpu]
manage_mig = false
manage_compute_mode = false
[mps]
root = "$work/mps"
TOML
cat >"$work/h100-mps.toml" <<'TOML'
name = "h100-mps"
description = "The whole GPU through one MPS server: 25 % threads, 2 GiB pinned memory"
[[gpu]]
select = "all"
mig = "disabled"
sharing.mps = { active_thread_percentage = 25, pinned_memory_limit = "2GiB" }
TOML
write_cuda_client "$work/client.py"

step "GPU before"
nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current,compute_mode --format=csv | tee "$work/before.csv"

start_agent "$out/agent.log"

step "apply the MPS profile"
show plan -f "$work/h100-mps.toml"
show apply -f "$work/h100-mps.toml"
show status
show mps status
echo "\$ gpushare-ctl env 0"; ctl env 0

step "a CUDA client through the agent's server: 1 GiB, then 4 GiB against the 2 GiB limit"
( eval "$(ctl env 0)"; HOLD=8 python3 "$work/client.py" 1 4 ) &
client=$!
sleep 2
show mps status
step "with that client connected: stopping its server is refused, naming it, and so is a limit above the GPU's memory"
show apply all-disabled
show mps limit --pid "$(pgrep -f "$work/client.py" | head -1)" --memory 999TiB
show mps status
wait $client

step "first CUDA context through gpushare's server (10 clients, one after another)"
through=()
for i in $(seq 10); do
  v=$( (eval "$(ctl env 0)"; python3 "$work/client.py") | sed -n 's/first context: \([0-9.]*\) ms.*/\1/p')
  through+=("$v")
done
echo "${through[*]}"; ms "${through[@]}"

step "switch the profile away"
show apply all-disabled
show mps status
ls -A "$work/mps" 2>/dev/null | sed 's/^/left: /'
pgrep -fa "nvidia-cuda-mps" | grep -v pgrep || echo "no MPS process left"

step "apply → MPS server ready with limits read back (10 applies of the profile from none)"
apply_ms=(); job_ms=()
for i in $(seq 10); do
  t0=$(date +%s%N)
  doc=$(ctl apply -f "$work/h100-mps.toml" --json)
  t1=$(date +%s%N)
  apply_ms+=("$(( (t1 - t0) / 1000 ))e-3")
  job_ms+=("$(echo "$doc" | python3 -c 'import json,sys; print(json.load(sys.stdin)["duration_seconds"]*1000)')")
  ctl apply all-disabled >/dev/null
done
echo "gpushare-ctl apply wall time: $(ms "${apply_ms[@]}")"
echo "job duration inside the agent: $(ms "${job_ms[@]}")"

stop_agent

step "first CUDA context through a bare daemon started by hand (10 clients)"
export CUDA_MPS_PIPE_DIRECTORY=$work/bare/pipe CUDA_MPS_LOG_DIRECTORY=$work/bare/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
t0=$(date +%s%N)
nvidia-cuda-mps-control -d
printf 'set_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit 0 2G\n' | nvidia-cuda-mps-control >/dev/null
t1=$(date +%s%N)
echo "bare daemon start + two limits: $(( (t1 - t0) / 1000000 )) ms"
bare=()
for i in $(seq 10); do
  v=$(python3 "$work/client.py" | sed -n 's/first context: \([0-9.]*\) ms.*/\1/p'); bare+=("$v")
done
echo "${bare[*]}"; ms "${bare[@]}"
echo quit | nvidia-cuda-mps-control
sleep 1
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
pgrep -fa "nvidia-cuda-mps" | grep -v pgrep || echo "no MPS process left"

step "GPU after"
nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current,compute_mode --format=csv | tee "$work/after.csv"
cmp -s "$work/before.csv" "$work/after.csv" && echo "unchanged: yes" || echo "unchanged: NO"
