"""Summarises the NVML traces tests/nvidia/gfd-by-hand.sh keeps (nvml-trace.sh's format).

    python3 gfd_trace_summary.py RESULTS_DIR [--all]

For each (function, return code) other than SUCCESS (with --all: every one), the runs that
saw it: <node>/<profile>/<run> and how many calls. Return codes are named as nvml.h names
them. A non-SUCCESS answer is not wrong by itself (NOT_FOUND for an empty MIG slot is the
driver's answer too): each needs a real driver's answer to compare with.
"""
import collections
import pathlib
import sys

NAMES = {0: "SUCCESS", 1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
         5: "ALREADY_INITIALIZED", 6: "NOT_FOUND", 7: "INSUFFICIENT_SIZE", 8: "INSUFFICIENT_POWER",
         9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 11: "IRQ_ISSUE", 12: "LIBRARY_NOT_FOUND",
         13: "FUNCTION_NOT_FOUND", 14: "CORRUPTED_INFOROM", 15: "GPU_IS_LOST", 16: "RESET_REQUIRED",
         17: "OPERATING_SYSTEM", 18: "LIB_RM_VERSION_MISMATCH", 19: "IN_USE", 20: "MEMORY",
         21: "NO_DATA", 22: "VGPU_ECC_NOT_SUPPORTED", 23: "INSUFFICIENT_RESOURCES",
         24: "FREQ_NOT_SUPPORTED", 25: "ARGUMENT_VERSION_MISMATCH", 26: "DEPRECATED", 27: "NOT_READY",
         28: "GPU_NOT_FOUND", 29: "INVALID_STATE", 999: "UNKNOWN"}


def main():
    root = pathlib.Path(sys.argv[1])
    every = "--all" in sys.argv[2:]
    seen = collections.defaultdict(lambda: collections.Counter())
    for trace in sorted(root.glob("*/*/*/nvml-trace.txt")):
        run = "/".join(trace.parent.parts[-3:])
        for line in trace.read_text().splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            key = (parts[0], parts[1])
            if every or parts[1] != "0":
                seen[key][run] += 1
    if not seen:
        print("(none)")
    for (fn, rc), runs in sorted(seen.items()):
        name = "ABSENT from the library" if rc == "ABSENT" else "%s %s" % (rc, NAMES.get(int(rc), "?"))
        calls = sum(runs.values())
        print("%-52s %-28s %5d calls in %d runs, e.g. %s" % (fn, name, calls, len(runs), min(runs)))


if __name__ == "__main__":
    main()
