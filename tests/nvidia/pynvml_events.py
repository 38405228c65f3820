#!/usr/bin/env python3
"""Waits for NVML events through NVIDIA's own Python bindings (nvidia-ml-py), as NVIDIA's
device plugin registers them: XidCriticalError | DoubleBitEccError | SingleBitEccError on
every GPU, one event set. Prints one JSON line `{"ready": N}` once registered on the N GPUs
(a line `{"register": i, "error": NAME}` for a GPU that refused), then one JSON line per
event: the GPU's index, eventType, eventData, gpuInstanceId, computeInstanceId; stops after
--count events (exit 0) or when --timeout-s passes first (exit 1).

    PYNVML_LIB=/path/libgpushare_sim_nvml.so python3 tests/nvidia/pynvml_events.py --count 2

PYNVML_LIB names the library to load, else NVIDIA's. Changes nothing on the GPU.
"""

import argparse
import ctypes
import json
import os
import sys
import time

import pynvml as nv


def error_name(e):
    for name in dir(nv):
        if name.startswith("NVML_ERROR_") and getattr(nv, name) == e.value:
            return name
    return "NVML_ERROR_%d" % e.value


def say(obj):
    print(json.dumps(obj, sort_keys=True), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args()
    library = os.environ.get("PYNVML_LIB")
    if library:
        # pynvml loads libnvidia-ml.so.1 with CDLL: hand it ours.
        nv.nvmlLib = ctypes.CDLL(library)
    nv.nvmlInit()
    wanted = (nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
              | nv.nvmlEventTypeSingleBitEccError)
    event_set = nv.nvmlEventSetCreate()
    # The event's device is the handle registered: map it back without another call (a
    # GPU off the bus answers nothing more).
    index_of = {}
    registered = 0
    for i in range(nv.nvmlDeviceGetCount()):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            nv.nvmlDeviceRegisterEvents(handle, wanted, event_set)
        except nv.NVMLError as e:
            say({"register": i, "error": error_name(e)})
            continue
        index_of[ctypes.cast(handle, ctypes.c_void_p).value] = i
        registered += 1
    say({"ready": registered})
    deadline = time.monotonic() + args.timeout_s
    seen = 0
    while seen < args.count:
        if time.monotonic() >= deadline:
            print("pynvml_events: no event within --timeout-s", file=sys.stderr)
            return 1
        try:
            data = nv.nvmlEventSetWait(event_set, 1000)
        except nv.NVMLError_Timeout:
            continue
        device = ctypes.cast(data.device, ctypes.c_void_p).value
        gpu = index_of.get(device)
        if gpu is None:
            gpu = nv.nvmlDeviceGetIndex(data.device)
        say({"gpu": gpu, "eventType": data.eventType, "eventData": data.eventData,
             "gpuInstanceId": data.gpuInstanceId, "computeInstanceId": data.computeInstanceId})
        seen += 1
    nv.nvmlEventSetFree(event_set)
    nv.nvmlShutdown()
    return 0


sys.exit(main())
