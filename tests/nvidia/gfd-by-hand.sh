#!/usr/bin/env bash
# By-hand acceptance: NVIDIA's GPU Feature Discovery (GFD) and go-nvml's examples,
# unmodified, on a node that gpushare's agent runs on the simulated driver.
#
#   GFD_BIN=/path/bin tests/nvidia/gfd-by-hand.sh [RESULTS_DIR]
#
#   GFD_BIN     the bin/ directory tests/nvidia/build-gfd.sh made (gpu-feature-discovery,
#               nvml-devices, nvml-compute-processes)
#   GPUSHARE_BIN  a directory with gpushare-agent, gpushare-ctl and the simulator
#               (libgpushare_sim_nvml.so, gpushare-sim-nvidia-smi,
#               gpushare-sim-nvidia-cuda-mps-control); default the repository's
#               target/debug. Everything is copied out first (cargo rewrites in place).
#   NODES       default every simulated model: h100-80gb:2, a100-40gb:8 (a DGX A100), and
#               each other model of `gpushare-agent --simulate` ×2 (gh200-144gb ×1); a
#               node without MIG gets the profiles without MIG only
#   PROFILES    default "all-disabled all-balanced half-balanced all-mps all-time-sliced"
#               (built in) and the script's all-1g (every 1g instance the GPU holds: one
#               MIG device type, what --mig-strategy=single labels) and compute-split (a 3g
#               instance in three 1c compute instances, a 2g, two 1g; on 4- and 2-slice
#               GPUs a 2g in two 1c), written per node and applied with -f; NAME.toml: a
#               profile file of yours
#   STRATEGIES  default "none single mixed" (GFD's --mig-strategy)
#   TRACE=0     do not LD_PRELOAD tests/nvidia/nvml-trace.sh's library (default: every
#               NVML call of GFD and the examples is logged with its return code)
#   RESULTS_DIR default a fresh mktemp -d; gets log.txt (everything), one directory per
#               node/profile/run (GFD's labels, its stderr, exit code, NVML trace;
#               gpushare-ctl status --json and mig profiles --json of that moment), and
#               compare.txt (tests/nvidia/compare-gfd.py over all runs), nvml-calls.txt
#               (every NVML function called, per return code) and all-labels.txt (every
#               run's labels, one file)
#
# Per node: a private dbus-daemon and `gpushare-agent --simulate NODE` (a state directory
# in the results' scratch dir, no profiles dir, no config), as README's "Trying it by
# hand"; then per profile: `gpushare-ctl apply PROFILE`, status/mig profiles as JSON,
# `gpu-feature-discovery --oneshot --use-node-feature-api=false --no-timestamp
# --mig-strategy=S --output-file ...` for each strategy, then nvml-devices and
# nvml-compute-processes. GFD reads the same simulated node as the agent: the simulated
# library as libnvidia-ml.so.1 (LD_LIBRARY_PATH) with GPUSHARE_SIM_NODE/GPUSHARE_SIM_STATE.
# Last, all-disabled, the agent restarted with one compute process on GPU 0
# (GPUSHARE_SIM_PROCESSES, a `sleep` of the script's) and both examples run again
# (RESULTS_DIR/<model>/processes/).
#
# Sharing: for all-mps and all-time-sliced, GFD gets a device-plugin config file
# (--config-file) whose `sharing:` says what the profile does (mps, or timeSlicing, with
# the profile's 4 replicas of nvidia.com/gpu), as an operator who shares GPUs with gpushare
# would configure the device plugin; for the other profiles no config file.
#
# A host fact GFD reads besides NVML is faked, in a private mount namespace (unshare -m,
# as root), nowhere else: /sys/bus/pci/devices, one directory per simulated GPU from what
# the simulated library answers (vendor, device, class 0x030200 = 3D controller): GFD's
# nvidia.com/gpu.mode label reads the class there, its vGPU labeler the config space (the
# ids, no capabilities). The machine type file is RESULTS_DIR/product_name
# ("gpushare-simulated-node"), as --machine-type-file allows.
#
# Exit status: 0 when every GFD run and every example exited 0 and compare-gfd.py found
# no disagreement; 1 otherwise (it does not stop at the first failure).
set -u

die() { echo "gfd-by-hand: $*" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)

