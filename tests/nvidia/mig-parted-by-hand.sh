#!/usr/bin/env bash
# By-hand acceptance: NVIDIA's own mig-parted (unmodified) against the simulated
# NVML library and the simulated nvidia-smi.
#
#   MIG_PARTED=/path/nvidia-mig-parted SIM_DIR=/path/dir \
#     tests/nvidia/mig-parted-by-hand.sh [/path/mig-parted/examples/config.yaml]
#
#   MIG_PARTED  the binary built by tests/nvidia/build-mig-parted.sh
#   SIM_DIR     a directory holding libgpushare_sim_nvml.so and gpushare-sim-nvidia-smi
#               (copy them out of target/debug first: cargo rewrites them in place)
#   CONFIG      mig-parted's examples/config.yaml (first argument, or env)
#   DEFAULT_CONFIG  mig-parted's deployments/systemd/config-default.yaml (found beside
#               CONFIG in a mig-parted tree); its all-balanced is applied on each model
#   A100_CONFIGS, H100_CONFIGS  override the configs applied (NAME or FILE:NAME)
#   NODES       default "a100-40gb:8 h100-80gb:2"
#   PROBE=1     also LD_PRELOAD a generated stub that defines every nvml* function the
#               binary references and the simulated library lacks; each stub logs its
#               name and returns NVML_ERROR_FUNCTION_NOT_FOUND (13). Without it a run
#               stops at the first missing function ("symbol lookup error", exit 127),
#               with it one run lists every missing function on that path.
#   PROBE=2     as 1, but four absent functions that stop mig-parted early
#               (nvmlSystemGetNVMLVersion, nvmlDeviceGetHandleByPciBusId[_v2],
#               nvmlDeviceGetMemoryInfo, nvmlDeviceCreateGpuInstance) get stand-ins built
#               from functions the library does export, so a run shows what breaks next.
#               A diagnostic only: only PROBE unset/0 is the acceptance.
#   WORKDIR     default: a fresh mktemp -d (kept, printed at the end)
#   MATRIX=1    the matrix instead of step 3 below (needs GPUSHARE_BIN): NODES default to
#               every simulated model (catalog/models/*.toml and simulator-only/), one GPU
#               each; per model, every config that matches it (mig_parted_matrix.py
#               configs: an entry for its PCI id whose MIG profile names are all the
#               model's) of DEFAULT_CONFIG (default: tests/data's copy of NVIDIA's
#               config-default.yaml), CONFIG, and a generated file of compute instances of
#               mixed sizes (mig_parted_matrix.py mixed), in both directions: from
#               all-disabled mig-parted applies, mig-parted and gpushare assert, the two
#               exports agree and mig-parted asserts gpushare's; from all-disabled
#               gpushare applies, mig-parted and gpushare assert, the exports agree and
#               mig-parted asserts gpushare's; and the GPU instances each made hold the
#               same compute instances (mig_parted_matrix.py packing; placements aside). Where one tool refuses a config, the other
#               must refuse it too. One line a (model, config), then the counts.
#               Configs that name profiles a model lacks are left out: mig-parted clears
#               the GPU and exits 1 on those, gpushare refuses them before touching it.
#   GPUSHARE_COMMIT  the commit GPUSHARE_BIN was built from, for the log
#   GPUSHARE_BIN  a directory with gpushare-agent and gpushare-ctl (and the simulated
#               driver beside them, as the agent's --simulate looks for it): gpushare then asserts
#               each config mig-parted applied, and mig-parted asserts one gpushare
#               applied and gpushare's `export --format mig-parted` (needs dbus-daemon)
#
# For each node: export; apply -c <first config> with persistence mode on as the node
# starts (informational: shows the reset mig-parted asks nvidia-smi for); persistence
# mode off (nvidia-smi -pm 0, else NVML); nvidia-smi -r -i <sysfs address> as mig-parted
# asks it; then per config: apply -c, assert -c, export, assert -c all-disabled (must
# fail), nvidia-smi -L; then apply/assert -c all-disabled, export. A100 configs:
# all-1g.5gb, all-balanced; H100: all-1g.10gb; both + DEFAULT_CONFIG's all-balanced. Each command
# is printed with its exit status; every nvidia-smi call (mig-parted's too) is logged
# with its exit status. It does not stop at the first failure; it exits 1 if any step
# outside the informational one failed.
#
# mig-parted is not only an NVML client. Two host facts it reads are faked, in a private
# mount namespace (unshare -m as root, unshare -rm otherwise), nowhere else:
#   /proc/modules          must list "nvidia", else mig-parted takes its PCI path
#                          (reads PCI config space, "nvidia module not loaded")
#   /sys/bus/pci/devices   mig-parted enumerates GPUs by PCI (go-nvlib nvpci) and then
#                          asks NVML for nvmlDeviceGetHandleByPciBusId(<sysfs address>);
#                          one directory per simulated GPU is made from what the
#                          simulated library answers (nvmlDeviceGetPciInfo_v3).
set -u

