#!/usr/bin/env bash
# Records what NVIDIA's GFD and go-nvml's examples answer on a real GPU host, read-only,
# for tests/nvidia/gfd-by-hand.sh's simulated runs to be checked against. GFD --oneshot
# and both examples only read NVML: nothing is changed (no MIG mode, no instances, no
# persistence or compute mode). Meant for a host with MIG off.
#
#   tests/nvidia/gfd-readonly.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds what tests/nvidia/build-gfd.sh made (gpu-feature-discovery, nvml-devices,
# nvml-compute-processes; stripped, about 55 MB together) and, optionally,
# libnvml-trace.so (tests/nvidia/nvml-trace.sh BIN_DIR/libnvml-trace.so BIN_DIR/*): then
# every NVML call is logged with its return code, as in the simulated runs. No Go, no
# network, no cluster needed on the host. OUT_DIR gets, per run, labels.txt, stderr.txt,
# exit-code and nvml-trace.txt, and host.txt (driver, GPUs, MIG mode).
#
# To compare with the simulator: the runs of gfd-by-hand.sh on h100-80gb, all-disabled
# (gfd-none, gfd-single, gfd-mixed, nvml-devices, nvml-compute-processes), e.g.
#   diff <(sort OUT_DIR/gfd-none/labels.txt) <(sort RESULTS/h100-80gb/all-disabled/gfd-none/labels.txt)
# (gpu.count and gpu.machine are the host's: the simulated node has 2 GPUs and a machine
# type file of its own).
set -uo pipefail
bin=$(cd "${1:?usage: gfd-readonly.sh BIN_DIR OUT_DIR}" && pwd)
out=${2:?usage: gfd-readonly.sh BIN_DIR OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
trace=
[ -f "$bin/libnvml-trace.so" ] && trace=$bin/libnvml-trace.so

{
    date -u '+%Y-%m-%d %H:%M:%S UTC'
    nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current,pci.bus_id --format=csv 2>&1
    "$bin/gpu-feature-discovery" --version 2>&1
    (cd "$bin" && sha256sum gpu-feature-discovery nvml-devices nvml-compute-processes)
} > "$out/host.txt"

run() { # run NAME cmd...
    local name=$1
    shift
    mkdir -p "$out/$name"
    ${trace:+env LD_PRELOAD="$trace" NVML_TRACE="$out/$name/nvml-trace.txt"} timeout 120 "$@" \
        > "$out/$name/stdout.txt" 2> "$out/$name/stderr.txt"
    echo $? > "$out/$name/exit-code"
    echo "$name: exit $(cat "$out/$name/exit-code")"
}
for s in none single mixed; do
    run "gfd-$s" "$bin/gpu-feature-discovery" --oneshot --use-node-feature-api=false --no-timestamp \
        --mig-strategy="$s" --output-file "$out/gfd-$s/labels.txt"
done
run nvml-devices "$bin/nvml-devices"
run nvml-compute-processes "$bin/nvml-compute-processes"
