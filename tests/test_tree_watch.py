"""`ProcessTreeWatch` between walks: a settled tree is read from its members' /proc/PID/stat lines alone
(the TUI's poll of a ready server), with the figures psutil gives, and a member that ends makes it walk.

Real processes: a parent that spins on the CPU and a child that sleeps."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from sessions.probes import ProcessTreeWatch

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"])
print(child.pid, flush=True)
while True:  # spin: CPU time to measure; the killed child stays a zombie (never waited for)
    pass
"""


def test_a_settled_tree_reads_stat_lines_between_walks_and_walks_when_a_member_ends():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        got = {parent.stdout.readline().strip(), parent.stdout.readline().strip()}  # the child's "up" too
        child_pid = int(next(x for x in got if x != "up"))
        root = psutil.Process(parent.pid)
        watch = ProcessTreeWatch(parent.pid, root.create_time(), rescan_after_s=3600)
        first = watch.read(full_scan=True)
        assert [p.pid for p in first] == [parent.pid, child_pid] and watch.walks == 1
        spent = root.cpu_times()
        while sum(root.cpu_times()[:2]) - sum(spent[:2]) < 0.05:  # the parent spends CPU time (an event)
            psutil.Process(parent.pid).status()
        second = watch.read()
        third = watch.read()
        assert watch.walks == 1  # settled: no walk of /proc, the members' stat lines only
        child = psutil.Process(child_pid)
        for info in (second, third):
            assert [p.pid for p in info] == [parent.pid, child_pid]
            assert info[1].ppid == parent.pid and info[1].status == child.status() == psutil.STATUS_SLEEPING
            rss = child.memory_info().rss  # (the kernel syncs its per-CPU RSS counters lazily: a few pages)
            assert info[1].rss_bytes is not None and abs(info[1].rss_bytes - rss) <= rss // 50
            assert info[1].num_threads == child.num_threads()
            assert info[1].title == first[1].title and info[1].create_time == first[1].create_time
        assert second[0].cpu_percent is not None and third[0].cpu_percent is not None
        assert second[0].cpu_percent > 0  # it spun between the walk's reading and this one

        child.send_signal(signal.SIGKILL)
        while child.status() != psutil.STATUS_ZOMBIE:  # the parent never reaps it
            time.sleep(0.01)
        after = watch.read()
        assert watch.walks == 2  # a member changed: the tree is walked again
        assert [p.pid for p in after] == [parent.pid]
    finally:
        parent.kill()
        parent.wait()
