"""A PyTorch client for the MPS device scripts (mps-privilege.sh, mps-users.sh): reports
its uid, pid, start and context times, the SMs it sees and whether 4 and 12 GiB
allocations succeed, holds its context $HOLD seconds, then reports its end."""
import json, os, sys, time
t0 = time.time()
import torch
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
t_ctx = time.time()
props = torch.cuda.get_device_properties(0)
seen = {"who": sys.argv[1], "uid": os.getuid(), "pid": os.getpid(), "start": round(t0, 2),
        "context": round(t_ctx, 2), "sms": props.multi_processor_count}
for gib in (4, 12):
    try:
        y = torch.empty(gib << 30, dtype=torch.uint8, device="cuda"); y.fill_(1)
        torch.cuda.synchronize(); del y; torch.cuda.empty_cache()
        seen[f"alloc_{gib}gib"] = "ok"
    except Exception as e:
        seen[f"alloc_{gib}gib"] = type(e).__name__
print(json.dumps(seen), flush=True)
time.sleep(float(os.environ.get("HOLD", "0")))
print(json.dumps({"who": sys.argv[1], "end": round(time.time(), 2)}), flush=True)
