"""The simulated GPUs' PCI facts, for the fake /sys/bus/pci of tests/nvidia/gfd-by-hand.sh
and tests/nvidia/mig-parted-by-hand.sh.

    python3 sim_pci.py LIBNVIDIA_ML [persistence-off]

Prints one line per GPU: index, NVML busId, pciDeviceId (device << 16 | vendor),
pciSubSystemId, as nvmlDeviceGetPciInfo_v3 answers them. With `persistence-off`, turns
persistence mode off on every GPU through nvmlDeviceSetPersistenceMode instead.
"""
import ctypes
import sys


class PciInfo(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


def ok(r, what):
    if r != 0:
        sys.exit("sim_pci: %s returned %d" % (what, r))


lib = ctypes.CDLL(sys.argv[1])
ok(lib.nvmlInit_v2(), "nvmlInit_v2")
n = ctypes.c_uint()
ok(lib.nvmlDeviceGetCount_v2(ctypes.byref(n)), "nvmlDeviceGetCount_v2")
persistence_off = len(sys.argv) > 2 and sys.argv[2] == "persistence-off"
for i in range(n.value):
    h = ctypes.c_void_p()
    ok(lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)), "nvmlDeviceGetHandleByIndex_v2")
    if persistence_off:
        ok(lib.nvmlDeviceSetPersistenceMode(h, 0), "nvmlDeviceSetPersistenceMode")
        continue
    p = PciInfo()
    ok(lib.nvmlDeviceGetPciInfo_v3(h, ctypes.byref(p)), "nvmlDeviceGetPciInfo_v3")
    print(i, p.busId.decode(), p.pciDeviceId, p.pciSubSystemId)
if persistence_off:
    print("persistence mode off on %d GPU(s) through nvmlDeviceSetPersistenceMode" % n.value)
lib.nvmlShutdown()
