#!/usr/bin/env bash
# Issue 36 (finding 2) on a real GPU through the real agent, hands off (MIG, compute mode
# and time-slice left alone; the MPS server and its pipe directory under a scratch
# directory; a private bus): an MPS profile on GPU 0 applied without and then with
# multi_user, and two users' PyTorch clients (root, and a user this script adds and removes)
# through gpushare's server. It records what each client saw (when it got its CUDA context,
# its SMs, a pinned allocation under and over the limit), what `gpushare-ctl status`,
# `mps status --json` and `clients` said meanwhile, `mps limit` on a client with the views
# after it (and a new client of that server, which gets the new limit), the other user's
# `set_active_thread_percentage` against the agent's daemon (refused) and root's
# `set_default_active_thread_percentage` by hand (drift, then put back by the agent's
# health check). Stops every daemon it starts; about two minutes of device time.
#   tests/device/mps-users.sh BIN_DIR OUT_DIR             (carry .carry/bin and .carry/dbus)
#   tests/device/mps-users.sh BIN_DIR OUT_DIR --simulate  (no GPU: the simulated driver and
#       control daemon, `sleep` clients declared with --fake-client; checks the script)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v dbus-daemon >/dev/null || export PATH="$root/.carry/dbus/wrap:$PATH"
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
simulate=${3:-}
begin_run "$1" "$2"
chmod 755 "$work"
exec > >(tee "$out/mps-users.txt") 2>&1
# Hands off, MPS under $work, a health check every 2 s (the drift part waits for two).
printf '[gpu]\nmanage_mig = false\nmanage_compute_mode = false\nmanage_timeslice = false\n[mps]\nroot = "%s/mps"\nhealth_interval_seconds = 2\n[metrics]\nenabled = false\n[cdi]\ndir = "%s/cdi"\n' \
  "$work" "$work" >"$work/agent.toml"
other=gsmpsu
# Made here, or the run stops: an account that was there is not ours to use or remove.
if useradd -r -M -s /usr/sbin/nologin "$other"; then made_user=1; else echo "useradd $other failed"; exit 1; fi
id "$other"

if [ "$simulate" = --simulate ]; then
  # The simulated driver beside the agent; the agent runs the simulated tools by default.
  agent_args=(--simulate h100-80gb:1)
  cp "$bin/gpushare-sim-nvidia-cuda-mps-control" "$work/mps-control"
else
  agent_args=()
  cp "$(command -v nvidia-cuda-mps-control)" "$work/mps-control"
fi
chmod 755 "$work/mps-control"

# start_agent of lib.sh, with the agent's arguments for a simulation.
start_agent_with() {
  dbus-daemon --config-file="$root/tests/dbus/session.conf" --address="unix:path=$work/bus" \
    --nofork --nopidfile --print-address=1 >"$work/address" 2>/dev/null &
  bus_pid=$!
  for _ in $(seq 100); do [ -s "$work/address" ] && break; sleep 0.05; done
  export GPUSHARE_BUS_ADDRESS=$(head -n1 "$work/address")
  GPUSHARE_LOG=info "$bin/gpushare-agent" "${agent_args[@]}" --bus "$GPUSHARE_BUS_ADDRESS" \
    --config "$work/agent.toml" --state-dir "$work/state" --profiles-dir "$work/profiles.d" \
    2>"$out/agent.log" &
  agent_pid=$!
  for _ in $(seq 200); do ctl status --json >/dev/null 2>&1 && break; sleep 0.05; done
}
start_agent_with
clients=()
daemons=()
cleanup() {
  # Only the clients: a bare `wait` would also wait for the `tee` of the output.
  for c in "${clients[@]}"; do kill "$c" 2>/dev/null; wait "$c" 2>/dev/null; done
  ctl apply all-disabled >/dev/null 2>&1
  stop_agent
  sleep 1
  [ "${made_user:-}" = 1 ] && userdel "$other" 2>/dev/null
  local left=0 d
  for d in "${daemons[@]}"; do
    ps -o stat=,user=,pid=,args= -p "$d" | grep -v '^Z' && left=1
  done
  # On the GPU host nothing else runs MPS: any MPS process left is this run's.
  if [ -z "$simulate" ]; then
    ps -eo stat=,user=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && left=1
  fi
  [ "$left" = 0 ] && echo "no MPS daemon left" || echo "MPS DAEMON LEFT"
}
trap cleanup EXIT
[ -z "$simulate" ] && nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode,memory.total --format=csv,noheader

# One control command to the agent's daemon as user $1: exit status and answer lines.
ask() {
  local who=$1
  shift
  echo "> [$who] $*"
  echo "$*" | as "$who" env CUDA_MPS_PIPE_DIRECTORY="$pipe" "$work/mps-control" >"$work/o" 2>"$work/e"
  echo "[exit $?]"
  sed 's/^/  stdout: /' "$work/o"
  sed 's/^/  stderr: /' "$work/e"
}
# What the views say now, under a heading.
views() {
  echo "== views: $1"
  ctl status
  echo "-- mps status --json"
  ctl mps status --json
  echo "-- mps"
  ctl mps
  echo "-- clients"
  ctl clients
}
# The agent's control daemon and its children, and every MPS server, as the kernel shows
# them (user, pid, parent): whom a server runs as, and whether the daemon is its parent.
mps_processes() {
  local daemon
  daemon=$(ctl mps status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["servers"][0]["pid"])')
  daemons+=("$daemon")
  echo "-- processes (user pid ppid args)"
  ps -o user=,pid=,ppid=,args= -p "$daemon"
  ps -o user=,pid=,ppid=,args= --ppid "$daemon"
  ps -eo user=,pid=,ppid=,args= | grep '[n]vidia-cuda-mps-server' || echo "(no nvidia-cuda-mps-server process)"
}

