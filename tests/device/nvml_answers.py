#!/usr/bin/env python3
"""Records, read-only, what an NVML library answers to the calls where the simulator was
seen to differ from the real driver (issue 38): every nvmlErrorString text, the
addressing mode, the GPU fabric info (all three forms), nvmlDeviceGetAttributes on a
whole GPU, the MIG-device lookups with MIG off, and the argument checks of the v1 entry
points nvml.h still exports. Changes nothing on the GPU.

    NVML_LIB=/path/libnvidia-ml.so.1 python3 tests/device/nvml_answers.py > answers.json

NVML_LIB defaults to libnvidia-ml.so.1 (the real driver's). The same script runs on the
simulated library (with GPUSHARE_SIM_NODE set), so the two outputs compare key by key;
sim/nvml's `recorded_answers` test reads the real one. Each answer is
{"ret": code, ...fields}; a function the library does not export is {"absent": true}.
Only GPU 0 is asked: its name is recorded so a reader knows which model answered.
"""

import ctypes
import json
import os
import sys

lib = ctypes.CDLL(os.environ.get("NVML_LIB", "libnvidia-ml.so.1"))
u32 = ctypes.c_uint
P = ctypes.POINTER


def fn(name):
    """The exported function, or None when the library has no such symbol."""
    try:
        f = getattr(lib, name)
    except AttributeError:
        return None
    f.restype = ctypes.c_int
    return f


def version(struct, ver):
    """NVML_STRUCT_VERSION: the struct's size with the version in the top byte."""
    return ctypes.sizeof(struct) | (ver << 24)


class Attributes(ctypes.Structure):
    _fields_ = [(n, u32) for n in (
        "multiprocessorCount", "sharedCopyEngineCount", "sharedDecoderCount",
        "sharedEncoderCount", "sharedJpegCount", "sharedOfaCount",
        "gpuInstanceSliceCount", "computeInstanceSliceCount")] + [("memorySizeMB", ctypes.c_ulonglong)]


class FabricV1(ctypes.Structure):
    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
                ("cliqueId", u32), ("state", ctypes.c_ubyte)]


class FabricV2(ctypes.Structure):
    _fields_ = [("version", u32), ("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
                ("cliqueId", u32), ("state", ctypes.c_ubyte), ("healthMask", u32)]


class FabricV3(ctypes.Structure):
    _fields_ = FabricV2._fields_ + [("healthSummary", ctypes.c_ubyte)]


class AddressingMode(ctypes.Structure):
    _fields_ = [("version", u32), ("value", u32)]


class Placement(ctypes.Structure):
    _fields_ = [("start", u32), ("size", u32)]


class CiInfoV1(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("gpuInstance", ctypes.c_void_p), ("id", u32),
                ("profileId", u32)]


class CiInfoV2(ctypes.Structure):
    _fields_ = CiInfoV1._fields_ + [("placement", Placement)]


class GiInfo(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("id", u32), ("profileId", u32), ("placement", Placement)]


def fields(s, skip=()):
    out = {}
    for name, _ in s._fields_:
        if name in skip:
            continue
        v = getattr(s, name)
        out[name] = list(v) if isinstance(v, ctypes.Array) else v
    return out


def call(name, *args):
    f = fn(name)
    if f is None:
        return None
    return f(*args)


answers = {}


def record(key, name, *args, out=None, skip=()):
    r = call(name, *args)
    if r is None:
        answers[key] = {"absent": True}
        return
    a = {"ret": r}
    if out is not None and r == 0:
        a.update(fields(out, skip))
    answers[key] = a


es = fn("nvmlErrorString")
es.restype = ctypes.c_char_p
answers["nvmlErrorString"] = {str(c): es(c).decode() for c in list(range(0, 41)) + [999, 1000]}

rc = lib.nvmlInit_v2()
if rc != 0:
    sys.exit(f"nvmlInit_v2 failed: {rc}")
dev = ctypes.c_void_p()
rc = lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev))
if rc != 0:
    sys.exit(f"nvmlDeviceGetHandleByIndex_v2(0) failed: {rc}")
name = ctypes.create_string_buffer(96)
lib.nvmlDeviceGetName(dev, name, 96)
mig_cur, mig_pend = u32(), u32()
answers["gpu0"] = {"name": name.value.decode(),
                   "migMode": [lib.nvmlDeviceGetMigMode(dev, ctypes.byref(mig_cur), ctypes.byref(mig_pend)),
                               mig_cur.value, mig_pend.value]}

# Addressing mode: the right version, a wrong one, and a null pointer.
m = AddressingMode(version=version(AddressingMode, 1))
record("nvmlDeviceGetAddressingMode", "nvmlDeviceGetAddressingMode", dev, ctypes.byref(m), out=m)
m = AddressingMode(version=version(AddressingMode, 2))
record("nvmlDeviceGetAddressingMode/version2", "nvmlDeviceGetAddressingMode", dev, ctypes.byref(m))
record("nvmlDeviceGetAddressingMode/null", "nvmlDeviceGetAddressingMode", dev, None)

