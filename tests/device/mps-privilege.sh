#!/usr/bin/env bash
# Issue 36 on a real GPU, hands off the GPU's settings (no MIG, compute-mode or time-slice
# change): what NVIDIA's MPS control daemon, started by root with a pipe directory of our
# own, answers to another user's commands (each command's stdout, stderr and exit status,
# queries and settings alike) and whether that user's settings take effect; then two
# users' PyTorch clients through one daemon, started without and with -M
# (--multiuser-server): which servers run and as whom, which clients each serves, when each
# client got its context and what it saw (SMs, memory under and over the pinned limit).
# Stops every daemon it starts and removes the user it adds.
#   tests/device/mps-privilege.sh OUT_DIR
set -uo pipefail
out=${1:-$(mktemp -d)}
mkdir -p "$out"
exec > >(tee "$out/mps-privilege.txt") 2>&1
work=$(mktemp -d /tmp/mps-privilege.XXXXXX)
chmod 755 "$work"
export CUDA_MPS_PIPE_DIRECTORY=$work/pipe CUDA_MPS_LOG_DIRECTORY=$work/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
chmod 755 "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
other=gsmpsb
# Made here, or the run stops: an account that was there is not ours to use or remove.
if useradd -r -M -s /usr/sbin/nologin "$other"; then made_user=1; else echo "useradd $other failed"; exit 1; fi
id nobody; id "$other"

# Our daemon only (its pid file in our pipe directory): the host is shared, and another
# session's MPS daemons are not ours to stop.
daemon_pid() { cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2>/dev/null; }
ours_running() { local p; p=$(daemon_pid) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }
stop_daemon() {
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  for _ in $(seq 50); do ours_running || break; sleep 0.1; done
}
cleanup() {
  stop_daemon
  if ours_running; then
    pkill -P "$(daemon_pid)" 2>/dev/null
    kill "$(daemon_pid)" 2>/dev/null
  fi
  sleep 0.5
  [ "${made_user:-}" = 1 ] && userdel "$other" 2>/dev/null
  cp -r "$CUDA_MPS_LOG_DIRECTORY" "$out/mps-log" 2>/dev/null
  ps -eo stat=,user=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS LEFT" || echo "no MPS daemon left"
}
trap cleanup EXIT

# shellcheck source=tests/device/lib.sh
. "$(dirname "$0")/lib.sh"
# One control command as user $1: its exit status, stdout and stderr, each line marked.
ask() {
  local who=$1
  shift
  echo "> [$who] $*"
  echo "$*" | as "$who" nvidia-cuda-mps-control >"$work/o" 2>"$work/e"
  echo "[exit $?]"
  sed 's/^/  stdout: /' "$work/o"
  sed 's/^/  stderr: /' "$work/e"
}

install -m 644 "$(dirname "$0")/mps_client.py" "$work/client.py"

nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv,noheader
echo "== nvidia-cuda-mps-control -h"
nvidia-cuda-mps-control -h 2>&1

echo "== A: a root daemon (no -M), limits 40 % and 8G, a root client holding the server"
nvidia-cuda-mps-control -d
echo "[start exit $?]"
ask root set_default_active_thread_percentage 40
ask root set_default_device_pinned_mem_limit 0 8G
HOLD=25 python3 "$work/client.py" root-a >"$work/root-a.json" 2>&1 &
root_client=$!
for _ in $(seq 100); do [ -s "$work/root-a.json" ] && break; sleep 0.2; done
cat "$work/root-a.json"
cpid=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["pid"])' "$work/root-a.json")
srv=$(echo get_server_list | nvidia-cuda-mps-control | head -1)
echo "server $srv, client $cpid"
ps -o user=,pid=,args= -p "$srv"

