#!/usr/bin/env python3
"""Records, read-only, what an NVML library answers to the calls of the agent's health
watcher (issue 42): the event API (supported types, a set, registration on each GPU, a
wait that times out, and a wait's CPU cost), pending row remaps and their histogram,
retired pages, ECC mode and counters, and the GPU recovery-action field. Changes nothing
on the GPU: no fault is raised, no reset run.

    NVML_LIB=/path/libnvidia-ml.so.1 python3 tests/device/health_answers.py > answers.json

NVML_LIB defaults to libnvidia-ml.so.1. The same script runs on the simulated library
(GPUSHARE_SIM_NODE set), so the two outputs compare key by key. Each answer is
{"ret": code, ...fields}; a function the library does not export is {"absent": true}.
"""

import ctypes
import json
import os
import resource
import time

lib = ctypes.CDLL(os.environ.get("NVML_LIB", "libnvidia-ml.so.1"))
u32 = ctypes.c_uint
u64 = ctypes.c_ulonglong
P = ctypes.POINTER

XID, SBE, DBE = 8, 1, 2
UNAVAILABLE, RECOVERY = 0x4000, 0x8000


def fn(name):
    try:
        f = getattr(lib, name)
    except AttributeError:
        return None
    f.restype = ctypes.c_int
    return f


class EventData(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("eventType", u64), ("eventData", u64),
                ("gpuInstanceId", u32), ("computeInstanceId", u32)]


class FieldValue(ctypes.Structure):
    _fields_ = [("fieldId", u32), ("scopeId", u32), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int),
                ("nvmlReturn", ctypes.c_int), ("value", u64)]


class Histogram(ctypes.Structure):
    _fields_ = [(n, u32) for n in ("max", "high", "partial", "low", "none")]


def call(name, *args):
    f = fn(name)
    if f is None:
        return None
    return f(*args)


def absent():
    return {"absent": True}


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def gpu_answers(index, dev):
    out = {}
    types = u64(0)
    r = call("nvmlDeviceGetSupportedEventTypes", dev, ctypes.byref(types))
    out["supported_event_types"] = absent() if r is None else {"ret": r, "mask": types.value}

    corr, unc, pend, fail = u32(), u32(), u32(), u32()
    r = call("nvmlDeviceGetRemappedRows", dev, ctypes.byref(corr), ctypes.byref(unc),
             ctypes.byref(pend), ctypes.byref(fail))
    out["remapped_rows"] = absent() if r is None else {
        "ret": r, "corr": corr.value, "unc": unc.value, "pending": pend.value,
        "failure": fail.value}
    h = Histogram()
    r = call("nvmlDeviceGetRowRemapperHistogram", dev, ctypes.byref(h))
    out["row_remapper_histogram"] = absent() if r is None else {
        "ret": r, **{n: getattr(h, n) for n, _ in Histogram._fields_}}

    for cause, label in ((0, "retired_pages_sbe"), (1, "retired_pages_dbe")):
        count = u32(0)
        r = call("nvmlDeviceGetRetiredPages", dev, cause, ctypes.byref(count), None)
        out[label] = absent() if r is None else {"ret": r, "count": count.value}
    pending = ctypes.c_int(0)
    r = call("nvmlDeviceGetRetiredPagesPendingStatus", dev, ctypes.byref(pending))
    out["retired_pages_pending"] = absent() if r is None else {"ret": r, "pending": pending.value}

    cur, pend_mode = ctypes.c_int(), ctypes.c_int()
    r = call("nvmlDeviceGetEccMode", dev, ctypes.byref(cur), ctypes.byref(pend_mode))
    out["ecc_mode"] = absent() if r is None else {"ret": r, "current": cur.value,
                                                  "pending": pend_mode.value}
    for etype, ename in ((0, "corrected"), (1, "uncorrected")):
        for ctype, cname in ((0, "volatile"), (1, "aggregate")):
            v = u64(0)
            r = call("nvmlDeviceGetTotalEccErrors", dev, etype, ctype, ctypes.byref(v))
            out[f"ecc_{ename}_{cname}"] = absent() if r is None else {"ret": r, "count": v.value}

    fields = (FieldValue * 3)()
    for i, fid in enumerate((230, 142, 143)):  # recovery action, remapped correctable/uncorrectable
        fields[i].fieldId = fid
    r = call("nvmlDeviceGetFieldValues", dev, 3, fields)
    out["field_values"] = absent() if r is None else {"ret": r, "fields": [
        {"fieldId": f.fieldId, "nvmlReturn": f.nvmlReturn, "valueType": f.valueType,
         "value": f.value} for f in fields]}

    mode, pmode = u32(), u32()
    r = call("nvmlDeviceGetMigMode", dev, ctypes.byref(mode), ctypes.byref(pmode))
    out["mig_mode"] = absent() if r is None else {"ret": r, "current": mode.value}
    if r == 0 and mode.value == 1:
        mig = ctypes.c_void_p()
        r = call("nvmlDeviceGetMigDeviceHandleByIndex", dev, 0, ctypes.byref(mig))
        out["mig_handle_0"] = {"ret": r}
        if r == 0:
            t = u64(0)
            out["mig_supported_event_types"] = {
                "ret": call("nvmlDeviceGetSupportedEventTypes", mig, ctypes.byref(t)),
                "mask": t.value}
    return out


