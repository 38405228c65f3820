#!/usr/bin/env bash
# By-hand acceptance of issue 40: NVIDIA's GPU Feature Discovery (GFD) and device plugin,
# unmodified, pointed at the device-plugin config and the NFD labels gpushare's agent
# writes, on a node the agent runs on the simulated driver; NFD's nfd-worker too when it
# was built.
#
#   K8S_BIN=/path/bin tests/nvidia/k8s-by-hand.sh [RESULTS_DIR]
#
#   K8S_BIN      the bin/ directory of tests/nvidia/build-k8s.sh (gpu-feature-discovery,
#                nvidia-device-plugin, kubelet-standin, nfd-worker if it built, and
#                nfd-build.txt)
#   GPUSHARE_BIN a directory with gpushare-agent, gpushare-ctl and the simulator; default
#                the repository's target/debug (copied out first)
#   NODES        default "h100-80gb:2 h100-80gb:1"
#   PROFILES     default "half-balanced all-balanced all-mps all-time-sliced all-disabled
#                all-1g mig-and-time-sliced" (the last two the script's, see script_profile)
#   RESULTS_DIR  default a fresh mktemp -d; gets log.txt, one directory per node/profile
#                (see below), compare.txt (tests/nvidia/compare-k8s.py: every field) and
#                summary.txt (the tools' versions, each run's verdict, nfd-worker's)
#
# Per node: a private dbus-daemon and `gpushare-agent --simulate NODE` with an agent.toml
# that enables [device_plugin] and [labels], their files in the node's scratch state
# directory; then per profile `gpushare-ctl apply PROFILE` and, into NODE/PROFILE/:
#   apply.txt, apply-exit-code     what ctl said
#   device-plugin.yaml, labels.txt the agent's two files as they are after the apply;
#                                  before-*.{yaml,txt} and unchanged.txt when it was refused
#   export-device-plugin.yaml, export-labels.txt   `gpushare-ctl export --format ...`
#   status.json, mig-profiles.json
#   gfd/            `gpu-feature-discovery --oneshot --use-node-feature-api=false
#                   --no-timestamp --config-file device-plugin.yaml` (the MIG strategy
#                   from the file's flags): labels.txt, stderr.txt, exit-code, and what
#                   tests/nvidia/compare-gfd.py reads (strategy, status.json, ...)
#   plugin/         `nvidia-device-plugin --config-file device-plugin.yaml` against
#                   kubelet-standin: standin.json (what it registered, listed, allocated),
#                   plugin.log, exit codes; under MPS mps-pipe.txt (the Allocate mount's
#                   host path, resolved, beside status' pipe directory)
#   NODE/sighup/    after the profiles (SIGHUP=0: not): the plugin on all-disabled's
#                   config, then all-time-sliced applied and SIGHUP sent (README's
#                   post_apply hook): standin.json lists what it registered after
#   mps-daemonset/  under MPS (MPS_DAEMONSET=0: not), NVIDIA's `mps-control-daemon
#                   --config-file device-plugin.yaml`, as the chart's MPS DaemonSet runs it
#                   on a node labelled nvidia.com/mps.capable=true (GFD writes it from
#                   this config), for 6 s with gpushare's MPS root at /mps, then SIGTERM:
#                   its log, gpushare's status before, while and after, then the profile
#                   applied again (not compared: what it does is the finding)
#   nfd/            `nfd-worker -oneshot -no-publish` over the labels file, if built
#
# Host facts the tools read besides NVML are faked in private mount namespaces (unshare
# -m, as root), nowhere else: /sys/bus/pci/devices (as gfd-by-hand.sh), and, around each
# device-plugin run, a tmpfs on /var/lib holding kubelet/device-plugins/ (the plugin's
# socket directory is fixed: pluginapi.DevicePluginPath), the simulated host's
# proc/driver (the driver's MIG capability files, which the plugin reads for each MIG
# device: internal/mig/mig-dp.go) bound at /proc/driver, and gpushare's MPS root bound at
# /mps (the plugin health-checks /mps/<resource>/pipe: mps.ContainerRoot, where the chart
# mounts the MPS root). /mps must exist to be a mount point: the script makes the empty
# directory if the host has none and removes it at the end. nvidia-cuda-mps-control on
# the plugin's PATH is the simulated one (the plugin's MPS health check runs it).
#
# Exit status: 0 when every step ran and compare-k8s.py found no disagreement; 1 otherwise.
set -u