install -m 644 "$(dirname "$0")/mps_client.py" "$work/client.py"

# Starts a client of user $1 named $2 holding its context $3 s after it reports, through
# the agent's server of GPU 0 (the variables `gpushare-ctl env 0` gives); its report goes to
# $work/$2.json, its pid to $last. Simulated: a `sleep` declared to the daemon as that user,
# reporting when the daemon lists it (its context) and nothing of CUDA.
start_client() {
  local who=$1 name=$2 hold=$3 runas=()
  # A simple command in the background: $! is the client itself, not a subshell.
  [ "$who" = root ] || runas=(env HOME=/tmp setpriv --reuid="$who" --regid="$(id -g "$who")" --clear-groups)
  : >"$work/$name.json"
  chmod 666 "$work/$name.json"
  if [ "$simulate" = --simulate ]; then
    "${runas[@]}" sleep $((hold + 60)) &
    last=$!
    clients+=("$last")
    (
      t0=$(date +%s.%N)
      sleep 0.2
      "${runas[@]}" env CUDA_MPS_PIPE_DIRECTORY="$pipe" "$work/mps-control" --fake-client "$last" ||
        echo "--fake-client $last as $who failed"
      for _ in $(seq 900); do
        for s in $(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe "$work/mps-control"); do
          if echo "get_client_list $s" | CUDA_MPS_PIPE_DIRECTORY=$pipe "$work/mps-control" | grep -qx "$last"; then
            printf '{"who": "%s", "uid": %s, "pid": %s, "start": %s, "context": %s, "sms": "(simulated)"}\n' \
              "$name" "$(id -u "$who")" "$last" "$t0" "$(date +%s.%N)" >>"$work/$name.json"
            sleep "$hold"
            kill "$last" 2>/dev/null
            printf '{"who": "%s", "end": %s}\n' "$name" "$(date +%s.%N)" >>"$work/$name.json"
            exit 0
          fi
        done
        sleep 0.1
      done
    ) &
    clients+=("$!")
  else
    "${runas[@]}" env HOLD="$hold" "${client_env[@]}" python3 "$work/client.py" "$name" >>"$work/$name.json" 2>&1 &
    last=$!
    clients+=("$last")
  fi
}
# The pid the report of client $1 names, once it has its context (up to $2 s).
reported_pid() {
  for _ in $(seq $(($2 * 5))); do [ -s "$work/$1.json" ] && break; sleep 0.2; done
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["pid"])' "$work/$1.json" 2>/dev/null
}

apply_profile() {
  printf 'name = "%s"\n[[gpu]]\nselect = 0\nmig = "disabled"\nsharing.mps = { replicas = 4, pinned_memory_limit = "8GiB"%s }\n' \
    "$1" "$2" >"$work/$1.toml"
  ctl apply -f "$work/$1.toml" || exit 1
  mapfile -t client_env < <(ctl env 0 | sed -n "s/^export \([A-Z_]*\)='\(.*\)'$/\1=\2/p")
  pipe=$(printf '%s\n' "${client_env[@]}" | sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p')
  echo "client environment: ${client_env[*]}"
}

echo "== A: one user at a time (no multi_user): root's client, then $other's while root's runs"
apply_profile one-user ""
start_client root root-a 25
root_a=$last
reported_pid root-a 120 >/dev/null
start_client "$other" other-a 20
sleep 5
mps_processes
views "root's client served, $other's waiting"
wait "$root_a" 2>/dev/null
other_pid=$(reported_pid other-a 120)
mps_processes
views "$other's client served"
echo "== A: mps limit on $other's client $other_pid"
ctl mps limit --pid "$other_pid" --threads 40 --json
echo
ctl mps limit --pid "$other_pid" --threads 50
views "after mps limit"
echo "== A: a new client of $other: the server's new clients get the new limit"
start_client "$other" other-a2 2
wait "$last" 2>/dev/null
sleep 1
cat "$work/root-a.json" "$work/other-a.json" "$work/other-a2.json"
for c in "${clients[@]}"; do wait "$c" 2>/dev/null; done
clients=()

echo "== B: multi_user = true: root's and $other's clients at once"
apply_profile multi-user ", multi_user = true"
mps_processes
start_client root root-b 15
start_client "$other" other-b 15
reported_pid root-b 120 >/dev/null
reported_pid other-b 120 >/dev/null
mps_processes
views "both clients of the multi-user server"
server=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe "$work/mps-control" | head -n1)
echo "== B: $other's setting against the agent's daemon (refused), root's by hand (drift)"
ask "$other" set_active_thread_percentage "$server" 90
ask "$other" set_default_active_thread_percentage 90
ask root get_active_thread_percentage "$server"
ask root set_default_active_thread_percentage 90
t=$(date +%s%N)
views "root changed the daemon's default by hand"
ctl assert -f "$work/multi-user.toml"
echo "[assert exit $?]"
for _ in $(seq 100); do grep -q 'put back' "$out/agent.log" && break; sleep 0.1; done
echo "put back after $((($(date +%s%N) - t) / 1000000)) ms: $(grep 'put back' "$out/agent.log" | tail -n1)"
ask root get_default_active_thread_percentage
views "after the health check"
ctl assert -f "$work/multi-user.toml"
echo "[assert exit $?]"
for c in "${clients[@]}"; do wait "$c" 2>/dev/null; done
clients=()
cat "$work/root-b.json" "$work/other-b.json"
for d in "$work"/mps/*/; do cp -r "$d/log" "$out/mps-log-$(basename "$d")" 2>/dev/null; done
echo "== done"