# ---------------------------------------------------------------- inner (in the namespace)
if [ "${1:-}" = "--inner" ]; then
    : "${RES:?}" "${WORK:?}" "${NODES:?}" "${PROFILES:?}" "${STRATEGIES:?}"
    FAILED=0
    G=$WORK/gpushare
    mount -t tmpfs gfd-by-hand-fake-pci /sys/bus/pci || die "cannot mount tmpfs on /sys/bus/pci"
    printf 'gpushare-simulated-node\n' > "$RES/product_name"
    # one client of NVML: GFD, an example, the PCI lister; traced unless TRACE=0
    nvml_env() { # nvml_env TRACE_FILE cmd...
        local t=$1
        shift
        env LD_LIBRARY_PATH="$WORK/lib" GPUSHARE_SIM_NODE="$NODE" GPUSHARE_SIM_STATE="$STATE/simulated-gpus.json" \
            ${TRACE_LIB:+LD_PRELOAD="$TRACE_LIB" NVML_TRACE="$t"} "$@"
    }
    # go-nvml's two examples, each into DIR/nvml-<example>; LABEL says what the node holds
    run_examples() { # run_examples DIR LABEL
        local ex R rc
        for ex in devices compute-processes; do
            R=$1/nvml-$ex
            mkdir -p "$R"
            echo
            echo "\$ nvml-$ex   # go-nvml examples/$ex; $2"
            nvml_env "$R/nvml-trace.txt" timeout 120 "$GFD_BIN/nvml-$ex" > "$R/output.txt" 2>&1
            rc=$?
            echo "$rc" > "$R/exit-code"
            sed 's/^/   /' "$R/output.txt"
            echo "-> exit $rc"
            [ "$rc" = 0 ] || FAILED=1
        done
    }
    # The script's own profiles, by the GPUs' compute slices (7, 4 or 2):
    #   all-1g         every 1g instance the GPU holds: one MIG device type, the layout
    #                  GFD's --mig-strategy=single labels (nvidia.com/gpu.* become the 1g's)
    #   compute-split  a GPU instance in 1c compute instances beside whole ones (GFD names
    #                  them <c>c.<profile>, as go-nvlib does)
    script_profile() { # script_profile NAME SLICES: the profile's TOML on stdout
        local mig
        case "$1:$2" in
            all-1g:*) mig="{ \"1g\" = $2 }" ;;
            compute-split:7) mig='{ "1c.3g" = 3, "2g" = 1, "1g" = 2 }' ;;
            compute-split:4) mig='{ "1c.2g" = 2, "1g" = 2 }' ;;
            compute-split:2) mig='{ "1c.2g" = 2 }' ;;
            *) return 1 ;;
        esac
        printf 'name = "%s"\ndescription = "tests/nvidia/gfd-by-hand.sh: %s on %s-slice GPUs"\n\n[[gpu]]\nselect = "all"\nmig = %s\n' "$1" "$1" "$2" "$mig"
    }
    sharing_config() { # sharing_config PROFILE FILE: a device-plugin config, or nothing
        case "$1" in
            all-mps) printf 'version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n' > "$2" ;;
            all-time-sliced) printf 'version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n' > "$2" ;;
            *) return 1 ;;
        esac
    }
    # Interrupted, the node's agent, its bus and the declared process go too (the mount
    # namespace keeps no process of its own).
    agent='' proc='' bus=''
    stop_node() { kill $agent $proc ${bus:+"$(tail -n1 <<<"$bus")"} 2>/dev/null || true; }
    trap stop_node EXIT
    for NODE in $NODES; do
        model=${NODE%%:*}
        STATE=$WORK/$model # short: an MPS pipe directory under it must fit a socket path
        rm -rf "$STATE"
        mkdir -p "$STATE" "$WORK/no-profiles"
        echo
        echo "================ node $NODE"
        bus=$(dbus-daemon --session --fork --print-address=1 --print-pid=1) || { echo "!! no dbus-daemon"; FAILED=1; continue; }
        export GPUSHARE_BUS_ADDRESS
        GPUSHARE_BUS_ADDRESS=$(head -n1 <<<"$bus")
        GPUSHARE_SIM_DIR=$G GPUSHARE_LOG=warn "$G/gpushare-agent" --simulate "$NODE" --bus "$GPUSHARE_BUS_ADDRESS" \
            --state-dir "$STATE" --config /dev/null --profiles-dir "$WORK/no-profiles" &
        agent=$!
        # the agent's first answer (plan waits for the start) makes the node's state file
        "$G/gpushare-ctl" plan all-disabled > /dev/null 2>&1 || true

        # fake /sys/bus/pci/devices from what the simulated library says
        rm -rf /sys/bus/pci/devices /sys/bus/pci/drivers
        mkdir -p /sys/bus/pci/devices /sys/bus/pci/drivers/nvidia
        nvml_env /dev/null python3 "$HERE/sim_pci.py" "$WORK/lib/libnvidia-ml.so.1" > "$WORK/pci-$model.txt" ||
            { echo "!! cannot list the simulated GPUs"; FAILED=1; }
        while read -r idx busid devid subid; do
            addr=$(echo "${busid#????}" | tr 'A-F' 'a-f') # NVML 00000000:1B:00.0 -> sysfs 0000:1b:00.0
            d=/sys/bus/pci/devices/$addr
            mkdir -p "$d"
            printf '0x%04x\n' $((devid & 0xffff)) > "$d/vendor"
            printf '0x%04x\n' $((devid >> 16)) > "$d/device"
            if [ $((subid)) != 0 ]; then # else left out, as some hosts do (nvpci warns)
                printf '0x%04x\n' $((subid & 0xffff)) > "$d/subsystem_vendor"
                printf '0x%04x\n' $((subid >> 16)) > "$d/subsystem_device"
            fi
            echo 0x030200 > "$d/class"
            echo -1 > "$d/numa_node"
            printf '0x%016x 0x%016x 0x%016x\n' $((0xa0000000 + idx * 0x1000000)) $((0xa0ffffff + idx * 0x1000000)) 0x40200 > "$d/resource"
            # config space: the ids, no capability list (a GPU without vGPU's capability)
            python3 -c 'import struct, sys; sys.stdout.buffer.write(struct.pack("<HH", int(sys.argv[1]) & 0xffff, int(sys.argv[1]) >> 16) + bytes(252))' "$devid" > "$d/config"
            ln -s ../../drivers/nvidia "$d/driver"
            echo "   sysfs $addr: vendor $(cat "$d/vendor") device $(cat "$d/device") class 0x030200 (GPU $idx)"
        done < "$WORK/pci-$model.txt"

        # a node without MIG (L40S, RTX 4090) gets the profiles without MIG only; the
        # script's MIG profiles are sized by GPU 0's compute slices
        SLICES=$("$G/gpushare-ctl" mig profiles --json 2>/dev/null |
            python3 -c 'import json, sys; g = json.load(sys.stdin).get("gpus"); print(g[0]["compute_slices"] if g else 0)')
        HAS_MIG=$([ "${SLICES:-0}" -gt 0 ] && echo 1 || echo 0)
        for PROFILE in $PROFILES; do
            echo
            if [ "$HAS_MIG" = 0 ]; then
                case "$(basename "$PROFILE" .toml)" in
                    all-balanced | half-balanced | all-1g | compute-split)
                        echo "---- $NODE: $(basename "$PROFILE" .toml) skipped: no GPU of $model has MIG"
                        continue ;;
                esac
            fi
            case "$PROFILE" in # a built-in profile's name, one of the script's, or a file
                all-1g | compute-split)
                    PFILE=$WORK/$PROFILE.toml
                    script_profile "$PROFILE" "$SLICES" > "$PFILE" || { echo "!! no $PROFILE for $SLICES-slice GPUs"; FAILED=1; continue; } ;;
                *.toml) PFILE=$PROFILE; PROFILE=$(basename "$PROFILE" .toml) ;;
                *) PFILE= ;;
            esac
            echo "---- $NODE: gpushare-ctl apply ${PFILE:+-f }${PFILE:-$PROFILE}"
            if [ -n "$PFILE" ]; then set -- -f "$PFILE"; else set -- "$PROFILE"; fi
            "$G/gpushare-ctl" apply "$@" > "$WORK/apply.txt" 2>&1
            rc=$?
            tail -n 1 "$WORK/apply.txt"
            echo "-> exit $rc"
            [ "$rc" = 0 ] || { FAILED=1; cat "$WORK/apply.txt"; continue; }
            CFG=
            if sharing_config "$PROFILE" "$WORK/plugin-config-$PROFILE.yaml"; then
                CFG=$WORK/plugin-config-$PROFILE.yaml
                echo "   device-plugin config for GFD: $(tr '\n' ' ' < "$CFG")"
            fi
            for S in $STRATEGIES; do
                R=$RES/$model/$PROFILE/gfd-$S
                mkdir -p "$R"
                "$G/gpushare-ctl" status --json > "$R/status.json"
                "$G/gpushare-ctl" mig profiles --json > "$R/mig-profiles.json"
                echo "$S" > "$R/strategy"
                [ -z "$CFG" ] || cp "$CFG" "$R/plugin-config.yaml"
                echo
                echo "\$ gpu-feature-discovery --oneshot --use-node-feature-api=false --no-timestamp --mig-strategy=$S${CFG:+ --config-file plugin-config.yaml}   # $NODE, $PROFILE"
                nvml_env "$R/nvml-trace.txt" timeout 120 "$GFD_BIN/gpu-feature-discovery" --oneshot \
                    --use-node-feature-api=false --no-timestamp --mig-strategy="$S" \
                    --machine-type-file "$RES/product_name" --output-file "$R/labels.txt" \
                    ${CFG:+--config-file "$CFG"} > "$R/stderr.txt" 2>&1
                rc=$?
                echo "$rc" > "$R/exit-code"
                grep -E '^[EF][0-9]{4} ' "$R/stderr.txt" | sed 's/^/   /'
                [ -f "$R/labels.txt" ] && echo "   $(wc -l < "$R/labels.txt") labels"
                echo "-> exit $rc"
                [ "$rc" = 0 ] || FAILED=1
            done
            run_examples "$RES/$model/$PROFILE" "$NODE, $PROFILE"
        done
        echo
        echo "---- $NODE: gpushare-ctl apply all-disabled (give the GPUs back), stop the agent"
        "$G/gpushare-ctl" apply all-disabled > /dev/null 2>&1 || { echo "!! all-disabled failed"; FAILED=1; }
        kill "$agent"
        wait "$agent" 2>/dev/null

        # compute-processes with processes: the agent restarted with one compute process
        # (a real one of ours, 2 GiB) on GPU 0, as GPUSHARE_SIM_PROCESSES declares them;
        # the examples (without the variable) see the node's processes
        sleep 300 &
        proc=$!
        echo
        echo "---- $NODE: agent restarted with GPUSHARE_SIM_PROCESSES=0:$proc=2GiB"
        GPUSHARE_SIM_PROCESSES="0:$proc=2GiB" GPUSHARE_SIM_DIR=$G GPUSHARE_LOG=warn "$G/gpushare-agent" --simulate "$NODE" \
            --bus "$GPUSHARE_BUS_ADDRESS" --state-dir "$STATE" --config /dev/null --profiles-dir "$WORK/no-profiles" &
        agent=$!
        "$G/gpushare-ctl" status > /dev/null 2>&1 || true
        run_examples "$RES/$model/processes" "$NODE, all-disabled, a process on GPU 0"
        kill "$agent"
        wait "$agent" 2>/dev/null
        kill "$proc"
        wait "$proc" 2>/dev/null
        kill "$(tail -n1 <<<"$bus")"
        agent='' proc='' bus=''
    done
    exit $FAILED
