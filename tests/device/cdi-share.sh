#!/usr/bin/env bash
# Issue 28 on a real GPU (no container runtime needed): after `apply` of an MPS profile, a
# process started with exactly the environment of one share's entry in the agent's CDI
# spec (its mounts bind the same paths, which the host has already) reaches the MPS server
# with that share's limits in effect: read back through the control daemon (the server,
# its clients, its thread percentage) and by the client itself (SM count, a pinned memory
# allocation under and over the limit). Hands off: MIG, compute mode and time-slice are
# left alone; the MPS server lives under a scratch directory, the spec too.
#   tests/device/cdi-share.sh BIN_DIR OUT_DIR   (carry .carry/bin and .carry/dbus)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v dbus-daemon >/dev/null || export PATH="$root/.carry/dbus/wrap:$PATH"
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
printf '[cdi]\ndir = "%s/cdi"\n' "$work" >>"$work/agent.toml"
exec > >(tee "$out/cdi-share.txt") 2>&1
start_agent "$out/agent.log"
trap stop_all_disabled EXIT
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode,memory.total --format=csv,noheader

# One MPS server on GPU 0: replicas = 4 gives each share 25 % threads; 8 GiB pinned memory.
printf 'name = "four-shares"\n[[gpu]]\nselect = 0\nmig = "disabled"\nsharing.mps = { replicas = 4, pinned_memory_limit = "8GiB" }\n' >"$work/four.toml"
ctl apply -f "$work/four.toml" || exit 1
ctl cdi
cp "$work/cdi/gpushare.json" "$out/gpushare.json"

# Exactly the share's environment, from its spec entry; its mounts bind host paths as they are.
python3 - "$work/cdi/gpushare.json" 0-mps-1 >"$work/share.env" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
d = next(d for d in spec["devices"] if d["name"] == sys.argv[2])
edits = d["containerEdits"]
for m in edits.get("mounts", []):
    assert m["hostPath"] == m["containerPath"], m
for e in edits["env"]:
    print(e)
PY
echo "== the share's environment (gpushare.io/gpu=0-mps-1)"
cat "$work/share.env"
cat >"$work/client.py" <<'PY'
import ctypes, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev = ctypes.c_int(); assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p(); r = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
assert r == 0, r
assert cuda.cuCtxSetCurrent(ctx) == 0
sms = ctypes.c_int()
cuda.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev)  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
print(f"client pid {os.getpid()}: {sms.value} SMs", flush=True)
for gib in (4, 12):
    p = ctypes.c_uint64()
    r = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(gib << 30))
    print(f"alloc {gib} GiB: {'ok' if r == 0 else f'fails (CUDA error {r})'}", flush=True)
    if r == 0:
        cuda.cuMemFree_v2(p)
time.sleep(float(os.environ.get("HOLD", "0")))
PY
mapfile -t share_env <"$work/share.env"
echo "== a client with exactly that environment"
env -i PATH="$PATH" HOME="$work" HOLD=6 "${share_env[@]}" python3 "$work/client.py" &
client=$!
sleep 3
pipe=$(sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p' "$work/share.env")
control() { echo "$1" | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 10 nvidia-cuda-mps-control; }
server=$(control get_server_list | head -n1)
echo "== the control daemon of $pipe"
echo "server: $server"
echo "clients of $server: $(control "get_client_list $server" | tr '\n' ' ')"
echo "client $client among them: $(control "get_client_list $server" | grep -qx "$client" && echo yes || echo NO)"
echo "active thread percentage of $server: $(control "get_active_thread_percentage $server")"
echo "default pinned memory limit, device 0: $(control 'get_default_device_pinned_mem_limit 0')"
wait "$client"
echo "client exit $?"
