"""Copies of a bench replica in `units` mode, run as gpushare-ctl bench runs replicas (each in
a process group of its own, its lines into a pipe of its own, `GPUSHARE_BENCH_REPLICA`,
`GPUSHARE_BENCH_REPLICAS` and `GPUSHARE_BENCH_STRATEGY` set), with their lines counted by
one reader thread; each copy optionally pinned to a CPU set of its own, as the agent pins
replicas (issue 27). Shared by hand_bench.py's `window` method and interleaved rounds, and
solo_drift.py.

The replica is bench_loop.py (`LOOP SHAPE units`: the "256² loop" with SHAPE small) unless
a COMMAND is given: any program that writes one line per unit on the descriptor named in
`GPUSHARE_BENCH_REPORT`, as README's "Benchmarking your workload" says.

`pin_sets(cpus, max_replicas)` divides a CPU list exactly as the agent's
`agent/src/bench/pinning.rs` `plan` does.
"""
import os
import selectors
import signal
import subprocess
import sys
import threading
import time

LOOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_loop.py")


def parse_cpus(text):
    """A Linux CPU list (`0-3,8,10-11`, spaces and a final newline allowed) as a sorted
    list of CPU numbers."""
    cpus = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        first, last = int(first), int(last or first)
        if first > last:
            raise ValueError(f"cpus `{text.strip()}`: `{part}` runs backwards")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpus(cpus):
    """The canonical CPU list of `cpus`, as the agent writes it (`0-3,8,10-11`; two in a
    row are a range too)."""
    cpus, out, i = sorted(set(cpus)), [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def _siblings(cpu, sys_root="/"):
    path = os.path.join(sys_root, f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        return parse_cpus(open(path).read())
    except (OSError, ValueError):
        return None


def cores(cpus, sys_root="/"):
    """`cpus` grouped by core (sysfs thread_siblings_list): each core's CPUs of `cpus` in
    increasing order, cores in the order of their lowest CPU; a CPU sysfs says nothing of
    is a core of its own (the agent's `Topology::cores`)."""
    wanted, placed, out = sorted(set(cpus)), set(), []
    for cpu in wanted:
        if cpu in placed:
            continue
        core = {c for c in (_siblings(cpu, sys_root) or []) if c in wanted and c not in placed}
        core.add(cpu)
        placed |= core
        out.append(sorted(core))
    return out


def pin_sets(cpus, max_replicas, sys_root="/"):
    """Copy i's CPUs for copies of a bench whose largest run has `max_replicas`: k =
    len(cpus) // max_replicas each, taken in plan order (siblings next to each other; with
    k = 1 one thread of every core first), replica i places i*k..(i+1)*k. The agent's
    `pinning::plan`; a ValueError where there are fewer CPUs than replicas."""
    cpus = sorted(set(cpus))
    if max_replicas < 1:
        raise ValueError("no replicas to pin")
    if max_replicas > len(cpus):
        raise ValueError(f"{max_replicas} replicas need {max_replicas} CPUs to pin one each; "
                         f"CPUs {format_cpus(cpus)} are {len(cpus)}")
    k = len(cpus) // max_replicas
    grouped = cores(cpus, sys_root)
    if k == 1:
        deepest = max(len(c) for c in grouped)
        order = [c[t] for t in range(deepest) for c in grouped if t < len(c)]
    else:
        order = [cpu for core in grouped for cpu in core]
    return [order[i * k:(i + 1) * k] for i in range(max_replicas)]


def gpu_node_cpus(own=None):
    """This process's CPUs (or `own`), narrowed to GPU 0's NUMA node where the host has
    more than one node (the agent's default when --cpus is not given), and where they come
    from."""
    own = sorted(own if own is not None else os.sched_getaffinity(0))
    try:
        nodes = parse_cpus(open("/sys/devices/system/node/online").read())
    except OSError:
        nodes = []
    if len(nodes) <= 1:
        return own, "the agent's CPUs"
    try:
        bus = subprocess.check_output(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader",
                                       "-i", "0"], text=True).strip()
        domain, rest = bus.split(":", 1)
        path = f"/sys/bus/pci/devices/{int(domain, 16):04x}:{rest.lower()}"
        local = parse_cpus(open(f"{path}/local_cpulist").read())
        node = open(f"{path}/numa_node").read().strip()
    except (OSError, ValueError, subprocess.CalledProcessError):
        return own, "the agent's CPUs (the GPU's NUMA node is unknown)"
    mine = [c for c in own if c in local]
    if not mine:
        return own, "the agent's CPUs (none on the GPU's node)"
    return mine, f"NUMA node {node} of the GPU"


class Copies:
    """n copies of `bench_loop.py SHAPE units` (or of `command`, a list); `counts[i]` is the
    lines copy i reported. `cpu_sets[i]`, where given, is copy i's CPU affinity (set on
    this thread before its fork, so the copy and all it starts inherit it; this thread's
    own is put back after); `strategy` goes into `GPUSHARE_BENCH_STRATEGY`."""

    def __init__(self, n, shape, env, command=None, cpu_sets=None, strategy=None):
        self.procs, pipes = [], {}
        argv = list(command) if command else [sys.executable, LOOP, shape, "units"]
        own = os.sched_getaffinity(0) if cpu_sets else None
        try:
            for i in range(n):
                read_end, write_end = os.pipe()
                extra = {"GPUSHARE_BENCH_REPORT": str(write_end), "GPUSHARE_BENCH_REPLICA": str(i),
                         "GPUSHARE_BENCH_REPLICAS": str(n)}
                if strategy:
                    extra["GPUSHARE_BENCH_STRATEGY"] = strategy
                if cpu_sets:
                    os.sched_setaffinity(0, cpu_sets[i])
                self.procs.append(subprocess.Popen(
                    argv, env=dict(env, **extra), pass_fds=(write_end,),
                    stdout=subprocess.DEVNULL, start_new_session=True))
                os.close(write_end)
                pipes[read_end] = i
        finally:
            if own is not None:
                os.sched_setaffinity(0, own)
        self.counts, self._done = [0] * n, threading.Event()
        self._pipes = pipes
        self._reader = threading.Thread(target=self._drain)
        self._reader.start()

    def _drain(self):
        """Counts the lines on every pipe until each is closed or the copies are stopped."""
        sel = selectors.DefaultSelector()
        for fd, i in self._pipes.items():
            sel.register(fd, selectors.EVENT_READ, i)
        while sel.get_map() and not self._done.is_set():
            for key, _ in sel.select(timeout=0.05):
                data = os.read(key.fd, 256 << 10)
                if data:
                    self.counts[key.data] += data.count(b"\n")
                else:
                    sel.unregister(key.fd)

    def affinities(self):
        """Each copy's CPU affinity as the kernel has it now (`Cpus_allowed_list`)."""
        out = []
        for p in self.procs:
            try:
                out.append(format_cpus(os.sched_getaffinity(p.pid)))
            except OSError:
                out.append(None)
        return out

    def wait_working(self, limit=120):
        """Until every copy has reported a unit (or `limit` seconds passed, or a copy
        exited); whether every copy did."""
        deadline = time.time() + limit
        while not all(self.counts) and time.time() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.01)
        return all(self.counts)

    def stop(self):
        """As the agent stops replicas: SIGTERM to each group, SIGKILL 5 s later."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self._done.set()
        self._reader.join()
        for fd in self._pipes:
            os.close(fd)
