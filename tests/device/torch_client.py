"""A PyTorch client of issue 29's device run: allocates GIB GiB on cuda:0 in one tensor,
prints one JSON line of what it holds (its pid, uid, torch's allocated and reserved bytes,
and the device's free and total memory as CUDA reports them to it), touches READY (when
set) and sleeps HOLD seconds (default 30), or until killed.

  python3 torch_client.py GIB
"""
import json
import os
import sys
import time

import torch

gib = float(sys.argv[1])
x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(json.dumps({
    "pid": os.getpid(), "uid": os.getuid(), "asked_bytes": int(gib * (1 << 30)),
    "allocated_bytes": torch.cuda.memory_allocated(), "reserved_bytes": torch.cuda.memory_reserved(),
    "device_free_bytes": free, "device_total_bytes": total,
    "mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
}), flush=True)
if os.environ.get("READY"):
    open(os.environ["READY"], "w").close()
time.sleep(float(os.environ.get("HOLD", "30")))
