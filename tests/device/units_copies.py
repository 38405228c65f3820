"""Copies of bench_loop.py in `units` mode, run as gpushare-ctl bench runs replicas (each in
a process group of its own, its lines into a pipe of its own), with their lines counted
by one reader thread. Shared by hand_bench.py's `window` method and solo_drift.py."""
import os
import selectors
import signal
import subprocess
import sys
import threading
import time

LOOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_loop.py")


class Copies:
    """n copies of `bench_loop.py SHAPE units`; `counts[i]` is the lines copy i reported."""

    def __init__(self, n, shape, env):
        self.procs, pipes = [], {}
        for i in range(n):
            read_end, write_end = os.pipe()
            self.procs.append(subprocess.Popen(
                [sys.executable, LOOP, shape, "units"],
                env=dict(env, GPUSHARE_BENCH_REPORT=str(write_end)), pass_fds=(write_end,),
                stdout=subprocess.DEVNULL, start_new_session=True))
            os.close(write_end)
            pipes[read_end] = i
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

    def wait_working(self, limit=120):
        """Until every copy has reported a unit (or `limit` seconds passed)."""
        deadline = time.time() + limit
        while not all(self.counts) and time.time() < deadline:
            time.sleep(0.01)

    def stop(self):
        """As the agent stops replicas: SIGTERM to each group, SIGKILL 5 s later."""
        for p in self.procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self._done.set()
        self._reader.join()
        for fd in self._pipes:
            os.close(fd)
