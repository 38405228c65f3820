#!/usr/bin/env python3
"""A MIG session through NVIDIA's own Python bindings (nvidia-ml-py), as an operator's
script would run it on GPU 0 of a node: enable MIG, GPU instances by profile (the driver
placing them) and with a placement, compute instances by profile and with a placement,
their placements and capacities, listing, destruction, disabling, and each documented
error on the way. Every answer is checked against nvml.h's (and, for ids and placements,
the driver's) and the script prints `ok N checks`, or the first mismatch and exits 1.

Run against gpushare's simulated driver: PYNVML_LIB names the library, GPUSHARE_SIM_NODE
the node (`a100-40gb:1` or `h100-80gb:1`). Never run this on a GPU you do not own.
"""

import ctypes
import os
import sys

import pynvml as nv

checks = 0


def expect(what, got, wanted):
    global checks
    checks += 1
    if got != wanted:
        print("MISMATCH %s: got %r, wanted %r" % (what, got, wanted))
        sys.exit(1)


def code_of(fn, *args):
    """The NVML return code of a call: 0 when it succeeded."""
    try:
        fn(*args)
        return 0
    except nv.NVMLError as e:
        return e.value


def main():
    nv.nvmlLib = ctypes.CDLL(os.environ["PYNVML_LIB"])
    nv.nvmlInit()
    d = nv.nvmlDeviceGetHandleByIndex(0)
    name = nv.nvmlDeviceGetName(d)
    ampere = "A100" in name

    expect("MIG mode at first", nv.nvmlDeviceGetMigMode(d), [0, 0])
    expect("a GPU instance with MIG off", code_of(nv.nvmlDeviceCreateGpuInstance, d, 9),
           nv.NVML_ERROR_NOT_SUPPORTED)
    if ampere:
        # With persistence mode on, the A100's change waits for a reset.
        nv.nvmlDeviceSetPersistenceMode(d, 0)
    expect("enabling MIG", nv.nvmlDeviceSetMigMode(d, nv.NVML_DEVICE_MIG_ENABLE), nv.NVML_SUCCESS)
    expect("MIG mode enabled", nv.nvmlDeviceGetMigMode(d), [1, 1])
    expect("MIG devices at most", nv.nvmlDeviceGetMaxMigDeviceCount(d), 7)

    # GPU instances: the 3g profile (enum 2, id 9).
    three = nv.nvmlDeviceGetGpuInstanceProfileInfo(d, nv.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    expect("3g profile id", three.id, 9)
    expect("3g engines", (three.copyEngineCount, three.decoderCount),
           (3, 2) if ampere else (3, 3))
    first = nv.nvmlDeviceCreateGpuInstance(d, 9)
    info = nv.nvmlGpuInstanceGetInfo(first)
    # The driver places a first 3g at slot 4: GPU instance 2.
    expect("driver's placement", (info.id, info.placement.start, info.placement.size), (2, 4, 4))
    # nvml.h takes the placement by pointer; nvidia-ml-py hands its argument on as given.
    placement = nv.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 2, 4
    expect("a 3g at slot 2", code_of(nv.nvmlDeviceCreateGpuInstanceWithPlacement, d, 9, ctypes.byref(placement)),
           nv.NVML_ERROR_INVALID_ARGUMENT)
    placement.start = 0
    second = nv.nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, ctypes.byref(placement))
    expect("a 3g at slot 0", nv.nvmlGpuInstanceGetInfo(second).id, 1)
    expect("a third 3g", code_of(nv.nvmlDeviceCreateGpuInstance, d, 9),
           nv.NVML_ERROR_INSUFFICIENT_RESOURCES)
    expect("a 1g on a full GPU", code_of(nv.nvmlDeviceCreateGpuInstance, d, 19),
           nv.NVML_ERROR_INSUFFICIENT_RESOURCES)
    expect("3g capacity left", nv.nvmlDeviceGetGpuInstanceRemainingCapacity(d, 9), 0)
    gis = (nv.c_nvmlGpuInstance_t * 2)()
    count = ctypes.c_uint(2)
    nv.nvmlDeviceGetGpuInstances(d, 9, gis, ctypes.byref(count))
    expect("3g instances listed", count.value, 2)
    expect("GPU instance 5", code_of(nv.nvmlDeviceGetGpuInstanceById, d, 5), nv.NVML_ERROR_NOT_FOUND)

    # Compute instances in GPU instance 1: three 1c, one 2c, one 3c placements.
    gi = nv.nvmlDeviceGetGpuInstanceById(d, 1)
    one_c = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, nv.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    expect("1c instances in a 3g", one_c.instanceCount, 3)
    places = (nv.c_nvmlComputeInstancePlacement_t * 8)()
    count = ctypes.c_uint(8)
    nv.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, one_c.id, places, ctypes.byref(count))
    expect("1c placements", [(p.start, p.size) for p in places[: count.value]],
           [(0, 1), (1, 1), (2, 1)])
    two_c = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, nv.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    count = ctypes.c_uint(8)
    nv.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, two_c.id, places, ctypes.byref(count))
    expect("2c placements", [(p.start, p.size) for p in places[: count.value]], [(0, 2)])
    expect("1c capacity", nv.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, one_c.id), 3)
    ci_place = nv.c_nvmlComputeInstancePlacement_t()
    ci_place.start, ci_place.size = 1, 1
    middle = nv.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, one_c.id, ctypes.byref(ci_place))
    expect("the 1c at slice 1 again",
           code_of(nv.nvmlGpuInstanceCreateComputeInstanceWithPlacement, gi, one_c.id, ctypes.byref(ci_place)),
           nv.NVML_ERROR_INSUFFICIENT_RESOURCES)
    ci_place.start = 5
    expect("a 1c at slice 5",
           code_of(nv.nvmlGpuInstanceCreateComputeInstanceWithPlacement, gi, one_c.id, ctypes.byref(ci_place)),
           nv.NVML_ERROR_INVALID_ARGUMENT)
    expect("a 2c over the 1c", code_of(nv.nvmlGpuInstanceCreateComputeInstance, gi, two_c.id),
           nv.NVML_ERROR_INSUFFICIENT_RESOURCES)
    low = nv.nvmlGpuInstanceCreateComputeInstance(gi, one_c.id)
    expect("the driver's 1c placement", nv.nvmlComputeInstanceGetInfo(low).placement.start, 0)
    expect("1c capacity now", nv.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, one_c.id), 1)
    cis = (nv.c_nvmlComputeInstance_t * 3)()
    count = ctypes.c_uint(3)
    nv.nvmlGpuInstanceGetComputeInstances(gi, one_c.id, cis, ctypes.byref(count))
    expect("1c instances listed", count.value, 2)
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(d, 0)
    expect("a MIG device", nv.nvmlDeviceIsMigDeviceHandle(mig).value, 1)
    expect("its memory", nv.nvmlDeviceGetMemoryInfo(mig).total, three.memorySizeMB << 20)

    # Destruction: in order, each refusal as nvml.h has it.
    expect("a GPU instance with compute instances", code_of(nv.nvmlGpuInstanceDestroy, gi),
           nv.NVML_ERROR_IN_USE)
    expect("disabling with GPU instances",
           code_of(nv.nvmlDeviceSetMigMode, d, nv.NVML_DEVICE_MIG_DISABLE), nv.NVML_ERROR_IN_USE)
    nv.nvmlComputeInstanceDestroy(middle)
    nv.nvmlComputeInstanceDestroy(low)
    nv.nvmlGpuInstanceDestroy(gi)
    nv.nvmlGpuInstanceDestroy(first)
    expect("instances left", nv.nvmlDeviceGetGpuInstanceRemainingCapacity(d, 9), 2)
    expect("disabling MIG", nv.nvmlDeviceSetMigMode(d, nv.NVML_DEVICE_MIG_DISABLE), nv.NVML_SUCCESS)
    expect("MIG mode disabled", nv.nvmlDeviceGetMigMode(d), [0, 0])
    # With MIG off every index is NOT_FOUND, as the real H100 answers
    # (tests/device/results/nvml-answers-h100-2026-12-06).
    expect("a MIG device with MIG off", code_of(nv.nvmlDeviceGetMigDeviceHandleByIndex, d, 0),
           nv.NVML_ERROR_NOT_FOUND)
    if ampere:
        nv.nvmlDeviceSetPersistenceMode(d, 1)
    nv.nvmlShutdown()
    print("ok %d checks on %s" % (checks, name))


if __name__ == "__main__":
    main()
