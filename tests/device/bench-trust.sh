#!/usr/bin/env bash
# Issue 27's acceptance on a real GPU host you do not own (MIG, compute mode and time-slice
# policy untouched: lib.sh's hands-off agent.toml; MIG is never benched), for ONE workload
# per call (the two do not fit one 9-minute call together, see the estimate below):
#   loop   the 256² loop (bench_loop.py small units: a 256x256 fp32 matmul + sync a unit)
#   torch  a launch-bound PyTorch replica (torch_launch_replica.py: a 4-layer MLP at batch 1)
# Steps, in this order:
#   1. solo spread: one copy alone by hand, SOLO_ROUNDS rounds, each one window pinned to
#      copy 0's CPU set and one unpinned, the first of the two alternating (hand_bench.py
#      solo-spread);
#   2. ORDER's sides (default bench,bench,hand): `gpushare-ctl bench --repeat ROUNDS
#      --cpus CPUS --strategies STRATEGIES --replicas REPLICAS` twice back to back (the
#      recommendation-stability check; the first also the side the hand run is compared
#      with, the second as well), and the same copies by hand (hand_bench.py, interleaved
#      exactly like gpushare: HAND_INTERLEAVE=1, the CPU sets and the measurement order
#      taken from the first bench's report where one ran before it, HAND_CPUS=CPUS also,
#      so the hand's own division is checked against the agent's);
#   3. compare-trust.py over the files: trust-WORKLOAD.md and trust-WORKLOAD.json.
# Stops every MPS daemon it started (the agent's, through the agent; its own, by its pipe
# directory), also on failure or a signal.
#
#   tests/device/bench-trust.sh BIN_DIR OUT_DIR loop|torch [SECONDS]
#   e.g. on the device: tests/device/bench-trust.sh .carry/bin "$OUT" loop 5
#   (carry .carry/bin and .carry/dbus: dbus-daemon is taken from .carry/dbus/wrap when
#   none is on PATH)
# Environment (defaults): REPLICAS (1,4), STRATEGIES (time-slicing,mps-limited), ROUNDS
# (3), SOLO_ROUNDS (3: 6 windows), ORDER (bench,bench,hand), CPUS (this shell's CPUs on GPU
# 0's NUMA node, as the agent picks them), OVERHEAD_S (4: a replica's start, warm-up and
# stop around each window, as the H100 runs of 2026-11-23 showed), BUDGET_S (510), FORCE
# (1: run even when the estimate is over BUDGET_S), LIMIT_S (570), REPLICA (a command line
# replacing the workload's on both sides: a dry run without a GPU).
#
# Wall-time estimate: every measurement costs SECONDS + OVERHEAD_S; a run of ROUNDS rounds
# measures ROUNDS x (1 + strategies x counts) (the baseline at least 3 times); the solo
# spread 2 x SOLO_ROUNDS; about 20 s besides (agent starts, nvidia-smi, MPS switches).
# Defaults, 5 s windows: (3 runs x 3 x (1 + 2x2) + 6) x 9 s + 20 s = 479 s = 8.0 min.
# All three strategies at 5 s would be (3 x 3 x 7 + 6) x 9 + 20 = 641 s: over; they fit
# with 3 s windows: (63 + 6) x 7 + 20 = 503 s. A step that would end past LIMIT_S (570)
# is skipped and said so, so that the clean-up always runs inside the 10-minute call.
#
# Output (8 files at most, as the device returns them): bench-WL-1.json, bench-WL-2.json,
# hand-WL.json, solo-WL.json, trust-WL.md, trust-WL.json, run-WL.txt (this script's
# output), raw-WL.tar.gz (agent logs, the replicas' logs, HTML reports, hand stderr).
set -uo pipefail
workload=$3
seconds=${4:-5}
replicas=${REPLICAS:-1,4}
strategies=${STRATEGIES:-time-slicing,mps-limited}
rounds=${ROUNDS:-3}
solo_rounds=${SOLO_ROUNDS:-3}
order=${ORDER:-bench,bench,hand}
overhead=${OVERHEAD_S:-4}
budget=${BUDGET_S:-510}
limit=${LIMIT_S:-570}
root=$(cd "$(dirname "$0")/../.." && pwd)
dev="$root/tests/device"
case $workload in
loop)
  bench_cmd=(python3 "$dev/bench_loop.py" small units)
  hand_cmd=()
  shape=small
  ;;
torch)
  bench_cmd=(python3 "$dev/torch_launch_replica.py")
  hand_cmd=(-- python3 "$dev/torch_launch_replica.py")
  shape=torch-mlp
  ;;
*)
  echo "usage: $0 BIN_DIR OUT_DIR loop|torch [SECONDS]" >&2
  exit 2
  ;;
esac
# A dry run without a GPU: REPLICA replaces the workload's command on both sides.
if [ -n "${REPLICA:-}" ]; then
  read -r -a bench_cmd <<<"$REPLICA"
  hand_cmd=(-- "${bench_cmd[@]}")
fi
case $seconds in '' | *[!0-9]*)
  echo "SECONDS is a whole number of seconds" >&2
  exit 2
  ;;
esac
case $strategies in *mig*)
  echo "MIG is not benched here (hands off)" >&2
  exit 2
  ;;
esac
command -v dbus-daemon >/dev/null || export PATH="$root/.carry/dbus/wrap:$PATH"
# shellcheck source=tests/device/lib.sh
. "$root/tests/device/lib.sh"
begin_run "$1" "$2"
raw=$work/raw
mkdir -p "$raw"
exec > >(tee "$out/run-$workload.txt") 2>&1
started=$(date +%s)
elapsed() { echo $(($(date +%s) - started)); }

# The estimate (see the header), and a refusal above the budget.
n_counts=$(echo "$replicas" | tr ',' '\n' | grep -c .)
n_strategies=$(echo "$strategies" | tr ',' '\n' | grep -c .)
n_sides=$(echo "$order" | tr ',' '\n' | grep -c .)
per_run=$((rounds * (1 + n_strategies * n_counts) + (rounds < 3 ? 3 - rounds : 0)))
run_s=$(((seconds + overhead) * per_run))
solo_s=$(((seconds + overhead) * 2 * solo_rounds))
estimate=$((n_sides * run_s + solo_s + 20))
echo "== bench-trust $workload: ${seconds}s windows, replicas $replicas, $strategies, $rounds rounds, order $order"
echo "estimate: $estimate s ($n_sides runs of $per_run measurements, ~$run_s s each; solo spread $solo_s s; budget $budget s)"
if [ "$estimate" -gt "$budget" ] && [ "${FORCE:-0}" != 1 ]; then
  echo "over the budget: fewer strategies, counts or rounds, shorter windows, or FORCE=1" >&2
  exit 2
fi
max_n=$(echo "$replicas" | tr ',' '\n' | sort -n | tail -n1)
if [ -z "${CPUS:-}" ]; then
  CPUS=$(cd "$dev" && python3 -c 'from units_copies import gpu_node_cpus, format_cpus; c, f = gpu_node_cpus(); print(format_cpus(c))')
fi
echo "CPUs divided among the replicas (--cpus and HAND_CPUS): $CPUS; largest N $max_n"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode,pci.bus_id --format=csv,noheader
echo "nproc $(nproc); kernel $(uname -r) (under gVisor, 4.4.0, an affinity is recorded but may not bind)"
cat /sys/devices/system/node/online 2>/dev/null || echo "no NUMA nodes in sysfs"
cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null || echo "no thread_siblings_list"

agent_up=0
agent_runs=0
# Quits every MPS daemon this script started: the agent's under $work/mps (through the
# agent first: stopping it mid-bench leaves its server to the next start), the hand
# one by its pipe directory; then says whether any is left.
cleanup() {
  set +e
  if [ "$agent_up" = 1 ]; then
    ctl apply all-disabled >/dev/null 2>&1
    stop_agent
    agent_up=0
  fi
  for control_socket in $(find "$work" -maxdepth 6 -name control 2>/dev/null); do
    echo "quitting the MPS daemon of $(dirname "$control_socket")"
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$(dirname "$control_socket") timeout 10 nvidia-cuda-mps-control
  done
  sleep 1
  ps -eo stat=,pid=,args= | grep -v '^Z' | grep '[n]vidia-cuda-mps' && echo "MPS DAEMON LEFT" || echo "no MPS daemon left"
  cp "$work"/agent-*.log "$raw"/ 2>/dev/null
  tar -C "$work" -czf "$out/raw-$workload.tar.gz" raw 2>/dev/null
  echo "done after $(elapsed) s (estimate $estimate s)"
  sleep 0.5 # tee's last lines
}
trap cleanup EXIT
trap 'echo "stopped by a signal"; exit 130' INT TERM