if [ "${1:-}" = "--inner" ]; then
    shift
    INNER=1
else
    INNER=0
fi

die() { echo "mig-parted-by-hand: $*" >&2; exit 2; }

# ---------------------------------------------------------------- inner (in the namespace)
if [ "$INNER" = 1 ]; then
    set -u
    : "${WORKDIR:?}" "${MIG_PARTED:?}" "${CONFIG:?}" "${NODES:?}"
    # /proc with a modules file that names nvidia; everything else is the real /proc.
    mkdir -p "$WORKDIR/realproc"
    mount --bind /proc "$WORKDIR/realproc" || die "cannot bind /proc"
    mount -t tmpfs gpushare-fake-proc /proc || die "cannot mount tmpfs on /proc"
    for e in "$WORKDIR"/realproc/*; do ln -s "$e" "/proc/${e##*/}"; done
    echo "nvidia 56623104 0 - Live 0x0000000000000000 (POE)" > /proc/modules
    mount -t tmpfs gpushare-fake-pci /sys/bus/pci || die "cannot mount tmpfs on /sys/bus/pci"

    FAILED=0
    # go-nvlib's nvpci warns per GPU per run about sysfs files a simulated GPU lacks
    # (vfio-dev is absent on real hosts too; subsystem_* are left out when the library
    # answers pciSubSystemId 0, said once per node below): keep those out of the way.
    quiet() { grep --line-buffered -v -E 'WARNING: (unable to detect IOMMU FD|subsystem_(vendor|device) file not found)' || true; }
    run() { # run LABEL cmd...: print the command, run it, print its exit status
        echo
        echo "\$ $*"
        # A shell function (gpushare below) runs as it is; a program under a timeout.
        if declare -F "$1" >/dev/null; then "$@" 2>&1 | quiet; else timeout 300 "$@" 2>&1 | quiet; fi
        local rc=${PIPESTATUS[0]}
        echo "-> exit $rc"
        [ "$rc" = 0 ] || FAILED=1
        return $rc
    }
    run_expect_fail() { # a step that must fail (assert of a config not applied)
        echo
        echo "\$ $*   # expected to fail"
        timeout 300 "$@" 2>&1 | quiet
        local rc=${PIPESTATUS[0]}
        echo "-> exit $rc"
        [ "$rc" = 1 ] || FAILED=1 # mig-parted's refusal is exit 1 (127: symbol lookup error)
        return 0
    }

    # gpushare-ctl against a gpushare-agent on this node (GPUSHARE_BIN: the directory of
    # both): a private bus and the agent are started for each call and stopped after it,
    # so that between calls mig-parted alone touches the node.
    # The agent re-applies its active profile when it starts (MIG instances do not
    # survive a reboot); in the matrix, where mig-parted and gpushare take turns on one
    # node, that would undo what mig-parted did: there the agent starts with none
    # (its state.json, which holds only the active profile, removed).
    gpushare() {
        local bus agent rc
        [ "${MATRIX:-0}" != 1 ] || rm -f "$STATE_DIR/state.json"
        bus=$(dbus-daemon --session --fork --print-address=1 --print-pid=1)
        GPUSHARE_LOG=warn "$GPUSHARE_BIN/gpushare-agent" --simulate "$NODE" \
            --bus "$(head -n1 <<<"$bus")" --state-dir "$STATE_DIR" --config /dev/null \
            --profiles-dir "$WORKDIR/no-profiles" &
        agent=$!
        GPUSHARE_BUS_ADDRESS=$(head -n1 <<<"$bus") "$GPUSHARE_BIN/gpushare-ctl" "$@"
        rc=$?
        kill "$agent"; wait "$agent" 2>/dev/null
        kill "$(tail -n1 <<<"$bus")"
        return $rc
    }
    mkdir -p "$WORKDIR/no-profiles"

    # The matrix: per (model, config) both directions, one line each; counts at the end.
    M_PAIRS=0 M_BOTH=0 M_REFUSED=0 M_BAD=0 M_CALLS=0 M_EXPECTED=0
    : > "$WORKDIR/matrix-failures.txt"
    mcall() { # mcall EXPECT(0|1|any) OUT cmd...: a quiet call (stdout to OUT, stderr to
        # OUT.err), counted against EXPECT
        local expect=$1 out=$2 rc
        shift 2
        if declare -F "$1" >/dev/null; then "$@" > "$out" 2> "$out.err"; else timeout 300 "$@" > "$out" 2> "$out.err"; fi
        rc=$?
        M_CALLS=$((M_CALLS + 1))
        case "$expect" in
            any) M_EXPECTED=$((M_EXPECTED + 1)) ;;
            0) [ "$rc" = 0 ] && M_EXPECTED=$((M_EXPECTED + 1)) ;;
            1) [ "$rc" != 0 ] && M_EXPECTED=$((M_EXPECTED + 1)) ;;
        esac
        return $rc
    }
    said() { cat "$1" "$1.err" | grep -v -E '^ *$|IOMMU FD|kill: .* No such process' | tail -n1 | cut -c1-300; }
    matrix_node() {
        local model=$1 toml f n cfg rcA rcB packA packB why o=$WORKDIR/m
        toml=$(grep -l "^key = \"$model\"" "$CATALOG"/*.toml "$CATALOG"/simulator-only/*.toml | head -1)
        [ -n "$MIXED_CONFIG" ] || { MIXED_CONFIG=$WORKDIR/mixed.yaml; python3 "$HELPER" mixed "$CATALOG" "$MIXED_CONFIG"; }
        python3 "$HELPER" configs "$toml" "$DEFAULT_CONFIG" "$CONFIG" "$MIXED_CONFIG" > "$WORKDIR/configs-$model.txt"
        echo "   $(wc -l < "$WORKDIR/configs-$model.txt") configs match $model ($toml)"
        while IFS= read -r cfg; do
            f=${cfg%:*} n=${cfg##*:} why=()
            M_PAIRS=$((M_PAIRS + 1))
            # mig-parted applies
            mcall 0 "$o.reset" "$MIG_PARTED" apply -f "$CONFIG" -c all-disabled || why+=("reset")
            mcall any "$o.mpA" "$MIG_PARTED" apply -f "$f" -c "$n"; rcA=$?
            packA=$(python3 "$HELPER" packing "$GPUSHARE_SIM_STATE" "$CATALOG")
            if [ "$rcA" = 0 ]; then
                mcall 0 "$o.x" "$MIG_PARTED" assert -f "$f" -c "$n" || why+=("mig-parted assert after mig-parted")
                if ! mcall 0 "$o.gsassertA" gpushare assert -f "$f" -c "$n"; then
                    why+=("gpushare assert after mig-parted: $(said "$o.gsassertA")")
                    gpushare plan -f "$f" -c "$n" 2>&1 | sed 's/^/   | /'
                fi
                mcall 0 "$o.mpexpA" "$MIG_PARTED" export || why+=("mig-parted export")
                mcall 0 "$o.gsexpA" gpushare export --format mig-parted || why+=("gpushare export")
                python3 "$HELPER" same "$o.mpexpA" "$o.gsexpA" > "$o.same" || why+=("after mig-parted: $(cat "$o.same")")
                mcall 0 "$o.x" "$MIG_PARTED" assert -f "$o.gsexpA" -c exported || why+=("mig-parted assert of gpushare's export after mig-parted")
            fi
            # gpushare applies
            mcall 0 "$o.reset" "$MIG_PARTED" apply -f "$CONFIG" -c all-disabled || why+=("reset")
            mcall any "$o.gsB" gpushare apply -f "$f" -c "$n"; rcB=$?
            packB=$(python3 "$HELPER" packing "$GPUSHARE_SIM_STATE" "$CATALOG")
            # Both made the same GPU instances holding the same compute instances.
            [ "$rcA" != 0 ] || [ "$rcB" != 0 ] || [ "$packA" = "$packB" ] ||
                why+=("packed differently: mig-parted $packA, gpushare $packB")
            if [ "$rcB" = 0 ]; then
                mcall 0 "$o.x" "$MIG_PARTED" assert -f "$f" -c "$n" || why+=("mig-parted assert after gpushare")
                mcall 0 "$o.x" gpushare assert -f "$f" -c "$n" || why+=("gpushare assert after gpushare")
                mcall 0 "$o.mpexpB" "$MIG_PARTED" export || why+=("mig-parted export")
                mcall 0 "$o.gsexpB" gpushare export --format mig-parted || why+=("gpushare export")
                python3 "$HELPER" same "$o.mpexpB" "$o.gsexpB" > "$o.same" || why+=("after gpushare: $(cat "$o.same")")
                mcall 0 "$o.x" "$MIG_PARTED" assert -f "$o.gsexpB" -c exported || why+=("mig-parted assert of gpushare's export after gpushare")
            fi
            if [ "$rcA" = 0 ] && [ "$rcB" = 0 ]; then
                M_BOTH=$((M_BOTH + 1))
            elif [ "$rcA" != 0 ] && [ "$rcB" != 0 ]; then
                M_REFUSED=$((M_REFUSED + 1))
                echo "   both refuse $n: mig-parted: $(said "$o.mpA")"
                echo "   both refuse $n: gpushare: $(said "$o.gsB")"
            else
                why+=("one refuses: mig-parted apply exit $rcA ($(said "$o.mpA")), gpushare apply exit $rcB ($(said "$o.gsB"))")
            fi
            if [ ${#why[@]} = 0 ]; then
                echo "ok   $model ${f##*/}:$n (mig-parted apply $rcA, gpushare apply $rcB)${packB:+: $packB}"
            else
                M_BAD=$((M_BAD + 1)); FAILED=1
                echo "FAIL $model ${f##*/}:$n (mig-parted apply $rcA, gpushare apply $rcB): $(IFS=';'; echo "${why[*]}")"
                echo "$model ${f##*/}:$n" >> "$WORKDIR/matrix-failures.txt"
            fi
        done < "$WORKDIR/configs-$model.txt"
        mcall 0 "$o.reset" "$MIG_PARTED" apply -f "$CONFIG" -c all-disabled
    }

    for NODE in $NODES; do
        model=${NODE%%:*}
        # a config is NAME (in CONFIG) or FILE:NAME; with DEFAULT_CONFIG (mig-parted's
        # deployments/systemd/config-default.yaml) all-balanced is applied from it too:
        # one entry per model chosen by device-filter (PCI device id from sysfs).
        DEF=${DEFAULT_CONFIG:+" $DEFAULT_CONFIG:all-balanced"}
        case "$model" in
            a100-40gb) CFGS=${A100_CONFIGS:-"all-1g.5gb all-balanced$DEF"} ;;
            h100-80gb) CFGS=${H100_CONFIGS:-"all-1g.10gb$DEF"} ;;
            *) CFGS=${OTHER_CONFIGS:-"all-enabled"} ;;
        esac
        export GPUSHARE_SIM_NODE=$NODE
        # The node's file where a gpushare-agent with --state-dir $STATE_DIR keeps it, so
        # that gpushare and mig-parted read one node.
        STATE_DIR="$WORKDIR/state-${model}"
        rm -rf "$STATE_DIR"; mkdir -p "$STATE_DIR"
        export GPUSHARE_SIM_STATE="$STATE_DIR/simulated-gpus.json"
        echo
        echo "================ node $NODE (state $GPUSHARE_SIM_STATE) configs: $CFGS"

        # fake /sys/bus/pci/devices from what the simulated library says
        rm -rf /sys/bus/pci/devices /sys/bus/pci/drivers
        mkdir -p /sys/bus/pci/devices /sys/bus/pci/drivers/nvidia
        if ! python3 "$SIM_PCI" "$SIM_LIB" > "$WORKDIR/pci-$model.txt"; then
            echo "!! cannot list the simulated GPUs through $SIM_LIB"; FAILED=1; continue
        fi
        while read -r idx busid devid subid; do
            # NVML busId 00000000:1B:00.0 -> sysfs 0000:1b:00.0
            addr=$(echo "${busid#????}" | tr 'A-F' 'a-f')
            d=/sys/bus/pci/devices/$addr
            mkdir -p "$d"
            printf '0x%04x\n' $((devid & 0xffff)) > "$d/vendor"
            printf '0x%04x\n' $((devid >> 16)) > "$d/device"
            if [ $((subid)) != 0 ]; then
                printf '0x%04x\n' $((subid & 0xffff)) > "$d/subsystem_vendor"
                printf '0x%04x\n' $((subid >> 16)) > "$d/subsystem_device"
            else # the library answers pciSubSystemId 0: leave the files out (nvpci warns)
                echo "   (GPU $idx: simulated pciSubSystemId is 0; sysfs subsystem_* left out)"
            fi
            echo 0x030200 > "$d/class"
            echo -1 > "$d/numa_node"
            printf '0x%016x 0x%016x 0x%016x\n' $((0xa0000000 + idx * 0x1000000)) $((0xa0ffffff + idx * 0x1000000)) 0x40200 > "$d/resource"
            ln -s ../../drivers/nvidia "$d/driver"
            echo "   sysfs $addr  vendor $(cat "$d/vendor") device $(cat "$d/device")  (NVML busId $busid, GPU $idx)"
        done < "$WORKDIR/pci-$model.txt"

        MP=("$MIG_PARTED")
        cfg_file() { case "$1" in *:*) echo "${1%:*}" ;; *) echo "$CONFIG" ;; esac; }
        cfg_name() { echo "${1##*:}"; }
        CFG1=${CFGS%% *}
        FIRST_BUS=$(awk 'NR == 1 { print $2 }' "$WORKDIR/pci-$model.txt")
        FIRST_ADDR=$(echo "${FIRST_BUS#????}" | tr 'A-F' 'a-f')
        run "${MP[@]}" export

        # 1. As the node starts (persistence mode on): a MIG mode change that needs a reset
        # (A100) stays pending and mig-parted runs `nvidia-smi -r -i <sysfs addresses>`,
        # which a host refuses while persistence mode holds the GPU ("In use by another
        # client", exit 255: gpu-operator#118, NVSentinel#1690). Not counted as a failure:
        # the point is what nvidia-smi is asked and answers (see the log at the end).
        prev=$FAILED
        echo; echo "---- apply with persistence mode on, as the simulated node starts (informational)"
        run "${MP[@]}" -d apply -f "$(cfg_file "$CFG1")" -c "$(cfg_name "$CFG1")"
        FAILED=$prev

        # 2. As on a host, turn persistence mode off (PERSISTENCE_OFF=0 leaves it on):
        # nvidia-smi -pm 0, or through NVML where the simulated nvidia-smi lacks -pm.
        if [ "${PERSISTENCE_OFF:-1}" = 1 ]; then
            echo; echo "---- persistence mode off, as the host's admin would"
            if ! run nvidia-smi -pm 0; then
                FAILED=$prev # not mig-parted's; the nvidia-smi log keeps it
                echo "   (nvidia-smi -pm 0 refused: persistence mode set off through NVML instead)"
                python3 "$SIM_PCI" "$SIM_LIB" persistence-off || FAILED=1
            fi
            # the pending change of step 1 needs a reset; mig-parted asks it this way
            echo; echo "---- a reset asked as mig-parted asks it (sysfs address; A100: the change step 1 left pending)"
            run nvidia-smi -r -i "$FIRST_ADDR"
        fi

        # 3m. The matrix (MATRIX=1).
        if [ "${MATRIX:-0}" = 1 ]; then
            matrix_node "$model"
            continue
        fi

        # 3. The acceptance proper.
        for CFG in $CFGS; do
            echo; echo "---- $CFG"
            run "${MP[@]}" -d apply -f "$(cfg_file "$CFG")" -c "$(cfg_name "$CFG")"
            run "${MP[@]}" assert -f "$(cfg_file "$CFG")" -c "$(cfg_name "$CFG")"
            run "${MP[@]}" export
            run_expect_fail "${MP[@]}" assert -f "$CONFIG" -c all-disabled
            run nvidia-smi -L
            # gpushare reads mig-parted's layout: its assert of the same config holds.
            [ -z "${GPUSHARE_BIN:-}" ] ||
                run gpushare assert -f "$(cfg_file "$CFG")" -c "$(cfg_name "$CFG")"
        done
        # mig-parted reads gpushare's layout: gpushare applies the first config from
        # all-disabled, mig-parted's assert of it holds; gpushare's own export, as a
        # mig-parted file, asserts too.
        if [ -n "${GPUSHARE_BIN:-}" ]; then
            echo; echo "---- gpushare applies $CFG1, mig-parted asserts it"
            run "${MP[@]}" -d apply -f "$CONFIG" -c all-disabled
            run gpushare apply -f "$(cfg_file "$CFG1")" -c "$(cfg_name "$CFG1")"
            run "${MP[@]}" assert -f "$(cfg_file "$CFG1")" -c "$(cfg_name "$CFG1")"
            gpushare export --format mig-parted > "$WORKDIR/gpushare-export-$model.yaml"
            run "${MP[@]}" assert -f "$WORKDIR/gpushare-export-$model.yaml" -c exported
        fi
        echo; echo "---- all-disabled"
        run "${MP[@]}" -d apply -f "$CONFIG" -c all-disabled
        run "${MP[@]}" assert -f "$CONFIG" -c all-disabled
        run "${MP[@]}" export
    done
    if [ "${MATRIX:-0}" = 1 ]; then
        echo
        echo "================ matrix: $M_PAIRS (model, config) pairs × 2 directions: $((M_PAIRS - M_BAD)) as expected, $M_BAD not; applied by both $M_BOTH, refused by both $M_REFUSED, by one $((M_PAIRS - M_BOTH - M_REFUSED)); $M_CALLS calls, $M_EXPECTED as expected"
        [ ! -s "$WORKDIR/matrix-failures.txt" ] || { echo "failed:"; sed 's/^/  /' "$WORKDIR/matrix-failures.txt"; }
        echo "nvidia-smi calls made: $(wc -l < "$WORKDIR/nvidia-smi.log" 2>/dev/null || echo 0) (log: $WORKDIR/nvidia-smi.log)"
        exit $FAILED
    fi
    echo
    echo "================ nvidia-smi calls made (mig-parted's and the script's):"
    cat "$WORKDIR/nvidia-smi.log" 2>/dev/null || echo "(none)"
    exit $FAILED