fi

# ---------------------------------------------------------------- outer
[ "$(id -u)" = 0 ] || die "run as root (a private mount namespace fakes /sys/bus/pci; the simulated node makes device nodes)"
GFD_BIN=${GFD_BIN:-}
[ -x "$GFD_BIN/gpu-feature-discovery" ] || die "set GFD_BIN to the bin/ directory of tests/nvidia/build-gfd.sh"
[ -x "$GFD_BIN/nvml-devices" ] && [ -x "$GFD_BIN/nvml-compute-processes" ] || die "GFD_BIN lacks nvml-devices or nvml-compute-processes"
REPO=$(cd "$HERE/../.." && pwd)
GPUSHARE_BIN=${GPUSHARE_BIN:-$REPO/target/debug}
for f in gpushare-agent gpushare-ctl libgpushare_sim_nvml.so gpushare-sim-nvidia-smi gpushare-sim-nvidia-cuda-mps-control; do
    [ -f "$GPUSHARE_BIN/$f" ] || die "GPUSHARE_BIN ($GPUSHARE_BIN) has no $f: cargo build --workspace first"
done
for t in dbus-daemon unshare python3 timeout; do command -v "$t" > /dev/null || die "$t is needed"; done

RES=${1:-$(mktemp -d /tmp/gfd-by-hand.XXXXXX)}
mkdir -p "$RES"
RES=$(realpath "$RES")
WORK=$(mktemp -d /tmp/gfd-w.XXXXXX)
mkdir -p "$WORK/gpushare" "$WORK/lib"
for f in gpushare-agent gpushare-ctl libgpushare_sim_nvml.so gpushare-sim-nvidia-smi gpushare-sim-nvidia-cuda-mps-control; do
    cp "$GPUSHARE_BIN/$f" "$WORK/gpushare/"