die() { echo "k8s-by-hand: $*" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)

# ---------------------------------------------------------------- one device-plugin run
# (in a mount namespace of its own): PLUGIN_DIR CONFIG MPS_ROOT
if [ "${1:-}" = "--plugin" ]; then
    R=$2 CFG=$3 MPSROOT=$4
    mount -t tmpfs k8s-by-hand-kubelet /var/lib || die "cannot mount tmpfs on /var/lib"
    DP=/var/lib/kubelet/device-plugins
    mkdir -p "$DP"
    if [ -n "$MPSROOT" ]; then
        mount --bind "$MPSROOT" /mps || die "cannot bind $MPSROOT at /mps"
    fi
    # the simulated driver's /proc/driver/nvidia{,-caps} (MIG capabilities: the plugin
    # reads mig-minors and the access files of each MIG device)
    mount --bind "$STATE/simulated-gpus.json.host/proc/driver" /proc/driver || die "cannot bind the simulated /proc/driver"
    "$K8S_BIN/kubelet-standin" -dir "$DP" -wait 60s -settle 3s > "$R/standin.json" 2> "$R/standin.stderr" &
    s=$!
    for _ in $(seq 100); do [ -S "$DP/kubelet.sock" ] && break; sleep 0.1; done
    env PATH="$WORK/mpsbin:$PATH" LD_LIBRARY_PATH="$WORK/lib" GPUSHARE_SIM_NODE="$NODE" \
        GPUSHARE_SIM_STATE="$STATE/simulated-gpus.json" \
        "$K8S_BIN/nvidia-device-plugin" --config-file "$CFG" > "$R/plugin.log" 2>&1 &
    p=$!
    wait "$s"
    echo $? > "$R/standin-exit-code"
    if kill -0 "$p" 2> /dev/null; then
        echo "running (stopped by the script)" > "$R/plugin-exit"
        kill "$p"
        wait "$p" 2> /dev/null
    else
        wait "$p"
        echo "exited $? before the stand-in was done" > "$R/plugin-exit"
    fi
    ls -la "$DP" > "$R/device-plugins-dir.txt"
    exit 0
fi

# ---------------------------------------------------------------- the plugin on SIGHUP
# (in a mount namespace of its own): DIR CONFIG PROFILE. README's post_apply hook: the
# plugin started on the config as it is, registered with a stand-in that keeps accepting
# registrations for 12 s; meanwhile `gpushare-ctl apply PROFILE` rewrites the config and
# the plugin gets SIGHUP; the stand-in then lists what each registration's endpoint
# offers: a second registration, and the new profile's devices, mean that SIGHUP made the
# plugin read the config again.
if [ "${1:-}" = "--sighup" ]; then
    R=$2 CFG=$3 PROFILE=$4
    mount -t tmpfs k8s-by-hand-kubelet /var/lib || die "cannot mount tmpfs on /var/lib"
    DP=/var/lib/kubelet/device-plugins
    mkdir -p "$DP"
    mount --bind "$STATE/simulated-gpus.json.host/proc/driver" /proc/driver || die "cannot bind the simulated /proc/driver"
    cp "$CFG" "$R/config-before.yaml"
    "$K8S_BIN/kubelet-standin" -dir "$DP" -wait 60s -settle 12s > "$R/standin.json" 2> "$R/standin.stderr" &
    s=$!
    for _ in $(seq 100); do [ -S "$DP/kubelet.sock" ] && break; sleep 0.1; done
    env LD_LIBRARY_PATH="$WORK/lib" GPUSHARE_SIM_NODE="$NODE" GPUSHARE_SIM_STATE="$STATE/simulated-gpus.json" \
        "$K8S_BIN/nvidia-device-plugin" --config-file "$CFG" > "$R/plugin.log" 2>&1 &
    p=$!
    for _ in $(seq 100); do [ -S "$DP/nvidia-gpu.sock" ] && break; sleep 0.1; done
    sleep 1
    "$WORK/gpushare/gpushare-ctl" apply "$PROFILE" > "$R/apply.txt" 2>&1
    cp "$CFG" "$R/config-after.yaml"
    kill -HUP "$p"
    echo "SIGHUP sent after: gpushare-ctl apply $PROFILE (exit $?)" >> "$R/apply.txt"
    wait "$s"
    echo $? > "$R/standin-exit-code"
    kill "$p" 2> /dev/null
    wait "$p" 2> /dev/null
    exit 0
fi

# ---------------------------------------------------------------- NVIDIA's MPS daemon
# (in a mount namespace of its own): DIR CONFIG MPS_ROOT PROFILE. What the chart's
# mps-control-daemon DaemonSet would run on a node GFD labels nvidia.com/mps.capable=true,
# with the chart's mps.root (the plugin's too) = gpushare's MPS root at /mps: started
# with gpushare's config, left 6 s (its first start and its 30 s retry timer), then
# stopped as a pod is (SIGTERM); gpushare's status before, while and after it ran.
if [ "${1:-}" = "--mps-daemon" ]; then
    R=$2 CFG=$3 MPSROOT=$4 PROFILE=$5
    mount --bind "$MPSROOT" /mps || die "cannot bind $MPSROOT at /mps"
    mount --bind "$STATE/simulated-gpus.json.host/proc/driver" /proc/driver || die "cannot bind the simulated /proc/driver"
    "$WORK/gpushare/gpushare-ctl" status > "$R/status-before.txt" 2>&1
    env PATH="$WORK/mpsbin:$PATH" LD_LIBRARY_PATH="$WORK/lib" GPUSHARE_SIM_NODE="$NODE" \
        GPUSHARE_SIM_STATE="$STATE/simulated-gpus.json" \
        "$K8S_BIN/mps-control-daemon" --config-file "$CFG" > "$R/mps-control-daemon.log" 2>&1 &
    d=$!
    sleep 6
    "$WORK/gpushare/gpushare-ctl" status > "$R/status-while.txt" 2>&1
    kill "$d" 2> /dev/null
    wait "$d"
    echo "mps-control-daemon: exit $? after SIGTERM" >> "$R/mps-control-daemon.log"
    sleep 1
    "$WORK/gpushare/gpushare-ctl" status > "$R/status-after.txt" 2>&1
    "$WORK/gpushare/gpushare-ctl" plan "$PROFILE" > "$R/plan-after.txt" 2>&1
    # what gpushare's control daemon was asked, and by whom (its log, as the real one's)
    for f in "$MPSROOT"/GPU-*/log/control.log; do [ -f "$f" ] && cp "$f" "$R/gpushare-control.log"; done
    exit 0
fi

