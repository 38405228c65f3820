"""A launch-bound PyTorch replica for issue 27's acceptance: a small MLP (4 Linear layers of
256 with ReLU, fp32) at batch 1, eager, on CUDA; each forward followed by a synchronize is
one unit (about a dozen tiny kernels: the time is the CPU's launching them, not the GPU's).
Reports each unit's latency in ms as a line on the descriptor in `GPUSHARE_BENCH_REPORT`,
the lines batched and flushed every 10 ms, as README's "Benchmarking your workload" shows;
so it runs the same under `gpushare-ctl bench` and under hand_bench.py (which passes a
pipe the same way: `hand_bench.py ... -- python3 torch_launch_replica.py`).

  python3 torch_launch_replica.py [--device cuda|cpu] [--width 256] [--layers 4] [--seconds S]

Writes its CPU affinity and replica index to stderr once at the start (kept in gpushare's
replica logs), so a run shows where it was pinned. `--seconds` stops after S seconds
(default: runs until stopped); `--device cpu` lets it run on a machine without a GPU.
"""
import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda")
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--seconds", type=float, default=None)
opts = parser.parse_args()

fd = os.environ.get("GPUSHARE_BENCH_REPORT")
if fd is None:
    sys.exit("torch_launch_replica.py: GPUSHARE_BENCH_REPORT is not set (run it under "
             "gpushare-ctl bench or hand_bench.py)")
report = os.fdopen(int(fd), "w", buffering=1 << 16)

import torch  # noqa: E402 - after the cheap checks

torch.set_num_threads(1)
cpus = sorted(os.sched_getaffinity(0))
print(f"replica {os.environ.get('GPUSHARE_BENCH_REPLICA', '?')} of {os.environ.get('GPUSHARE_BENCH_REPLICAS', '?')}"
      f" ({os.environ.get('GPUSHARE_BENCH_STRATEGY', '?')}): CPUs {cpus}, pid {os.getpid()}",
      file=sys.stderr, flush=True)

layers = []
for _ in range(opts.layers):
    layers += [torch.nn.Linear(opts.width, opts.width), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers).to(opts.device).eval()
x = torch.randn(1, opts.width, device=opts.device)
sync = torch.cuda.synchronize if opts.device.startswith("cuda") else (lambda: None)


@torch.inference_mode()
def forward():
    model(x)
    sync()


for _ in range(50):  # warm-up: kernels chosen, clocks up
    forward()

start = flushed = time.perf_counter()
while True:
    t = time.perf_counter()
    forward()
    e = time.perf_counter()
    report.write(f"{(e - t) * 1000:.4f}\n")
    if e - flushed > 0.01:
        report.flush()
        flushed = e
    if opts.seconds is not None and e - start >= opts.seconds:
        report.flush()
        break