# Fabric info: the deprecated unversioned call, then V with v2, v3 and a bad version.
f1 = FabricV1()
record("nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfo", dev, ctypes.byref(f1), out=f1)
record("nvmlDeviceGetGpuFabricInfo/null", "nvmlDeviceGetGpuFabricInfo", dev, None)
f2 = FabricV2(version=version(FabricV2, 2))
record("nvmlDeviceGetGpuFabricInfoV/v2", "nvmlDeviceGetGpuFabricInfoV", dev, ctypes.byref(f2), out=f2)
f3 = FabricV3(version=version(FabricV3, 3))
record("nvmlDeviceGetGpuFabricInfoV/v3", "nvmlDeviceGetGpuFabricInfoV", dev, ctypes.byref(f3), out=f3)
fb = FabricV3(version=version(FabricV3, 9))
record("nvmlDeviceGetGpuFabricInfoV/version9", "nvmlDeviceGetGpuFabricInfoV", dev, ctypes.byref(fb))
record("nvmlDeviceGetGpuFabricInfoV/null", "nvmlDeviceGetGpuFabricInfoV", dev, None)

# Attributes of a whole GPU (nvml.h: MIG device handles only).
at = Attributes()
record("nvmlDeviceGetAttributes_v2", "nvmlDeviceGetAttributes_v2", dev, ctypes.byref(at), out=at)
at = Attributes()
record("nvmlDeviceGetAttributes", "nvmlDeviceGetAttributes", dev, ctypes.byref(at), out=at)
record("nvmlDeviceGetAttributes_v2/null", "nvmlDeviceGetAttributes_v2", dev, None)

# MIG-device lookups with MIG off (the recording host never has MIG on: checked below).
mig = ctypes.c_void_p()
for i in (0, 1, 99):
    record(f"nvmlDeviceGetMigDeviceHandleByIndex/{i}", "nvmlDeviceGetMigDeviceHandleByIndex", dev, i,
           ctypes.byref(mig))
record("nvmlDeviceGetMigDeviceHandleByIndex/null", "nvmlDeviceGetMigDeviceHandleByIndex", dev, 0, None)
n = u32()
record("nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMaxMigDeviceCount", dev, ctypes.byref(n))
answers["nvmlDeviceGetMaxMigDeviceCount"]["count"] = n.value
is_mig = u32(7)
record("nvmlDeviceIsMigDeviceHandle", "nvmlDeviceIsMigDeviceHandle", dev, ctypes.byref(is_mig))
answers["nvmlDeviceIsMigDeviceHandle"]["isMig"] = is_mig.value
parent = ctypes.c_void_p()
record("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", dev,
       ctypes.byref(parent))
gi = u32()
record("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetGpuInstanceId", dev, ctypes.byref(gi))
record("nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetComputeInstanceId", dev, ctypes.byref(gi))

# The v1 entry points beside their _v2 (MIG off; profile id 0 is the H100's 7g.80gb, 99 none).
for fname in ("nvmlDeviceGetGpuInstancePossiblePlacements", "nvmlDeviceGetGpuInstancePossiblePlacements_v2"):
    cnt = u32(0)
    record(f"{fname}/count", fname, dev, 0, None, ctypes.byref(cnt))
    answers[f"{fname}/count"]["count"] = cnt.value
    record(f"{fname}/nullcount", fname, dev, 0, None, None)
    buf = (Placement * 8)()
    cnt = u32(8)
    record(f"{fname}/buffer", fname, dev, 0, buf, ctypes.byref(cnt))
    if answers[f"{fname}/buffer"].get("ret") == 0:
        answers[f"{fname}/buffer"]["count"] = cnt.value
        answers[f"{fname}/buffer"]["placements"] = [[p.start, p.size] for p in buf[: min(cnt.value, 8)]]
    cnt = u32(0)
    record(f"{fname}/badprofile", fname, dev, 99, None, ctypes.byref(cnt))
    record(f"{fname}/nulldevice", fname, None, 0, None, ctypes.byref(cnt))

for fname, info in (("nvmlComputeInstanceGetInfo", CiInfoV1), ("nvmlComputeInstanceGetInfo_v2", CiInfoV2)):
    i = info()
    record(f"{fname}/nullhandle", fname, None, ctypes.byref(i))
    record(f"{fname}/nullboth", fname, None, None)
i = GiInfo()
record("nvmlGpuInstanceGetInfo/nullhandle", "nvmlGpuInstanceGetInfo", None, ctypes.byref(i))

lib.nvmlShutdown()
json.dump(answers, sys.stdout, indent=1, sort_keys=True)
print()
