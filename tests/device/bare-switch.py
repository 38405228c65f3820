#!/usr/bin/env python3
"""The bare strategy switch a gpushare switch is compared with: `nvidia-cuda-mps-control -d`
plus the two limit commands (set_default_active_thread_percentage,
set_default_device_pinned_mem_limit), five times, each daemon quit and gone before the
next. Prints the times and their median. Starts daemons in its own pipe directory under
WORKDIR and stops each one.   bare-switch.py WORKDIR
"""
import os
import statistics
import subprocess
import sys
import time

work = sys.argv[1]
env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=f"{work}/bare/pipe", CUDA_MPS_LOG_DIRECTORY=f"{work}/bare/log")
os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"], exist_ok=True)
os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"], exist_ok=True)
ms = []
for i in range(5):
    t = time.perf_counter()
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    for c in (f"set_default_active_thread_percentage {31 + i}", "set_default_device_pinned_mem_limit 0 20G"):
        subprocess.run(["nvidia-cuda-mps-control"], input=c + "\n", text=True, env=env, check=True, capture_output=True)
    ms.append((time.perf_counter() - t) * 1000)
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, capture_output=True)
    # Zombies (an init that does not reap, in some containers) are not daemons left running.
    while subprocess.run("ps -eo stat=,args= | grep -v '^Z' | grep -q '[n]vidia-cuda-mps'", shell=True).returncode == 0:
        time.sleep(0.02)
print("bare -d + 2 limit commands ms:", " ".join(f"{m:.1f}" for m in ms), "median", f"{statistics.median(ms):.1f}")