done
cp "$WORK/gpushare/libgpushare_sim_nvml.so" "$WORK/lib/libnvidia-ml.so.1"
TRACE_LIB=
if [ "${TRACE:-1}" != 0 ]; then
    "$HERE/nvml-trace.sh" "$WORK/lib/libnvml-trace.so" "$GFD_BIN/gpu-feature-discovery" "$GFD_BIN/nvml-devices" \
        "$GFD_BIN/nvml-compute-processes" > /dev/null || die "cannot build the NVML trace library"
    TRACE_LIB=$WORK/lib/libnvml-trace.so
fi
export RES WORK GFD_BIN TRACE_LIB HERE
export NODES=${NODES:-"h100-80gb:2 a100-40gb:8 a100-80gb:2 a30-24gb:2 b200:2 b300:2 gb200:2 gh200-144gb:1 h100-96gb:2 h100-nvl:2 h200-141gb:2 l40s:2 rtx-4090:2 rtx-pro-6000-bse:2 gb200-early:2 rtx-pro-5000:2"}
export PROFILES=${PROFILES:-"all-disabled all-balanced half-balanced all-mps all-time-sliced all-1g compute-split"}
export STRATEGIES=${STRATEGIES:-"none single mixed"}
{
    echo "gfd-by-hand: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "gfd:        $("$GFD_BIN/gpu-feature-discovery" --version 2>&1 | tr '\n' ' ')"
    (cd "$GFD_BIN" && sha256sum gpu-feature-discovery nvml-devices nvml-compute-processes) | sed 's/^/sha256:     /'
    echo "gpushare:   $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet 2>/dev/null || echo ' (uncommitted changes)'), binaries from $GPUSHARE_BIN ($(stat -c '%y' "$GPUSHARE_BIN/libgpushare_sim_nvml.so" | cut -d. -f1))"
    echo "simulator:  $(nm -D --defined-only "$WORK/lib/libnvidia-ml.so.1" | grep -c ' nvml') nvml* functions exported"
    echo "nodes:      $NODES"
    echo "profiles:   $PROFILES"
    echo "strategies: $STRATEGIES"
    echo "trace:      ${TRACE_LIB:-off}"
    unshare -m --propagation private bash "$HERE/gfd-by-hand.sh" --inner
    rc=$?
    echo
    echo "================ compare-gfd.py (GFD's labels against gpushare-ctl's JSON)"
    python3 "$HERE/compare-gfd.py" "$RES" > "$RES/compare.txt"
    crc=$?
    grep -v '^  ok ' "$RES/compare.txt"
    echo "(every compared field, agreeing ones too: compare.txt)"
    [ "$crc" = 0 ] || rc=1
    if [ -n "$TRACE_LIB" ]; then
        echo
        echo "================ NVML calls that did not answer SUCCESS (function, return code: runs)"
        python3 "$HERE/gfd_trace_summary.py" "$RES"
        python3 "$HERE/gfd_trace_summary.py" "$RES" --all > "$RES/nvml-calls.txt"
        echo "(every function called, with each return code: nvml-calls.txt)"
    fi
    # every run's labels in one file, each line prefixed with its run (for keeping)
    for f in "$RES"/*/*/gfd-*/labels.txt; do
        [ -f "$f" ] && sort "$f" | sed "s|^|${f#"$RES"/}: |; s|/labels.txt: |: |"
    done > "$RES/all-labels.txt"
    echo
    echo "results: $RES   overall: $([ "$rc" = 0 ] && echo PASS || echo FAIL)"
    exit $rc
} 2>&1 | tee "$RES/log.txt"
rc=${PIPESTATUS[0]}
rm -rf "$WORK" # the simulated nodes (with their device nodes) and the copies
exit "$rc"
