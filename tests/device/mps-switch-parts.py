#!/usr/bin/env python3
"""The parts of an MPS strategy switch on a real host, each timed on its own (issue 12's
switch target): nvidia-smi's time-slice read, the control daemon's start, one control
command, and several commands in one control invocation, with what the daemon answers to
such a batch (good values, a refused value, an unknown command).

Read-only for the GPU: it starts MPS control daemons in its own pipe directory (no client
ever connects) and stops each one before it ends. Usage: mps-switch-parts.py WORKDIR
"""
import os
import statistics
import subprocess
import sys
import time

work = sys.argv[1]
pipe, log = f"{work}/parts/pipe", f"{work}/parts/log"
os.makedirs(pipe, exist_ok=True)
os.makedirs(log, exist_ok=True)
env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=log)
pid_file = f"{pipe}/nvidia-cuda-mps-control.pid"


def timed(argv, stdin=None, **kw):
    t = time.perf_counter()
    done = subprocess.run(argv, input=stdin, text=True, capture_output=True, env=env, **kw)
    return (time.perf_counter() - t) * 1000, done


def report(name, ms):
    print(f"{name}: " + " ".join(f"{m:.1f}" for m in ms) + f"  median {statistics.median(ms):.1f} ms")


def daemon_running():
    ps = subprocess.run(["ps", "-eo", "stat=,args="], text=True, capture_output=True).stdout
    return any("nvidia-cuda-mps" in l and not l.startswith("Z") for l in ps.splitlines())


def quit_daemon():
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, capture_output=True)
    while daemon_running():
        time.sleep(0.01)
    if os.path.exists(pid_file):
        os.unlink(pid_file)


report("nvidia-smi compute-policy -l", [timed(["nvidia-smi", "compute-policy", "-l"])[0] for _ in range(5)])
report("nvidia-smi -L", [timed(["nvidia-smi", "-L"])[0] for _ in range(3)])

starts, pid_after, cmd_ms, batch_ms = [], [], [], []
for i in range(5):
    ms, done = timed(["nvidia-cuda-mps-control", "-d"])
    assert done.returncode == 0, done
    had_pid = os.path.exists(pid_file)
    t = time.perf_counter()
    while not os.path.exists(pid_file):
        time.sleep(0.0005)
    starts.append(ms)
    pid_after.append((time.perf_counter() - t) * 1000 if not had_pid else 0.0)
    for _ in range(3):
        cmd_ms.append(timed(["nvidia-cuda-mps-control"], "get_default_active_thread_percentage\n")[0])
    batch = (
        f"set_default_active_thread_percentage {31 + i}\n"
        "set_default_device_pinned_mem_limit 0 20G\n"
        "get_default_active_thread_percentage\n"
        "get_default_device_pinned_mem_limit 0\n"
    )
    ms, done = timed(["nvidia-cuda-mps-control"], batch)
    batch_ms.append(ms)
    if i == 0:
        print(f"batch of 2 sets + 2 gets: rc {done.returncode} stdout {done.stdout!r} stderr {done.stderr!r}")
        for name, text in [
            ("refused thread value", "set_default_active_thread_percentage 150\nget_default_active_thread_percentage\n"),
            ("unknown command in the middle", "get_default_active_thread_percentage\nno_such_command\nget_default_device_pinned_mem_limit 0\n"),
            ("set only", "set_default_active_thread_percentage 40\n"),
            ("set then get, no trailing newline", "set_default_active_thread_percentage 41\nget_default_active_thread_percentage"),
            ("memory in M below a GiB", "set_default_device_pinned_mem_limit 0 700M\nget_default_device_pinned_mem_limit 0\n"),
            ("no memory limit yet on a fresh device index", "get_default_device_pinned_mem_limit 1\n"),
        ]:
            _, d = timed(["nvidia-cuda-mps-control"], text)
            print(f"{name}: rc {d.returncode} stdout {d.stdout!r} stderr {d.stderr!r}")
    quit_daemon()

report("control -d (returns)", starts)
print("pid file after -d returned (0.0 = already there): " + " ".join(f"{m:.2f}" for m in pid_after))
report("one control command", cmd_ms)
report("one invocation, 2 sets + 2 gets", batch_ms)

# Fresh daemon, commands right after -d returns without waiting for the pid file.
ms, done = timed(["nvidia-cuda-mps-control", "-d"])
_, d = timed(["nvidia-cuda-mps-control"], "get_default_active_thread_percentage\n")
print(f"command right after -d: rc {d.returncode} stdout {d.stdout!r} stderr {d.stderr!r}")
quit_daemon()
print("daemon left" if daemon_running() else "no daemon left")