def events(handles):
    out = {}
    es = ctypes.c_void_p()
    r = call("nvmlEventSetCreate", ctypes.byref(es))
    out["event_set_create"] = absent() if r is None else {"ret": r}
    if r != 0:
        return out
    regs = {}
    for index, dev in handles:
        regs[str(index)] = {
            "xid_dbe_sbe": call("nvmlDeviceRegisterEvents", dev, u64(XID | DBE | SBE), es),
            "unavailable_recovery": call("nvmlDeviceRegisterEvents", dev,
                                         u64(UNAVAILABLE | RECOVERY), es),
            "unknown_bit": call("nvmlDeviceRegisterEvents", dev, u64(1 << 40), es),
        }
    out["register"] = regs
    data = EventData()
    for label, timeout in (("wait_0ms", 0), ("wait_100ms", 100)):
        t = time.monotonic()
        r = call("nvmlEventSetWait_v2", es, ctypes.byref(data), timeout)
        out[label] = {"ret": r, "elapsed_ms": round((time.monotonic() - t) * 1000, 1)}
    r = call("nvmlEventSetWait", es, ctypes.byref(data), 100)
    out["wait_v1_100ms"] = absent() if r is None else {"ret": r}
    # A watcher's cost: ten one-second waits, their CPU time.
    c, t = cpu_seconds(), time.monotonic()
    rets = [call("nvmlEventSetWait_v2", es, ctypes.byref(data), 1000) for _ in range(10)]
    out["ten_1s_waits"] = {"rets": sorted(set(rets)), "wall_s": round(time.monotonic() - t, 3),
                           "cpu_s": round(cpu_seconds() - c, 4)}
    out["event_set_free"] = {"ret": call("nvmlEventSetFree", es)}
    out["wait_after_free"] = "not called (a freed set is a dangling pointer on the real driver)"
    out["null_set_create"] = {"ret": call("nvmlEventSetCreate", None)}
    return out


def main():
    result = {}
    result["init"] = lib.nvmlInit_v2()
    count = u32()
    lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    handles = []
    name = ctypes.create_string_buffer(96)
    for i in range(count.value):
        dev = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(dev)) == 0:
            handles.append((i, dev))
    if handles:
        lib.nvmlDeviceGetName(handles[0][1], name, 96)
    result["gpu0_name"] = name.value.decode()
    result["gpus"] = {str(i): gpu_answers(i, d) for i, d in handles}
    # The poll's cost: the whole per-GPU set of reads, 100 times on GPU 0.
    if handles:
        t = time.monotonic()
        for _ in range(100):
            gpu_answers(0, handles[0][1])
        result["poll_gpu0_100x_ms"] = round((time.monotonic() - t) * 1000, 1)
    result["events"] = events(handles)
    result["shutdown"] = lib.nvmlShutdown()
    print(json.dumps(result, indent=1, sort_keys=True))


main()