for who in nobody "$other"; do
  echo "== A: every command as $who against root's daemon"
  ask "$who" get_server_list
  ask "$who" get_server_status "$srv"
  ask "$who" get_client_list "$srv"
  ask "$who" get_device_client_list
  ask "$who" get_device_client_list "$srv"
  ask "$who" ps
  ask "$who" get_default_active_thread_percentage
  ask "$who" get_active_thread_percentage "$srv"
  ask "$who" get_default_device_pinned_mem_limit 0
  ask "$who" get_device_pinned_mem_limit "$srv" 0
  ask "$who" set_default_active_thread_percentage 90
  ask "$who" set_active_thread_percentage "$srv" 90
  ask "$who" set_default_device_pinned_mem_limit 0 30G
  ask "$who" set_device_pinned_mem_limit "$srv" 0 30G
  ask "$who" set_default_client_priority 1
  ask "$who" terminate_client "$srv" "$cpid"
  ask "$who" start_server -uid "$(id -u "$who")"
  ask "$who" shutdown_server "$srv"
  ask "$who" no_such_command
  ask "$who" quit
  echo "== A: read back as root after $who"
  ask root get_server_list
  ask root get_default_active_thread_percentage
  ask root get_active_thread_percentage "$srv"
  ask root get_default_device_pinned_mem_limit 0
  ask root get_device_pinned_mem_limit "$srv" 0
  ask root get_client_list "$srv"
  ours_running && echo "daemon still runs" || echo "DAEMON GONE"
done

echo "== A: root changes a running server's limits (the agent's mps limit), read back"
ask root set_active_thread_percentage "$srv" 30
ask root get_active_thread_percentage "$srv"
ask root set_device_pinned_mem_limit "$srv" 0 6G
ask root get_device_pinned_mem_limit "$srv" 0
ask root get_default_active_thread_percentage

echo "== A: $other's client while root's server serves root's client (no -M)"
as "$other" env HOLD=2 python3 "$work/client.py" "$other-a" >"$work/other-a.json" 2>&1 &
other_client=$!
sleep 5
ask root get_server_list
ask root ps
ps -eo user=,pid=,args= | grep '[n]vidia-cuda-mps-server'
wait "$root_client"
wait "$other_client"
cat "$work/root-a.json" "$work/other-a.json"
ask root get_server_list
ps -eo user=,pid=,args= | grep '[n]vidia-cuda-mps-server'
stop_daemon

echo "== B: a root daemon with -M (multi-user), the same limits; root's and $other's clients at once"
nvidia-cuda-mps-control -d -M
echo "[start exit $?]"
ask root set_default_active_thread_percentage 40
ask root set_default_device_pinned_mem_limit 0 8G
HOLD=12 python3 "$work/client.py" root-b >"$work/root-b.json" 2>&1 &
root_client=$!
as "$other" env HOLD=12 python3 "$work/client.py" "$other-b" >"$work/other-b.json" 2>&1 &
other_client=$!
for _ in $(seq 150); do [ -s "$work/root-b.json" ] && [ -s "$work/other-b.json" ] && break; sleep 0.2; done
ask root get_server_list
for s in $(echo get_server_list | nvidia-cuda-mps-control); do
  ask root get_client_list "$s"
  ask root get_active_thread_percentage "$s"
done
ask root ps
ps -eo user=,pid=,args= | grep '[n]vidia-cuda-mps-server'
srv=$(echo get_server_list | nvidia-cuda-mps-control | head -1)
ocpid=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["pid"])' "$work/other-b.json" 2>/dev/null)
rcpid=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["pid"])' "$work/root-b.json" 2>/dev/null)
echo "== B: as $other against the multi-user daemon"
ask "$other" get_client_list "$srv"
ask "$other" set_active_thread_percentage "$srv" 90
ask "$other" terminate_client "$srv" "$rcpid"
ask "$other" terminate_client "$srv" "$ocpid"
ask "$other" quit
ask root get_client_list "$srv"
ask root get_active_thread_percentage "$srv"
wait "$root_client"
wait "$other_client"
cat "$work/root-b.json" "$work/other-b.json"
stop_daemon
echo "== done"
