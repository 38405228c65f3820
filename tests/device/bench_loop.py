"""A PyTorch loop shaped like the published jobs, as a bench replica.

  python3 bench_loop.py small|big units            under gpushare-ctl bench (units by line)
  python3 bench_loop.py small|big metrics          under bench --histogram step_latency_seconds
  python3 bench_loop.py small|big hand READY GO S  under hand_bench.py (no gpushare)

`small` is the batch job: a 256x256 fp32 matmul and a synchronize per step. `big` is the
stress job: an 8192x8192 fp16 matmul and a synchronize per step. Each step is one unit.
"""
import os
import sys
import time

import torch

shape, mode = sys.argv[1], sys.argv[2]
n, dtype = (256, torch.float32) if shape == "small" else (8192, torch.float16)
a = torch.randn(n, n, device="cuda", dtype=dtype)
b = torch.randn(n, n, device="cuda", dtype=dtype)


def step():
    a @ b
    torch.cuda.synchronize()


def reporting_loop(report, seconds=None):
    """Steps, each followed by its latency in ms as a line on `report`, the lines batched
    and flushed every 10 ms (reporting costs no step of its own); for `seconds`, or for
    ever. Returns the steps per second."""
    steps, start = 0, time.perf_counter()
    flushed = start
    while True:
        t = time.perf_counter()
        step()
        e = time.perf_counter()
        report.write(f"{(e - t) * 1000:.4f}\n")
        if e - flushed > 0.01:
            report.flush()
            flushed = e
        steps += 1
        if seconds is not None and e - start >= seconds:
            return steps / (e - start)


for _ in range(20):  # warm-up: kernels chosen, clocks up
    step()

if mode == "units":
    reporting_loop(os.fdopen(int(os.environ["GPUSHARE_BENCH_REPORT"]), "w", buffering=1 << 16))
elif mode == "metrics":
    from prometheus_client import Histogram, start_http_server

    buckets = [x / 1e6 for x in (25, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 51200)]
    h = Histogram("step_latency_seconds", "one matmul step", buckets=buckets)
    start_http_server(int(os.environ["GPUSHARE_BENCH_METRICS_PORT"]), addr="127.0.0.1")
    while True:
        t = time.perf_counter()
        step()
        h.observe(time.perf_counter() - t)
elif mode == "hand":
    ready, go, seconds = sys.argv[3], sys.argv[4], float(sys.argv[5])
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.0005)
    # The same loop as `units`, its lines going to /dev/null: only the measuring differs.
    rate = reporting_loop(open(os.devnull, "w", buffering=1 << 16), seconds)
    print(f"{rate:.3f}", flush=True)
