#!/usr/bin/env python3
"""Every GPU-instance profile one GPU's driver offers, read through NVIDIA's own Python
bindings (nvidia-ml-py), read-only: for each profile enum 0-31 the v2 ProfileInfo
(id, name, slices, instances, SMs, memory, engines) and the possible placements. Prints
one JSON object. Safe on a GPU you do not own: it only queries (MIG may be off).

    mig_profiles_nvml.py [GPU_INDEX]          # the system's libnvidia-ml
    PYNVML_LIB=/path/libgpushare_sim_nvml.so mig_profiles_nvml.py 0   # the simulator
"""

import ctypes
import json
import os
import sys

import pynvml as nv


def placements(device, profile_id):
    count = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, None, ctypes.byref(count))
    buf = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, buf, ctypes.byref(count))
    return sorted([buf[i].start, buf[i].size] for i in range(count.value))


def main():
    if "PYNVML_LIB" in os.environ:
        nv.nvmlLib = ctypes.CDLL(os.environ["PYNVML_LIB"])
    nv.nvmlInit()
    index = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    device = nv.nvmlDeviceGetHandleByIndex(index)
    profiles = []
    for nvml_enum in range(32):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(device, nvml_enum)
        except nv.NVMLError:
            continue
        name = info.name.decode() if isinstance(info.name, bytes) else info.name
        profiles.append({
            "nvml_enum": nvml_enum,
            "id": info.id,
            "name": name.removeprefix("MIG ").strip(),
            "slice_count": info.sliceCount,
            "instance_count": info.instanceCount,
            "sms": info.multiprocessorCount,
            "memory_mib": info.memorySizeMB,
            "engines": [info.copyEngineCount, info.decoderCount, info.encoderCount,
                        info.jpegCount, info.ofaCount],
            "placements": placements(device, info.id),
        })
    name = nv.nvmlDeviceGetName(device)
    print(json.dumps({
        "index": index,
        "name": name.decode() if isinstance(name, bytes) else name,
        "driver_version": nv.nvmlSystemGetDriverVersion(),
        "profiles": profiles,
    }, indent=1))
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
