#!/usr/bin/env bash
# Issue 41 on a real GPU (no Slurm there): after `apply` of an MPS profile with [slurm] on,
# a process started with exactly the environment a `srun --gres=mps:25` task gets reaches
# gpushare's MPS server at 25 % threads, read back through the control daemon and by the
# client itself (its SM count). The task's environment is what Slurm 22.05 sets for such a
# task (CUDA_VISIBLE_DEVICES=<Slurm's index>, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25:
# tests/e2e/slurm.rs records it) plus what the package's TaskProlog prints for it from the
# agent's gres.conf. Hands off: MIG, compute mode and time-slice are left alone; the MPS
# server and gres.conf live under a scratch directory.
#   tests/device/slurm-mps-env.sh BIN_DIR OUT_DIR   (carry .carry/bin and .carry/dbus)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v dbus-daemon >/dev/null || export PATH="$root/.carry/dbus/wrap:$PATH"
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
printf '[cdi]\ndir = "%s/cdi"\n[slurm]\nenabled = true\ngres_conf = "%s/gres.conf"\n' "$work" "$work" >>"$work/agent.toml"
exec > >(tee "$out/slurm-mps-env.txt") 2>&1
start_agent "$out/agent.log"
trap stop_all_disabled EXIT
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode,memory.total --format=csv,noheader

# One MPS server on GPU 0, for 4 clients (25 % threads each).
printf 'name = "four-shares"\n[[gpu]]\nselect = 0\nmig = "disabled"\nsharing.mps = { replicas = 4 }\n' >"$work/four.toml"
ctl apply -f "$work/four.toml" || exit 1
echo "== the agent's gres.conf"
cat "$work/gres.conf"
cp "$work/gres.conf" "$out/gres.conf"
ctl status --json >"$out/status.json"

# Slurm's index of GPU 0: its line's place in the map (GPU 0 is index 0 on one GPU).
uuid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpus"][0]["uuid"])' "$out/status.json")
index=$(sed -n "s/^# gpushare index \([0-9]*\) $uuid .*/\1/p" "$work/gres.conf")
echo "== Slurm's index of GPU 0 ($uuid): $index"
slurm_env=(CUDA_VISIBLE_DEVICES="$index" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 SLURM_JOB_ID=4242)
prolog=$(env -i PATH="$PATH" "${slurm_env[@]}" GPUSHARE_GRES_CONF="$work/gres.conf" sh "$root/packaging/slurm/gpushare-task-prolog")
echo "== the TaskProlog prints"
echo "$prolog"
task_env=("${slurm_env[@]}")
while read -r word assignment; do
  [ "$word" = export ] && task_env+=("$assignment")
done <<<"$prolog"
echo "== the task's environment: ${task_env[*]}"

cat >"$work/client.py" <<'PY'
import ctypes, os, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev = ctypes.c_int(); assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p(); r = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
assert r == 0, r
assert cuda.cuCtxSetCurrent(ctx) == 0
sms = ctypes.c_int()
cuda.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev)  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
print(f"client pid {os.getpid()}: {sms.value} SMs", flush=True)
time.sleep(float(os.environ.get("HOLD", "0")))
PY
echo "== a client with exactly that environment"
env -i PATH="$PATH" HOME="$work" HOLD=6 "${task_env[@]}" python3 "$work/client.py" &
client=$!
sleep 3
pipe=$(printf '%s\n' "${task_env[@]}" | sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p')
control() { echo "$1" | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 10 nvidia-cuda-mps-control; }
server=$(control get_server_list | head -n1)
echo "== the control daemon of $pipe"
echo "server: $server"
echo "client $client among its clients: $(control "get_client_list $server" | grep -qx "$client" && echo yes || echo NO)"
echo "active thread percentage of $server: $(control "get_active_thread_percentage $server")"
echo "the agent's status of GPU 0: $(ctl status --json | python3 -c 'import json,sys; g=json.load(sys.stdin)["gpus"][0]["sharing"]["mps"]; print(g["pipe_directory"], g["active_thread_percentage"])')"
wait "$client"
echo "client exit $?"
