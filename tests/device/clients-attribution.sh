#!/usr/bin/env bash
# Issue 29 on a real GPU: who uses it, attributed. Hands off (MIG, compute mode and
# time-slice left alone; the MPS server under a scratch directory). On GPU 0, with an MPS
# profile applied through the agent:
#   A. a PyTorch client as user `nobody` through the gpushare MPS server;
#   B. then (MPS serves one user at a time) one as user `daemon` through it, beside a
#      PyTorch client as root directly on the GPU (no MPS variables);
#   C. eight MPS clients (root) at once, and `status`, `clients` and bare NVML reads timed.
# At each point: what the clients hold by their own account (torch_client.py), NVML's
# process lists (nvml_processes.py: the compute and the MPS lists), nvidia-smi, the control
# daemon's client list and `gpushare-ctl clients --json` (as root and as `nobody`).
# Allocations are large (12-16 GiB) because NVML counts a client's CUDA context in its
# memory (about 320 MiB through MPS and 610 MiB directly on the H200), so that the
# allocation and NVML's figure can agree within 5 %. Everything lands in OUT_DIR.tgz (the
# device tool brings back only a few files), written at the end or when interrupted.
#   tests/device/clients-attribution.sh BIN_DIR OUT_DIR   (carry .carry/bin, with
#   gpushare-agent, gpushare-ctl and gpushare-bench of a release build, and .carry/dbus)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v dbus-daemon >/dev/null || export PATH="$root/.carry/dbus/wrap:$PATH"
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
# Other users reach the pipe directory through the scratch directory, and mark themselves
# ready in a directory anyone may write.
chmod 755 "$work"
mkdir -m 1777 "$work/ready"
printf '[cdi]\ndir = "%s/cdi"\n' "$work" >>"$work/agent.toml"
exec > >(tee "$out/clients.txt") 2>&1
agent_log_level=debug start_agent "$out/agent.log"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  # Only the clients: a bare `wait` would wait for the tee below too.
  [[ ${#pids[@]} -gt 0 ]] && wait "${pids[@]}" 2>/dev/null
  ctl apply all-disabled >/dev/null 2>&1
  stop_agent
  sleep 1
  ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
  tar -C "$(dirname "$out")" -czf "$out.tgz" "$(basename "$out")" && rm -rf "$out"
}
trap cleanup EXIT
step() { echo; echo "== $*"; }
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'

printf 'name = "two-shares"\n[[gpu]]\nselect = 0\nmig = "disabled"\nsharing.mps = { replicas = 2 }\n' >"$work/two.toml"
ctl apply -f "$work/two.toml" || exit 1
pipe=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); d=next(d for d in s["devices"] if d["name"]=="0-mps-0"); print(next(e.split("=",1)[1] for e in d["containerEdits"]["env"] if e.startswith("CUDA_MPS_PIPE_DIRECTORY=")))' "$work/cdi/gpushare.json")
echo "pipe directory: $pipe"; ls -ld "$pipe" "$(dirname "$pipe")"
control() { echo "$1" | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 10 nvidia-cuda-mps-control; }

# Starts a torch client: $1 label, $2 user (root for none), $3 GiB, $4 through MPS (yes/no).
start_client() {
  local label=$1 user=$2 gib=$3 mps=$4 home=$work/home-$1
  mkdir -p "$home"; chmod 777 "$home"
  local envs=(PATH="$PATH" HOME="$home" READY="$work/ready/$label" HOLD=120)
  [[ $mps == yes ]] && envs+=(CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$pipe/../log")
  if [[ $user == root ]]; then
    env -i "${envs[@]}" python3 "$root/tests/device/torch_client.py" "$gib" >"$out/client-$label.json" 2>"$out/client-$label.err" &
  else
    setpriv --reuid="$user" --regid="$user" --clear-groups env -i "${envs[@]}" \
      python3 "$root/tests/device/torch_client.py" "$gib" >"$out/client-$label.json" 2>"$out/client-$label.err" &
  fi
  pids+=($!)
  eval "pid_$label=$!"
}
wait_ready() {
  for _ in $(seq 300); do
    local all=1
    for l in "$@"; do [[ -e $work/ready/$l ]] || all=0; done
    [[ $all == 1 ]] && return 0
    sleep 0.1
  done
  echo "NOT READY: $*"; for l in "$@"; do tail -n 5 "$out/client-$l.err"; done
}
look() {
  local tag=$1
  step "$tag: the clients' own account"; for f in "$out"/client-*.json; do echo "$(basename "$f"): $(cat "$f")"; done
  step "$tag: NVML's lists"; python3 "$root/tests/device/nvml_processes.py" | tee "$out/nvml-$tag.json"
  step "$tag: nvidia-smi"; nvidia-smi | tee "$out/nvidia-smi-$tag.txt" | sed -n '/Processes/,$p'
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv | tee "$out/compute-apps-$tag.csv"
  step "$tag: control daemon"; s=$(control get_server_list | head -n1); echo "server $s clients: $(control "get_client_list $s" | tr '\n' ' ')"
  # The agent tells gpushare's MPS servers by their parent, the control daemon.
  ps -eo pid,ppid,user,comm,args | grep -E '[n]vidia-cuda-mps|[t]orch_client' 
  step "$tag: gpushare-ctl clients (root)"; ctl clients; ctl clients --json >"$out/clients-$tag.json"; cat "$out/clients-$tag.json"; echo
  step "$tag: gpushare-ctl clients (nobody)"; setpriv --reuid=65534 --regid=65534 --clear-groups "$bin/gpushare-ctl" clients
  step "$tag: gpushare-ctl status"; ctl status
}

step "A: PyTorch as nobody through MPS (16 GiB)"
start_client a 65534 16 yes
wait_ready a
look A
kill "$pid_a"; wait "$pid_a" 2>/dev/null; sleep 2

step "B: PyTorch as daemon through MPS (12 GiB), and as root directly (16 GiB)"
start_client b 1 12 yes
start_client direct root 16 no
wait_ready b direct
look B
kill "$pid_b" "$pid_direct"; wait "$pid_b" "$pid_direct" 2>/dev/null; sleep 2

# Times a command as gpushare-bench times gpushare-ctl (spawn to exit, in Rust), so that
# the figures compare with BENCHMARKS.md's: one Markdown row.
timer() { "$bin/gpushare-bench" --time "$1" -- "${@:2}"; }
timings() {
  echo "| measurement | runs | median ms | min ms | p90 ms | max ms |"; echo "|---|---|---|---|---|---|"
  timer 50 "$bin/gpushare-ctl" status
  timer 50 "$bin/gpushare-ctl" status --json
  timer 50 "$bin/gpushare-ctl" clients --json
  timer 20 nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  python3 "$root/tests/device/nvml_processes.py" --time 50
}
step "C0: timings with no client"
timings
step "C: eight MPS clients (root, 2 GiB each)"
for i in 1 2 3 4 5 6 7 8; do start_client c$i root 2 yes; done
wait_ready c1 c2 c3 c4 c5 c6 c7 c8
look C
step "C: timings with eight clients"
timings
