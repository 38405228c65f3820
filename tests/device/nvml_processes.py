"""NVML's process lists of every GPU, read-only, straight through ctypes on
libnvidia-ml.so.1 (no pynvml needed): for each GPU, nvmlDeviceGetComputeRunningProcesses_v3
and nvmlDeviceGetMPSComputeRunningProcesses_v3, each entry's pid, used memory (None where
NVML says NVML_VALUE_NOT_AVAILABLE) and instance ids. Prints one JSON object.

  python3 nvml_processes.py [--time N]   (--time: instead, one Markdown row: the median,
                                          min and max ms of N reads of both lists)
"""
import ctypes
import json
import sys
import time

nvml = ctypes.CDLL("libnvidia-ml.so.1")
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: NVML error {rc}")


def processes(handle, name):
    function = getattr(nvml, name)
    for _ in range(3):
        count = ctypes.c_uint(0)
        rc = function(handle, ctypes.byref(count), None)
        if rc == 0:
            return []
        if rc != 7:  # NVML_ERROR_INSUFFICIENT_SIZE
            return {"error": rc}
        n = count.value + 8
        count = ctypes.c_uint(n)
        infos = (ProcessInfo * n)()
        rc = function(handle, ctypes.byref(count), infos)
        if rc == 0:
            return [{"pid": p.pid,
                     "used_memory_bytes": None if p.usedGpuMemory == NOT_AVAILABLE else p.usedGpuMemory,
                     "gpu_instance_id": p.gpuInstanceId, "compute_instance_id": p.computeInstanceId}
                    for p in infos[:count.value]]
        if rc != 7:
            return {"error": rc}
    return {"error": "list kept growing"}


check(nvml.nvmlInit_v2(), "nvmlInit_v2")
count = ctypes.c_uint()
check(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
gpus = []
handles = []
for i in range(count.value):
    h = ctypes.c_void_p()
    check(nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)), "nvmlDeviceGetHandleByIndex_v2")
    handles.append(h)
    gpus.append({
        "index": i,
        "compute": processes(h, "nvmlDeviceGetComputeRunningProcesses_v3"),
        "mps": processes(h, "nvmlDeviceGetMPSComputeRunningProcesses_v3"),
    })
result = {"gpus": gpus}
if len(sys.argv) == 3 and sys.argv[1] == "--time":
    times = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter()
        for h in handles:
            processes(h, "nvmlDeviceGetComputeRunningProcesses_v3")
            processes(h, "nvmlDeviceGetMPSComputeRunningProcesses_v3")
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    nvml.nvmlShutdown()
    print(f"| NVML compute + MPS lists of every GPU, in one process | {len(times)} | "
          f"{times[len(times) // 2]:.3f} | {times[0]:.3f} | | {times[-1]:.3f} |")
    sys.exit(0)
nvml.nvmlShutdown()
print(json.dumps(result))
