#!/usr/bin/env bash
# Regenerates nvml-functions.txt, the names of every function nvml.h declares that returns
# nvmlReturn_t (the versioned ones and the deprecated unversioned ones at its end), from a
# copy of NVIDIA's nvml.h (NVIDIA/go-nvml's gen/nvml/nvml.h is the one used):
#
#   sim/nvml/abi/update-functions.sh path/to/nvml.h "go-nvml <commit>, NVML API <n>"
#
# build.rs gives every name the library does not model a stub answering
# NVML_ERROR_NOT_SUPPORTED; tests/abi_complete.rs dlsyms every name.
set -euo pipefail
header=$1
source=$2
out=$(dirname "$0")/nvml-functions.txt
api=$(sed -n 's/^#define NVML_API_VERSION *\([0-9]*\).*/\1/p' "$header")
{
  echo "# Every nvmlReturn_t function of nvml.h (NVML API $api), from $source."
  echo "# Regenerate with sim/nvml/abi/update-functions.sh; one name a line."
  tr '\n' ' ' <"$header" | grep -oE 'nvmlReturn_t +DECLDIR +nvml[A-Za-z0-9_]+ *\(' |
    sed -E 's/.*DECLDIR +(nvml[A-Za-z0-9_]+).*/\1/' | sort -u
} >"$out"
echo "$(grep -vc '^#' "$out") functions in $out"
