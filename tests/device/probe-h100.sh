#!/usr/bin/env bash
# The built-in CUDA interference probe on a real GPU, under time-slicing (the GPU as it is:
# no MPS) and under MPS (a bare daemon with its own pipe directory, started here and stopped
# before exiting). Changes no GPU setting: MIG, compute mode and time-slice stay as found.
#   tests/device/probe-h100.sh BIN_DIR [OUT_DIR]
# BIN_DIR holds gpushare-agent (a release build); OUT_DIR, when given, receives the full
# JSON of every sweep. Summaries go to stdout. PROBE_PTX=FILE checks that PTX file
# instead of the one built in.
set -uo pipefail
bin=${1:?usage: probe-h100.sh BIN_DIR [OUT_DIR]}
agent=$bin/gpushare-agent
out=${2:-}
work=$(mktemp -d)
[ -x "$agent" ] || { echo "no $agent"; exit 2; }

cat >"$work/summary.py" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"  sweep wall time {r['wall_seconds']:.1f} s")
print(f"  {'workload':8} {'N':>2} {'solo/s':>9} {'sum/s':>9} {'scaling':>7} {'jain':>5} "
      f"{'p50 solo':>9} {'p50 mean':>9} {'p99 infl':>8} {'slowdown min..max':>17} {'late ms':>7}")
for run in r["runs"]:
    sl = [c["slowdown"] for c in run["per_client"]]
    p50 = sum(c["p50_ms"] for c in run["per_client"]) / len(run["per_client"])
    print(f"  {run['workload']:8} {run['clients']:>2} {run['solo_throughput_per_s']:>9.1f} "
          f"{run['aggregate_throughput_per_s']:>9.1f} {run['scaling']:>6.2f}x {run['jain_fairness']:>5.3f} "
          f"{run['solo_p50_ms']:>7.3f}ms {p50:>7.3f}ms {run['p99_inflation']:>7.1f}x "
          f"{min(sl):>7.2f}..{max(sl):<7.2f}  {run['max_late_ms']:>7.2f}")
seen = set()
for run in r["runs"]:
    s = run["solo"]
    if s["workload"] in seen:
        continue
    seen.add(s["workload"])
    a, d = s["achieved"], s["device"]
    print(f"  solo {s['workload']}: {a['value']:.2f} of {a['limit']:.2f} {a['unit']} "
          f"({100 * a['fraction_of_limit']:.0f}%; limit {a['limit_basis']}), kernels from {s['kernels']}, {d['name']}")
PY
cat >"$work/one.py" <<'PY'
import json, sys
l = sys.stdin.read()
try:
    r = json.loads(l)
    a = r["achieved"]
    print(f"{r['kernels']:6} {r['throughput_per_s']:9.1f}/s p50 {r['p50_ms']:.3f} ms  "
          f"{a['value']:.2f}/{a['limit']:.2f} {a['unit']}")
except Exception:
    print(l.strip())
PY
summary() { python3 "$work/summary.py" "$1"; }

probe() { # label workload counts seconds
    local label=$1; shift
    echo "== $label: --probe-run $*"
    local json=$work/$label-$1.json
    if "$agent" --probe-run "$@" >"$json" 2>"$work/err"; then
        summary "$json"
        [ -n "$out" ] && cp "$json" "$out/"
    else
        echo "  FAILED: $(tail -3 "$work/err")"
    fi
}

echo "== device"
nvidia-smi --query-gpu=name,driver_version,compute_mode,mig.mode.current,clocks.max.sm,clocks.max.mem --format=csv
nvidia-smi compute-policy -l 2>/dev/null | grep -i timeslice

echo "== launch workload blocks: ${GPUSHARE_PROBE_LAUNCH_BLOCKS:-the built-in default}"
echo "== no GPU access at all: a clear error, no figure"
CUDA_VISIBLE_DEVICES=none "$agent" --probe-client '{"workload":"launch","seconds":1,"start_at_unix_ms":0}'
echo "  [exit $?]"

echo "== kernels from the shipped PTX (compute_80, JIT) against NVRTC, 1 s solo each"
for w in launch compute memory; do
    for k in "${PROBE_PTX:-ptx}" auto; do
        printf '  %-7s %-4s ' "$w" "$k"
        GPUSHARE_PROBE_KERNELS=$k "$agent" --probe-client "{\"workload\":\"$w\",\"seconds\":1,\"start_at_unix_ms\":0}" 2>&1 |
            python3 "$work/one.py"
    done
done

echo "######## time-slicing (default compute mode, no MPS)"
probe ts launch 1,4,7 3
probe ts compute 1,7 3
probe ts-sweep all 1,2,4,7 3

echo "######## MPS (bare daemon, own pipe directory)"
export CUDA_MPS_PIPE_DIRECTORY=$work/mps/pipe CUDA_MPS_LOG_DIRECTORY=$work/mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
stop_mps() {
    local pid
    pid=$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" 2>/dev/null)
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
    for _ in $(seq 50); do
        [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill "$pid"
    echo "== MPS daemon stopped (pid ${pid:-?})"
}
trap stop_mps EXIT
nvidia-cuda-mps-control -d || { echo "MPS daemon did not start"; exit 1; }
probe mps launch 1,4,7 3
probe mps compute 1,7 3
echo "  MPS server log tail:"; tail -3 "$CUDA_MPS_LOG_DIRECTORY/control.log" | sed 's/^/    /'