# Whether a step of `$1` seconds still ends before LIMIT_S; says so when it does not.
fits() {
  if [ $(($(elapsed) + $1)) -gt "$limit" ]; then
    echo "SKIPPED $2: $(elapsed) s gone, it needs ~$1 s, the limit is $limit s"
    return 1
  fi
}

solo() {
  fits "$solo_s" "solo spread" || return
  echo "== [$(elapsed) s] solo spread: one copy alone, $solo_rounds rounds pinned/unpinned"
  HAND_CPUS=$CPUS timeout $((limit - $(elapsed))) python3 "$dev/hand_bench.py" solo-spread "$shape" "$seconds" \
    "$solo_rounds" "$max_n" "$work" "${hand_cmd[@]}" >"$out/solo-$workload.json" 2>"$raw/solo-$workload.err"
  echo "exit $?"
  tail -n "$((2 * solo_rounds))" "$raw/solo-$workload.err"
}

bench() {
  local k=$1 rc t
  fits "$run_s" "gpushare run $k" || return
  echo "== [$(elapsed) s] gpushare-ctl bench, run $k"
  agent_runs=$((agent_runs + 1))
  start_agent "$work/agent-$agent_runs.log"
  agent_up=1
  t=$(date +%s%N)
  # SIGINT at the limit: ctl cancels the job and the agent restores the GPU.
  timeout -s INT $((limit - $(elapsed))) "$bin/gpushare-ctl" bench --replicas "$replicas" --strategies "$strategies" \
    --duration "${seconds}s" --repeat "$rounds" --cpus "$CPUS" --objective throughput \
    --logs "$raw/logs-$workload-$k" --report "$raw/bench-$workload-$k.html" --json \
    -- "${bench_cmd[@]}" >"$out/bench-$workload-$k.json"
  rc=$?
  echo "exit $rc after $((($(date +%s%N) - t) / 1000000)) ms"
  python3 - "$out/bench-$workload-$k.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no report")
if "error" in r:
    sys.exit(f"error: {r['error']}")
print("estimate", r.get("estimate_seconds"), "s; wall", round(r.get("wall_seconds", 0), 1), "s")
print("pinning", json.dumps(r.get("pinning")))
print("noise", json.dumps(r.get("noise")))
for rec in r.get("recommendations", []):
    print(f"N={rec['replicas']}: {rec['strategy']} {rec.get('indistinguishable', [])} - {rec['reason']}")
PY
  stop_agent
  agent_up=0
  [ -s "$first_report" ] || first_report=$out/bench-$workload-$k.json
}

by_hand() {
  fits "$run_s" "the hand run" || return
  echo "== [$(elapsed) s] by hand (hand_bench.py, interleaved like gpushare)"
  local like=()
  if [ -s "$first_report" ] && python3 -c "import json,sys; json.load(open(sys.argv[1]))['sequence']" "$first_report" 2>/dev/null; then
    like=(HAND_LIKE="$first_report")
    echo "CPU sets and order from $first_report"
  else
    echo "CPU sets and order by hand_bench.py's own rule (no gpushare report before it)"
  fi
  env "${like[@]}" HAND_CPUS="$CPUS" HAND_INTERLEAVE=1 timeout $((limit - $(elapsed))) \
    python3 "$dev/hand_bench.py" "$shape" "$seconds" "$replicas" "$work" "$rounds" "$strategies" window \
    "${hand_cmd[@]}" >"$out/hand-$workload.json" 2>"$raw/hand-$workload.err"
  echo "exit $?"
  python3 -c "
import json, sys
h = json.load(open(sys.argv[1]))
print('pinning', json.dumps(h.get('pinning')), '; order from', h.get('order_from'))
for r in h['runs']:
    print(r['strategy'], r['replicas'], round(r['aggregate_per_s'], 1), [round(x) for x in r['measurements']])
print('recommendations', json.dumps(h['recommendations']))
" "$out/hand-$workload.json" || tail -n 20 "$raw/hand-$workload.err"
}

first_report=
solo
k=0
for side in ${order//,/ }; do
  case $side in
  bench)
    k=$((k + 1))
    bench "$k"
    ;;
  hand) by_hand ;;
  *) echo "unknown side $side in ORDER" ;;
  esac
done
echo "== [$(elapsed) s] compare-trust.py"
python3 "$dev/compare-trust.py" "$out" --workload "$workload" --md "$out/trust-$workload.md" \
  --json "$out/trust-$workload.json"
verdict=$?
echo "compare-trust exit $verdict (0 met, 1 not met, 2 no figures)"
exit "$verdict"
