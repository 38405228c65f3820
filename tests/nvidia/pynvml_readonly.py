#!/usr/bin/env python3
"""Read-only answers of an NVML library through NVIDIA's own Python bindings (nvidia-ml-py).

Run on a real GPU host and on gpushare's simulated driver (PYNVML_LIB names the library to
load, else NVIDIA's); prints one JSON document: per call, its answer or the NVML error's
name. tests/nvidia/compare.py compares two such documents field for field, ids aside.
Nothing here changes the GPU.
"""

import ctypes
import json
import os
import sys

import pynvml as nv


def error_name(e):
    for name in dir(nv):
        if name.startswith("NVML_ERROR_") and getattr(nv, name) == e.value:
            return name
    return "NVML_ERROR_%d" % e.value


def plain(value):
    """ctypes structures and arrays as JSON values."""
    if isinstance(value, ctypes.Structure):
        out = {}
        for field in value._fields_:
            name = field[0]
            out[name] = plain(getattr(value, name))
        return out
    if isinstance(value, ctypes.Array):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


def call(fn, *args, **kwargs):
    try:
        return plain(fn(*args, **kwargs))
    except nv.NVMLError as e:  # a symbol the library lacks is NVML_ERROR_FUNCTION_NOT_FOUND
        return "ERR:" + error_name(e)


def gpu_instance_profiles(h):
    profiles = {}
    for enum in range(0, 18):
        info = call(nv.nvmlDeviceGetGpuInstanceProfileInfo, h, enum)
        entry = {"info": info}
        if isinstance(info, dict):
            pid = info["id"]
            entry["info_v1"] = call(nv.nvmlDeviceGetGpuInstanceProfileInfo, h, enum, 1)
            entry["by_id"] = call(nv.nvmlDeviceGetGpuInstanceProfileInfoById, h, pid)
            entry["remaining"] = call(nv.nvmlDeviceGetGpuInstanceRemainingCapacity, h, pid)
            placements = (nv.c_nvmlGpuInstancePlacement_t * 8)()
            count = ctypes.c_uint(8)
            try:
                nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, pid, placements, ctypes.byref(count))
                entry["placements"] = [[p.start, p.size] for p in placements[: count.value]]
            except nv.NVMLError as e:
                entry["placements"] = "ERR:" + error_name(e)
        profiles[str(enum)] = entry
    return profiles


def device(i):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    d = {
        "name": call(nv.nvmlDeviceGetName, h),
        "uuid": call(nv.nvmlDeviceGetUUID, h),
        "serial": call(nv.nvmlDeviceGetSerial, h),
        "board_id": call(nv.nvmlDeviceGetBoardId, h),
        "index": call(nv.nvmlDeviceGetIndex, h),
        "minor_number": call(nv.nvmlDeviceGetMinorNumber, h),
        "pci": call(nv.nvmlDeviceGetPciInfo, h),
        "pci_v3": call(nv.nvmlDeviceGetPciInfo_v3, h),
        "memory_v1": call(nv.nvmlDeviceGetMemoryInfo, h),
        "memory_v2": call(nv.nvmlDeviceGetMemoryInfo, h, version=nv.nvmlMemory_v2),
        "architecture": call(nv.nvmlDeviceGetArchitecture, h),
        "cuda_compute_capability": call(nv.nvmlDeviceGetCudaComputeCapability, h),
        "brand": call(nv.nvmlDeviceGetBrand, h),
        "mig_mode": call(nv.nvmlDeviceGetMigMode, h),
        "compute_mode": call(nv.nvmlDeviceGetComputeMode, h),
        "persistence_mode": call(nv.nvmlDeviceGetPersistenceMode, h),
        "max_mig_device_count": call(nv.nvmlDeviceGetMaxMigDeviceCount, h),
        "is_mig_device_handle": call(nv.nvmlDeviceIsMigDeviceHandle, h),
        "multi_gpu_board": call(nv.nvmlDeviceGetMultiGpuBoard, h),
        "num_gpu_cores": call(nv.nvmlDeviceGetNumGpuCores, h),
        "gpu_instance_profiles": gpu_instance_profiles(h),
    }
    # Handles found the other ways lead to the same GPU.
    uuid = nv.nvmlDeviceGetUUID(h)
    d["by_uuid_index"] = call(lambda: nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(uuid)))
    serial = d["serial"]
    if isinstance(serial, str) and not serial.startswith("ERR:"):
        d["by_serial_index"] = call(
            lambda: nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleBySerial(serial))
        )
    pci = nv.nvmlDeviceGetPciInfo(h)
    bus_id = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
    short = bus_id[4:] if len(bus_id) > 12 else bus_id  # 00000000:1B:00.0 -> 0000:1B:00.0
    for label, form in [("full", bus_id), ("short", short), ("lower", bus_id.lower())]:
        d["by_pci_%s_index" % label] = call(
            lambda f=form: nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(f))
        )
    procs = call(nv.nvmlDeviceGetComputeRunningProcesses, h)
    d["compute_processes"] = len(procs) if isinstance(procs, list) else procs
    return d


def main():
    library = os.environ.get("PYNVML_LIB")
    if library:
        # pynvml loads libnvidia-ml.so.1 with CDLL: hand it ours.
        nv.nvmlLib = ctypes.CDLL(library)
    nv.nvmlInit()
    out = {
        "driver_version": call(nv.nvmlSystemGetDriverVersion),
        "nvml_version": call(nv.nvmlSystemGetNVMLVersion),
        "cuda_driver_version": call(nv.nvmlSystemGetCudaDriverVersion),
        "cuda_driver_version_v2": call(nv.nvmlSystemGetCudaDriverVersion_v2),
        "count": call(nv.nvmlDeviceGetCount),
        "no_such_index": call(nv.nvmlDeviceGetHandleByIndex, 99),
        "no_such_uuid": call(nv.nvmlDeviceGetHandleByUUID, "GPU-00000000-0000-0000-0000-000000000000"),
        "bad_pci_bus_id": call(nv.nvmlDeviceGetHandleByPciBusId, "not-a-bus-id"),
    }
    out["devices"] = [device(i) for i in range(nv.nvmlDeviceGetCount())]
    nv.nvmlShutdown()
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