fi

# ---------------------------------------------------------------- outer
MIG_PARTED=${MIG_PARTED:-}
SIM_DIR=${SIM_DIR:-}
CONFIG=${1:-${CONFIG:-}}
DEFAULT_CONFIG=${DEFAULT_CONFIG:-}
if [ -z "$DEFAULT_CONFIG" ] && [ -f "${CONFIG%/*}/../deployments/systemd/config-default.yaml" ]; then
    DEFAULT_CONFIG=${CONFIG%/*}/../deployments/systemd/config-default.yaml
fi
[ -z "$DEFAULT_CONFIG" ] || DEFAULT_CONFIG=$(realpath "$DEFAULT_CONFIG")
HERE=$(dirname "$(realpath "$0")")
CATALOG=${CATALOG:-$HERE/../../catalog/models}
HELPER=$HERE/mig_parted_matrix.py
MIXED_CONFIG=${MIXED_CONFIG:-}
if [ "${MATRIX:-0}" = 1 ]; then
    [ -n "${GPUSHARE_BIN:-}" ] || die "MATRIX=1 needs GPUSHARE_BIN"
    [ -n "$DEFAULT_CONFIG" ] || DEFAULT_CONFIG=$(realpath "$HERE/../data/mig-parted-config-default.yaml")
    if [ -z "${NODES:-}" ]; then
        NODES=$(sed -n 's/^key = "\(.*\)"/\1:1/p' "$CATALOG"/*.toml "$CATALOG"/simulator-only/*.toml | tr '\n' ' ')
    fi
fi
NODES=${NODES:-"a100-40gb:8 h100-80gb:2"}
[ -x "$MIG_PARTED" ] || die "set MIG_PARTED to the nvidia-mig-parted binary"
[ -f "$SIM_DIR/libgpushare_sim_nvml.so" ] || die "SIM_DIR has no libgpushare_sim_nvml.so"
[ -x "$SIM_DIR/gpushare-sim-nvidia-smi" ] || die "SIM_DIR has no gpushare-sim-nvidia-smi"
[ -f "$CONFIG" ] || die "give mig-parted's examples/config.yaml (argument or CONFIG)"
command -v python3 >/dev/null || die "python3 is needed (to read the simulated PCI ids)"
command -v unshare >/dev/null || die "unshare (util-linux) is needed"

MIG_PARTED=$(realpath "$MIG_PARTED"); SIM_DIR=$(realpath "$SIM_DIR"); CONFIG=$(realpath "$CONFIG")
WORKDIR=${WORKDIR:-$(mktemp -d /tmp/mig-parted-by-hand.XXXXXX)}
mkdir -p "$WORKDIR/lib" "$WORKDIR/bin"
WORKDIR=$(realpath "$WORKDIR")
SIM_LIB=$SIM_DIR/libgpushare_sim_nvml.so
ln -sfn "$SIM_LIB" "$WORKDIR/lib/libnvidia-ml.so.1"
ln -sfn "$SIM_DIR/gpushare-sim-nvidia-smi" "$WORKDIR/lib/gpushare-sim-nvidia-smi"
# nvidia-smi: the simulated tool, with every call logged (args, exit status)
cat > "$WORKDIR/bin/nvidia-smi" <<EOF
#!/usr/bin/env bash
"$SIM_DIR/gpushare-sim-nvidia-smi" "\$@"
rc=\$?
echo "nvidia-smi \$* -> exit \$rc (GPUSHARE_SIM_NODE=\$GPUSHARE_SIM_NODE)" >> "$WORKDIR/nvidia-smi.log"
exit \$rc
EOF
chmod +x "$WORKDIR/bin/nvidia-smi"
: > "$WORKDIR/nvidia-smi.log"

PRELOAD=
PROBE=${PROBE:-0}
if [ "$PROBE" = 1 ] || [ "$PROBE" = 2 ]; then
    command -v gcc >/dev/null || die "PROBE=1 needs gcc"
    nm -D --undefined-only "$MIG_PARTED" | awk '{print $2}' | grep '^nvml' | sort -u > "$WORKDIR/binary-nvml.txt"
    nm -D --defined-only "$SIM_LIB" | awk '{print $3}' | grep '^nvml' | sort -u > "$WORKDIR/sim-nvml.txt"
    comm -23 "$WORKDIR/binary-nvml.txt" "$WORKDIR/sim-nvml.txt" > "$WORKDIR/absent-nvml.txt"
    # PROBE=2: four absent functions that stop mig-parted before it does anything get a
    # stand-in made of functions the library does export (logged as "PROBE: stand-in"),
    # so that a run goes on and shows what breaks after them. Not the simulator's answer.
    SHIMS=" nvmlSystemGetNVMLVersion nvmlDeviceGetHandleByPciBusId nvmlDeviceGetHandleByPciBusId_v2 nvmlDeviceGetMemoryInfo nvmlDeviceCreateGpuInstance "
    {
        echo '#define _GNU_SOURCE'
        echo '#include <stdio.h>'
        echo '#include <stdlib.h>'
        echo '#include <string.h>'
        echo '#include <dlfcn.h>'
        echo '#define probe(f, how) do { static int said; probe_(f, how, &said); } while (0)'
        echo 'static void probe_(const char *f, const char *how, int *said) { const char *p = getenv("PROBE_LOG"); FILE *o = p ? fopen(p, "a") : NULL;'
        echo '  if (!*said) fprintf(stderr, "PROBE: mig-parted called %s, absent from the simulated library%s (said once per run)\n", f, how);'
        echo '  *said = 1; if (o) { fprintf(o, "%s%s\n", f, how); fclose(o); } }'
        while read -r f; do
            if [ "${PROBE}" = 2 ] && [[ "$SHIMS" == *" $f "* ]]; then echo "#define ABSENT_$f 1"; continue; fi
            echo "int $f(void) { probe(\"$f\", \"\"); return 13; }"
        done < "$WORKDIR/absent-nvml.txt"
        if [ "${PROBE}" = 2 ]; then cat <<'SHIM'
#define SIM(name, ...) int (*name)(__VA_ARGS__) = (int (*)(__VA_ARGS__))dlsym(RTLD_DEFAULT, #name); if (!name) return 13
typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
static int parse_bus(const char *s, unsigned *d, unsigned *b, unsigned *v, unsigned *f) {
    if (sscanf(s, "%x:%x:%x.%x", d, b, v, f) == 4) return 1;
    *d = 0; return sscanf(s, "%x:%x.%x", b, v, f) == 3;
}
static int by_bus(int v2, const char *id, void **h) {
    if (v2) probe("nvmlDeviceGetHandleByPciBusId_v2", " (stand-in: nvmlDeviceGetCount_v2/GetHandleByIndex_v2/GetPciInfo_v3)");
    else probe("nvmlDeviceGetHandleByPciBusId", " (stand-in: nvmlDeviceGetCount_v2/GetHandleByIndex_v2/GetPciInfo_v3)");
    SIM(nvmlDeviceGetCount_v2, unsigned *); SIM(nvmlDeviceGetHandleByIndex_v2, unsigned, void **); SIM(nvmlDeviceGetPciInfo_v3, void *, pci_t *);
    unsigned d, b, v, fn, n = 0, i; if (!id || !h) return 2; if (!parse_bus(id, &d, &b, &v, &fn)) return 2;
    int r = nvmlDeviceGetCount_v2(&n); if (r) return r;
    for (i = 0; i < n; i++) { void *x; pci_t p; unsigned d2, b2, v2, f2;
        if (nvmlDeviceGetHandleByIndex_v2(i, &x) || nvmlDeviceGetPciInfo_v3(x, &p)) continue;
        if (parse_bus(p.busId, &d2, &b2, &v2, &f2) && d == d2 && b == b2 && v == v2 && fn == f2) { *h = x; return 0; } }
    return 6; /* NVML_ERROR_NOT_FOUND */
}
#ifdef ABSENT_nvmlDeviceGetHandleByPciBusId_v2
int nvmlDeviceGetHandleByPciBusId_v2(const char *id, void **h) { return by_bus(1, id, h); }
#endif
#ifdef ABSENT_nvmlDeviceGetHandleByPciBusId
int nvmlDeviceGetHandleByPciBusId(const char *id, void **h) { return by_bus(0, id, h); }
#endif
#ifdef ABSENT_nvmlSystemGetNVMLVersion
int nvmlSystemGetNVMLVersion(char *buf, unsigned len) {
    probe("nvmlSystemGetNVMLVersion", " (stand-in: \"13.\" + nvmlSystemGetDriverVersion)");
    SIM(nvmlSystemGetDriverVersion, char *, unsigned); char drv[80] = ""; int r = nvmlSystemGetDriverVersion(drv, sizeof drv); if (r) return r;
    if (!buf) return 2; if (snprintf(buf, len, "13.%s", drv) >= (int)len) return 7; return 0;
}
#endif
#ifdef ABSENT_nvmlDeviceGetMemoryInfo
int nvmlDeviceGetMemoryInfo(void *dev, unsigned long long *m) {
    probe("nvmlDeviceGetMemoryInfo", " (stand-in: nvmlDeviceGetMemoryInfo_v2)");
    SIM(nvmlDeviceGetMemoryInfo_v2, void *, void *); struct { unsigned version; unsigned long long total, reserved, free, used; } v2;
    memset(&v2, 0, sizeof v2); v2.version = (unsigned)sizeof v2 | (2u << 24); int r = nvmlDeviceGetMemoryInfo_v2(dev, &v2); if (r) return r;
    if (!m) return 2; m[0] = v2.total; m[1] = v2.free; m[2] = v2.used; return 0;
}
#endif
#ifdef ABSENT_nvmlDeviceCreateGpuInstance
int nvmlDeviceCreateGpuInstance(void *dev, unsigned profile, void **gi) {
    probe("nvmlDeviceCreateGpuInstance", " (stand-in: GetGpuInstancePossiblePlacements_v2 + CreateGpuInstanceWithPlacement)");
    SIM(nvmlDeviceGetGpuInstancePossiblePlacements_v2, void *, unsigned, unsigned *, unsigned *);
    SIM(nvmlDeviceCreateGpuInstanceWithPlacement, void *, unsigned, const unsigned *, void **);
    unsigned pl[2 * 64], n = 64, i; int r = nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, profile, pl, &n); if (r) return r;
    for (i = 0; i < n; i++) { r = nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile, &pl[2 * i], gi); if (r == 0) return 0; }
    return 23; /* NVML_ERROR_INSUFFICIENT_RESOURCES */
}
#endif
SHIM
        fi
    } > "$WORKDIR/probe.c"
    gcc -shared -fPIC -O0 -o "$WORKDIR/lib/libprobe-absent-nvml.so" "$WORKDIR/probe.c" -ldl || die "cannot build the probe stub"
    PRELOAD=$WORKDIR/lib/libprobe-absent-nvml.so
    : > "$WORKDIR/probe.log"
    echo "PROBE: $(wc -l < "$WORKDIR/absent-nvml.txt") nvml* functions referenced by the binary are absent from the library; stubs log the ones called"
