# Shared by the device scripts (sourced, not run): a private bus with the agent on it, and
# a small CUDA client. Needs $bin (release binaries), $root (the repository), $work (a
# scratch directory).

# Starts a measuring script's run: $bin (the release binaries in $1, made absolute), $out
# ($2, created), a scratch $work and its hands-off agent.toml.
begin_run() {
  bin=$(cd "$1" && pwd)
  out=$2
  work=$(mktemp -d)
  mkdir -p "$out"
  write_hands_off_config
}

# gpushare-ctl of $bin (scripts may define their own after sourcing this).
ctl() { "$bin/gpushare-ctl" "$@"; }

# $work/agent.toml for a host you do not own: MIG and compute modes left alone, the MPS
# servers under $work, no metrics listener.
write_hands_off_config() {
  printf '[gpu]\nmanage_mig = false\nmanage_compute_mode = false\nmanage_timeslice = false\n[mps]\nroot = "%s/mps"\n[metrics]\nenabled = false\n' \
    "$work" >"$work/agent.toml"
}

# Times five applies through the running agent of an MPS profile with both limits, each
# followed by all-disabled: "agent switch I: N ms" (gpushare-ctl's wall time).
time_agent_switches() {
  local i t
  for i in 1 2 3 4 5; do
    printf 'name = "switch"\n[[gpu]]\nselect = "all"\nmig = "disabled"\nsharing.mps = { active_thread_percentage = %d, pinned_memory_limit = "20GiB" }\n' \
      $((30 + i)) >"$work/switch.toml"
    t=$(date +%s%N)
    ctl apply -f "$work/switch.toml" >/dev/null 2>&1 || echo "apply failed"
    echo "agent switch $i: $((($(date +%s%N) - t) / 1000000)) ms"
    ctl apply all-disabled >/dev/null 2>&1
  done
}

# Starts dbus-daemon on $work/bus and gpushare-agent (NVML) on it with $work/agent.toml,
# logging to $1 (at $agent_log_level, default info); exports GPUSHARE_BUS_ADDRESS and waits
# until the agent answers.
start_agent() {
  dbus-daemon --config-file="$root/tests/dbus/session.conf" --address="unix:path=$work/bus" \
    --nofork --nopidfile --print-address=1 >"$work/address" 2>/dev/null &
  bus_pid=$!
  for _ in $(seq 100); do [ -s "$work/address" ] && break; sleep 0.05; done
  export GPUSHARE_BUS_ADDRESS=$(head -n1 "$work/address")
  GPUSHARE_LOG=${agent_log_level:-info} "$bin/gpushare-agent" --bus "$GPUSHARE_BUS_ADDRESS" --config "$work/agent.toml" \
    --state-dir "$work/state" --profiles-dir "$work/profiles.d" 2>"$1" &
  agent_pid=$!
  for _ in $(seq 200); do "$bin/gpushare-ctl" status --json >/dev/null 2>&1 && break; sleep 0.05; done
}

# Stops the agent (it finishes a running apply first), then the bus.
stop_agent() {
  kill "$agent_pid"; wait "$agent_pid" 2>/dev/null
  kill "$bus_pid"
}

# Writes a CUDA client (Python, ctypes on libcuda) to $1: it times its first context, then
# allocates each size in GiB given as an argument, then sleeps $HOLD seconds if set.
write_cuda_client() {
  cat >"$1" <<'PY'
import ctypes, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
t = time.perf_counter()
assert cuda.cuInit(0) == 0
dev = ctypes.c_int(); assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p(); r = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
assert r == 0, r
assert cuda.cuCtxSetCurrent(ctx) == 0
print(f"first context: {(time.perf_counter() - t) * 1000:.1f} ms pid {os.getpid()}", flush=True)
for gib in [float(a) for a in sys.argv[1:]]:
    p = ctypes.c_uint64()
    r = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(gib * (1 << 30))))
    print(f"alloc {gib:g} GiB: {'ok' if r == 0 else f'fails (CUDA error {r})'}", flush=True)
    if r == 0:
        cuda.cuMemFree_v2(p)
if os.environ.get("HOLD"):
    time.sleep(float(os.environ["HOLD"]))
PY
}

# Runs "$@" as user $1 (root: as is), keeping the environment (a pipe directory), with no
# supplementary group.
as() {
  local who=$1
  shift
  if [ "$who" = root ]; then "$@"; else HOME=/tmp setpriv --reuid="$who" --regid="$(id -g "$who")" --clear-groups "$@"; fi
}

# At a measuring script's exit: the GPUs back to all-disabled, the agent and bus stopped,
# and whether an MPS daemon was left ("no MPS daemon left" / "MPS DAEMON LEFT").
stop_all_disabled() {
  ctl apply all-disabled >/dev/null 2>&1
  stop_agent
  sleep 1
  ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
}