# ---------------------------------------------------------------- inner (in the namespace)
if [ "${1:-}" = "--inner" ]; then
    : "${RES:?}" "${WORK:?}" "${NODES:?}" "${PROFILES:?}"
    FAILED=0
    G=$WORK/gpushare
    mount -t tmpfs k8s-by-hand-fake-pci /sys/bus/pci || die "cannot mount tmpfs on /sys/bus/pci"
    printf 'gpushare-simulated-node\n' > "$RES/product_name"
    nvml_env() {
        env LD_LIBRARY_PATH="$WORK/lib" GPUSHARE_SIM_NODE="$NODE" GPUSHARE_SIM_STATE="$STATE/simulated-gpus.json" "$@"
    }
    # The script's own profiles (on GPUs of 7 compute slices; written into the run's
    # directory as profile.toml and applied with -f):
    #   all-1g               every GPU in seven 1g instances: one MIG device kind, the
    #                        layout migStrategy single is for
    #   mig-and-time-sliced  the first half of the GPUs in NVIDIA's balanced layout, the
    #                        second half whole and time-sliced for 4: mixed with shared
    #                        whole GPUs
    script_profile() { # script_profile NAME: the profile's TOML on stdout
        local head="name = \"$1\"\ndescription = \"tests/nvidia/k8s-by-hand.sh: $1\"\n"
        case "$1" in
            all-1g) printf "$head"'\n[[gpu]]\nselect = "all"\nmig = { "1g" = 7 }\n' ;;
            mig-and-time-sliced) printf "$head"'\n[[gpu]]\nselect = "first-half"\nmig = "balanced"\n\n[[gpu]]\nselect = "second-half"\nmig = "disabled"\nsharing.time-slicing = { interval = "medium", replicas = 4 }\n' ;;
            *) return 1 ;;
        esac
    }
    agent='' bus=''
    stop_node() { kill $agent ${bus:+"$(tail -n1 <<<"$bus")"} 2>/dev/null || true; }
    trap stop_node EXIT
    for NODE in $NODES; do
        model=${NODE%%:*}
        tag=$model-x${NODE##*:}
        STATE=$WORK/$tag # short: an MPS pipe directory under it must fit a socket path
        rm -rf "$STATE"
        mkdir -p "$STATE" "$WORK/no-profiles"
        export NODE STATE
        TOML=$WORK/agent-$tag.toml
        DPFILE=$STATE/k8s/device-plugin.yaml
        LBFILE=$STATE/k8s/features.d/gpushare
        printf '[device_plugin]\nenabled = true\npath = "%s"\nmps_host_shm = true\n\n[labels]\nenabled = true\npath = "%s"\n' "$DPFILE" "$LBFILE" > "$TOML"
        mkdir -p "$RES/$tag"
        cp "$TOML" "$RES/$tag/agent.toml"
        echo
        echo "================ node $NODE (agent.toml: $(tr '\n' ' ' < "$TOML"))"
        bus=$(dbus-daemon --session --fork --print-address=1 --print-pid=1) || { echo "!! no dbus-daemon"; FAILED=1; continue; }
        export GPUSHARE_BUS_ADDRESS
        GPUSHARE_BUS_ADDRESS=$(head -n1 <<<"$bus")
        GPUSHARE_SIM_DIR=$G GPUSHARE_LOG=warn "$G/gpushare-agent" --simulate "$NODE" --bus "$GPUSHARE_BUS_ADDRESS" \
            --state-dir "$STATE" --config "$TOML" --profiles-dir "$WORK/no-profiles" 2> "$RES/$tag/agent-stderr.txt" &
        agent=$!
        if ! "$G/gpushare-ctl" status > /dev/null 2>&1; then
            echo "!! the agent did not start:"; sed 's/^/   /' "$RES/$tag/agent-stderr.txt"; FAILED=1
            kill "$agent" "$(tail -n1 <<<"$bus")" 2>/dev/null; agent='' bus=''
            continue
        fi
        MPSROOT=$STATE/mps

        # fake /sys/bus/pci/devices from what the simulated library says
        rm -rf /sys/bus/pci/devices /sys/bus/pci/drivers
        mkdir -p /sys/bus/pci/devices /sys/bus/pci/drivers/nvidia
        nvml_env python3 "$HERE/sim_pci.py" "$WORK/lib/libnvidia-ml.so.1" > "$WORK/pci-$tag.txt" ||
            { echo "!! cannot list the simulated GPUs"; FAILED=1; }
        while read -r idx busid devid subid; do
            addr=$(echo "${busid#????}" | tr 'A-F' 'a-f')
            d=/sys/bus/pci/devices/$addr
            mkdir -p "$d"
            printf '0x%04x\n' $((devid & 0xffff)) > "$d/vendor"
            printf '0x%04x\n' $((devid >> 16)) > "$d/device"
            if [ $((subid)) != 0 ]; then
                printf '0x%04x\n' $((subid & 0xffff)) > "$d/subsystem_vendor"
                printf '0x%04x\n' $((subid >> 16)) > "$d/subsystem_device"
            fi
            echo 0x030200 > "$d/class"
            echo -1 > "$d/numa_node"
            printf '0x%016x 0x%016x 0x%016x\n' $((0xa0000000 + idx * 0x1000000)) $((0xa0ffffff + idx * 0x1000000)) 0x40200 > "$d/resource"
            python3 -c 'import struct, sys; sys.stdout.buffer.write(struct.pack("<HH", int(sys.argv[1]) & 0xffff, int(sys.argv[1]) >> 16) + bytes(252))' "$devid" > "$d/config"
            ln -s ../../drivers/nvidia "$d/driver"
        done < "$WORK/pci-$tag.txt"

        for PROFILE in $PROFILES; do
            R=$RES/$tag/$PROFILE
            rm -rf "$R"
            mkdir -p "$R"
            echo
            echo "---- $NODE: gpushare-ctl apply $PROFILE"
            cp "$DPFILE" "$R/before-device-plugin.yaml" 2>/dev/null || : > "$R/before-device-plugin.yaml"
            cp "$LBFILE" "$R/before-labels.txt" 2>/dev/null || : > "$R/before-labels.txt"
            "$G/gpushare-ctl" status --json > "$R/before-status.json" 2>/dev/null
            set -- "$PROFILE"
            if script_profile "$PROFILE" > "$R/profile.toml"; then set -- -f "$R/profile.toml"; else rm -f "$R/profile.toml"; fi
            "$G/gpushare-ctl" apply "$@" > "$R/apply.txt" 2>&1
            rc=$?
            echo "$rc" > "$R/apply-exit-code"
            tail -n 2 "$R/apply.txt" | sed 's/^/   /'
            echo "-> exit $rc"
            cp "$DPFILE" "$R/device-plugin.yaml" 2>/dev/null || echo "!! no $DPFILE"
            cp "$LBFILE" "$R/labels.txt" 2>/dev/null || echo "!! no $LBFILE"
            "$G/gpushare-ctl" status --json > "$R/status.json"
            "$G/gpushare-ctl" mig profiles --json > "$R/mig-profiles.json" 2>/dev/null
            "$G/gpushare-ctl" export --format device-plugin > "$R/export-device-plugin.yaml" 2> "$R/export-device-plugin.stderr"
            echo $? > "$R/export-device-plugin-exit-code"
            "$G/gpushare-ctl" export --format labels > "$R/export-labels.txt" 2> "$R/export-labels.stderr"
            echo $? > "$R/export-labels-exit-code"
            if [ "$rc" != 0 ]; then
                # refused: both files and the GPUs as they were
                {
                    cmp -s "$R/before-device-plugin.yaml" "$R/device-plugin.yaml" && echo "device-plugin.yaml: unchanged" || echo "device-plugin.yaml: CHANGED"
                    cmp -s "$R/before-labels.txt" "$R/labels.txt" && echo "labels: unchanged" || echo "labels: CHANGED"
                    python3 -c 'import json, sys
def gpus(f):
    return [(g["uuid"], g.get("mig_enabled"), g.get("compute_mode"), g.get("sharing", {}).get("strategy"),
             [i["uuid"] for i in g.get("instances", [])]) for g in json.load(open(f))["gpus"]]
print("GPUs (MIG, instances, compute mode, sharing in status): " + ("unchanged" if gpus(sys.argv[1]) == gpus(sys.argv[2]) else "CHANGED"))' "$R/before-status.json" "$R/status.json"
                } > "$R/unchanged.txt"
                sed 's/^/   /' "$R/unchanged.txt"
                rm -f "$R/before-status.json"
                continue
            fi
            rm -f "$R/before-device-plugin.yaml" "$R/before-labels.txt" "$R/before-status.json"

            # a. GFD with gpushare's config
            GR=$R/gfd
            mkdir -p "$GR"
            # what compare-gfd.py reads, as links to the run's own files
            ln -s ../status.json "$GR/status.json"
            ln -s ../mig-profiles.json "$GR/mig-profiles.json"
            ln -s ../device-plugin.yaml "$GR/plugin-config.yaml"
            sed -n 's/^ *migStrategy: *\([a-z]*\).*/\1/p' "$R/device-plugin.yaml" | head -1 > "$GR/strategy"
            [ -s "$GR/strategy" ] || echo none > "$GR/strategy"
            echo "\$ gpu-feature-discovery --oneshot --use-node-feature-api=false --no-timestamp --config-file device-plugin.yaml   # migStrategy $(cat "$GR/strategy")"
            nvml_env timeout 120 "$K8S_BIN/gpu-feature-discovery" --oneshot --use-node-feature-api=false --no-timestamp \
                --machine-type-file "$RES/product_name" --config-file "$R/device-plugin.yaml" \
                --output-file "$GR/labels.txt" > "$GR/stderr.txt" 2>&1
            rc=$?
            echo "$rc" > "$GR/exit-code"
            grep -E '^[EF][0-9]{4} ' "$GR/stderr.txt" | sed 's/^/   /'
            [ -f "$GR/labels.txt" ] && echo "   $(wc -l < "$GR/labels.txt") labels"
            echo "-> exit $rc"
            [ "$rc" = 0 ] || FAILED=1

            # b. the device plugin against the kubelet stand-in
            PR=$R/plugin
            mkdir -p "$PR"
            mps=
            grep -q '^ *mps:' "$R/device-plugin.yaml" && mps=$MPSROOT
            echo "\$ nvidia-device-plugin --config-file device-plugin.yaml   # against kubelet-standin${mps:+; $MPSROOT at /mps}"
            timeout 150 unshare -m --propagation private bash "$HERE/k8s-by-hand.sh" --plugin "$PR" "$R/device-plugin.yaml" "$mps"
            rc=$?
            [ "$rc" = 0 ] || { echo "!! the plugin run failed (exit $rc)"; FAILED=1; }
            if [ -n "$mps" ]; then
                # the Allocate mount's host path, resolved while the agent's link is there
                python3 - "$PR/standin.json" > "$PR/mps-pipe.txt" <<'PY'
import json, os, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no stand-in JSON: %s" % e); sys.exit(0)
for r in d.get("resources", []):
    for m in (r.get("allocate") or {}).get("mounts", []):
        print("%s %s -> %s" % (m["container_path"], m["host_path"], os.path.realpath(m["host_path"])))
PY
                echo "   mounts: $(tr '\n' ';' < "$PR/mps-pipe.txt")"
            fi
            python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for r in d["resources"]:
    a = r.get("allocate") or {}
    print("   %s: %d devices, %d healthy; Allocate(%s) -> %s%s" % (r["registration"]["resource_name"], r["count"], r["healthy"],
          ",".join(a.get("device_ids", [])), " ".join("%s=%s" % kv for kv in sorted(a.get("envs", {}).items())), a.get("error", "")))' "$PR/standin.json" 2>/dev/null ||
                { echo "!! no stand-in output:"; tail -n 3 "$PR/standin.stderr" "$PR/plugin.log" | sed 's/^/   /'; FAILED=1; }
            echo "-> stand-in exit $(cat "$PR/standin-exit-code" 2>/dev/null), plugin $(cat "$PR/plugin-exit" 2>/dev/null)"

            # d. under MPS, NVIDIA's MPS daemon as its DaemonSet would run beside gpushare's
            # (MPS_DAEMONSET=0: not); then the profile applied again, whatever it did
            if [ -n "$mps" ] && [ "${MPS_DAEMONSET:-1}" != 0 ] && [ -x "$K8S_BIN/mps-control-daemon" ]; then
                DR=$R/mps-daemonset
                mkdir -p "$DR"
                echo "\$ mps-control-daemon --config-file device-plugin.yaml   # the chart's MPS DaemonSet, $MPSROOT at /mps, 6 s, then SIGTERM"
                timeout 60 unshare -m --propagation private bash "$HERE/k8s-by-hand.sh" --mps-daemon "$DR" "$R/device-plugin.yaml" "$MPSROOT" "$PROFILE"
                grep -E '^[EWF][0-9]{4} |^panic:|exit .* after SIGTERM|Stopped MPS control daemon' "$DR/mps-control-daemon.log" | sed 's/^/   /'
                grep -E '^Drift' "$DR/status-after.txt" | sed 's/^/   gpushare after: /'
                "$G/gpushare-ctl" apply "$@" > "$DR/apply-again.txt" 2>&1
                echo "   gpushare-ctl apply $PROFILE again: exit $? ($(tail -n1 "$DR/apply-again.txt"))"
            fi

            # c. nfd-worker over the labels file (not run so far: it did not build offline
            # here, see build-k8s.sh; its features.d path is fixed, and /etc/kubernetes
            # must exist to be a mount point)
            if [ -x "$K8S_BIN/nfd-worker" ]; then
                NR=$R/nfd
                mkdir -p "$NR"
                echo "\$ nfd-worker -oneshot -no-publish -feature-sources=local -label-sources=local"
                timeout 120 unshare -m --propagation private bash -c '
                    mount -t tmpfs k8s-by-hand-nfd /etc/kubernetes 2>/dev/null || exit 3
                    mkdir -p /etc/kubernetes/node-feature-discovery/features.d
                    cp "$1" /etc/kubernetes/node-feature-discovery/features.d/gpushare
                    NODE_NAME=k8s-by-hand "$2" -oneshot -no-publish -feature-sources=local -label-sources=local -config /dev/null' \
                    _ "$R/labels.txt" "$K8S_BIN/nfd-worker" > "$NR/output.txt" 2>&1
                echo $? > "$NR/exit-code"
                echo "-> exit $(cat "$NR/exit-code")"
            fi
        done
        echo
        echo "---- $NODE: gpushare-ctl apply all-disabled, stop the agent"
        "$G/gpushare-ctl" apply all-disabled > /dev/null 2>&1 || { echo "!! all-disabled failed"; FAILED=1; }
        # e. SIGHUP (SIGHUP=0: not): the plugin on all-disabled's config, then
        # all-time-sliced applied and the plugin sent SIGHUP, as README's post_apply hook does
        if [ "${SIGHUP:-1}" != 0 ]; then
            HR=$RES/$tag/sighup
            rm -rf "$HR"
            mkdir -p "$HR"
            echo "\$ nvidia-device-plugin on all-disabled's config; apply all-time-sliced; SIGHUP"
            timeout 150 unshare -m --propagation private bash "$HERE/k8s-by-hand.sh" --sighup "$HR" "$DPFILE" all-time-sliced
            python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
regs = d["resources"]
print("   %d registrations; devices listed after SIGHUP: %s" % (len(regs), ", ".join("%s %d" % (r["registration"]["resource_name"], r["count"]) for r in regs)))' "$HR/standin.json" 2>/dev/null | tee "$HR/summary.txt" ||
                { echo "!! no stand-in output"; FAILED=1; }
            "$G/gpushare-ctl" apply all-disabled > /dev/null 2>&1 || { echo "!! all-disabled failed"; FAILED=1; }
        fi
        kill "$agent"
        wait "$agent" 2>/dev/null
        kill "$(tail -n1 <<<"$bus")"
        agent='' bus=''
    done
    exit $FAILED
fi

# ---------------------------------------------------------------- outer
[ "$(id -u)" = 0 ] || die "run as root (private mount namespaces fake /sys/bus/pci, /var/lib and /mps)"
K8S_BIN=${K8S_BIN:-}
for b in gpu-feature-discovery nvidia-device-plugin kubelet-standin; do
    [ -x "$K8S_BIN/$b" ] || die "set K8S_BIN to the bin/ directory of tests/nvidia/build-k8s.sh (no $b)"
done
REPO=$(cd "$HERE/../.." && pwd)
GPUSHARE_BIN=${GPUSHARE_BIN:-$REPO/target/debug}
for f in gpushare-agent gpushare-ctl libgpushare_sim_nvml.so gpushare-sim-nvidia-smi gpushare-sim-nvidia-cuda-mps-control; do
    [ -f "$GPUSHARE_BIN/$f" ] || die "GPUSHARE_BIN ($GPUSHARE_BIN) has no $f: cargo build --workspace first"
done
for t in dbus-daemon unshare python3 timeout; do command -v "$t" > /dev/null || die "$t is needed"; done

RES=${1:-$(mktemp -d /tmp/k8s-by-hand.XXXXXX)}
mkdir -p "$RES"
RES=$(realpath "$RES")
WORK=$(mktemp -d /tmp/k8s-w.XXXXXX)
mkdir -p "$WORK/gpushare" "$WORK/lib" "$WORK/mpsbin"
for f in gpushare-agent gpushare-ctl libgpushare_sim_nvml.so gpushare-sim-nvidia-smi gpushare-sim-nvidia-cuda-mps-control; do
    cp "$GPUSHARE_BIN/$f" "$WORK/gpushare/"
done
cp "$WORK/gpushare/libgpushare_sim_nvml.so" "$WORK/lib/libnvidia-ml.so.1"
cp "$WORK/gpushare/gpushare-sim-nvidia-cuda-mps-control" "$WORK/mpsbin/nvidia-cuda-mps-control"
cp "$WORK/gpushare/gpushare-sim-nvidia-smi" "$WORK/mpsbin/nvidia-smi" # for NVIDIA's MPS daemon
MADE_MPS=
if ! [ -e /mps ]; then mkdir /mps && MADE_MPS=1; fi
export RES WORK K8S_BIN HERE
export NODES=${NODES:-"h100-80gb:2 h100-80gb:1"}
export PROFILES=${PROFILES:-"half-balanced all-balanced all-mps all-time-sliced all-disabled all-1g mig-and-time-sliced"}
{
    echo "k8s-by-hand: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "plugin:     $("$K8S_BIN/nvidia-device-plugin" --version 2>&1 | tr '\n' ' ')"
    echo "gfd:        $("$K8S_BIN/gpu-feature-discovery" --version 2>&1 | tr '\n' ' ')"
    (cd "$K8S_BIN" && sha256sum $(ls gpu-feature-discovery nvidia-device-plugin mps-control-daemon kubelet-standin nfd-worker 2>/dev/null)) | sed 's/^/sha256:     /'
    if [ -x "$K8S_BIN/nfd-worker" ]; then echo "nfd-worker: built"; else
        echo "nfd-worker: not built ($K8S_BIN/nfd-build.txt):"; grep -E '^(node-feature|vendor|not built|modules missing|  [a-z].* v)' "$K8S_BIN/nfd-build.txt" 2>/dev/null | grep -v 'GOPROXY=off$' | sed 's/^/  /'
    fi
    echo "gpushare:   $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet -- . ':!tests/nvidia/results' 2>/dev/null || echo ' (uncommitted changes)'), binaries from $GPUSHARE_BIN ($(stat -c '%y' "$GPUSHARE_BIN/gpushare-agent" | cut -d. -f1))"
    echo "nodes:      $NODES"
    echo "profiles:   $PROFILES"
    unshare -m --propagation private bash "$HERE/k8s-by-hand.sh" --inner
    rc=$?
    echo
    echo "================ compare-k8s.py (GFD, the device plugin and gpushare's files against gpushare-ctl status --json)"
    python3 "$HERE/compare-k8s.py" "$RES" > "$RES/compare.txt"
    crc=$?
    grep -v '^  ok ' "$RES/compare.txt"
    echo "(every compared field, agreeing ones too: compare.txt)"
    [ "$crc" = 0 ] || rc=1
    {   # the short story: versions, each run's verdict, nfd-worker
        sed -n '1,/^profiles:/p' "$RES/log.txt"
        grep -E '^(run |summary:)' "$RES/compare.txt"
        echo "overall: $([ "$rc" = 0 ] && echo PASS || echo FAIL)"
    } > "$RES/summary.txt"
    echo
    echo "results: $RES   overall: $([ "$rc" = 0 ] && echo PASS || echo FAIL)"
    exit $rc
} 2>&1 | tee "$RES/log.txt"
rc=${PIPESTATUS[0]}
[ -z "$MADE_MPS" ] || rmdir /mps
rm -rf "$WORK"
exit "$rc"