fi

echo "mig-parted: $MIG_PARTED ($("$MIG_PARTED" --version 2>&1 | head -1))"
echo "simulator:  $SIM_DIR ($(stat -c '%y' "$SIM_LIB" | cut -d. -f1), $(nm -D --defined-only "$SIM_LIB" | grep -c ' nvml') nvml* exported)"
echo "config:     $CONFIG${DEFAULT_CONFIG:+ and $DEFAULT_CONFIG (all-balanced)}"
[ -z "${GPUSHARE_BIN:-}" ] || echo "gpushare:   $GPUSHARE_BIN ($("$GPUSHARE_BIN/gpushare-ctl" --version 2>&1 | head -1)${GPUSHARE_COMMIT:+, commit $GPUSHARE_COMMIT})"
echo "workdir:    $WORKDIR"

if [ "$(id -u)" = 0 ]; then UNSHARE=(unshare -m --propagation private); else UNSHARE=(unshare -rm --propagation private); fi
env WORKDIR="$WORKDIR" MIG_PARTED="$MIG_PARTED" CONFIG="$CONFIG" DEFAULT_CONFIG="$DEFAULT_CONFIG" NODES="$NODES" SIM_DIR="$SIM_DIR" SIM_LIB="$SIM_LIB" \
    CATALOG="$(realpath "$CATALOG")" HELPER="$HELPER" SIM_PCI="$HERE/sim_pci.py" MIXED_CONFIG="$MIXED_CONFIG" MATRIX="${MATRIX:-0}" \
    PATH="$WORKDIR/bin:$PATH" LD_LIBRARY_PATH="$WORKDIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    ${PRELOAD:+LD_PRELOAD="$PRELOAD" PROBE_LOG="$WORKDIR/probe.log"} \
    "${UNSHARE[@]}" bash "$(realpath "$0")" --inner
rc=$?
if [ -n "$PRELOAD" ]; then
    echo
    echo "================ PROBE: absent nvml* functions mig-parted called (count):"
    sort "$WORKDIR/probe.log" | uniq -c
fi
echo
echo "workdir kept: $WORKDIR   overall: $([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc
