"""How much CPU *other* processes used while a measurement ran.

On a small shared machine another job's burst can halve a benchmark's speed, and `uptime`'s
load average does not show it reliably (tasks blocked on I/O count towards it). So every
baseline script reports, per run:

    others_cores = (machine busy CPU-seconds - CPU-seconds of this process and its
                    waited-for children) / wall seconds

0.0 means the machine was ours; 1.0 means another job held one full core throughout. Child
processes must have been joined before stop() for their CPU time to count as ours. Needs
Linux's /proc/stat; elsewhere the machine-wide figures are None.
"""

import os
import resource
import time


def _proc_stat():
    """(busy, steal) CPU-seconds summed over all CPUs, or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    values = [int(v) for v in fields[1:]] + [0] * 10
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def _own_cpu_seconds():
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _loadavg():
    try:
        return " ".join(str(round(x, 2)) for x in os.getloadavg())
    except OSError:
        return "?"


class LoadMeter:
    """start() (done on creation) ... stop() -> a dict of the interval's CPU use."""

    def __init__(self):
        self.start()

    def start(self):
        self.t0 = time.perf_counter()
        self.stat0 = _proc_stat()
        self.own0 = _own_cpu_seconds()
        self.load0 = _loadavg()
        return self

    def stop(self):
        wall = time.perf_counter() - self.t0
        stat1 = _proc_stat()
        own = _own_cpu_seconds() - self.own0
        record = {"wall_s": round(wall, 3), "ncpu": os.cpu_count(),
                  "own_cores": round(own / wall, 3) if wall > 0 else None,
                  "others_cores": None, "steal_cores": None,
                  "loadavg_start": self.load0, "loadavg_end": _loadavg()}
        if self.stat0 and stat1 and wall > 0:
            busy = stat1[0] - self.stat0[0]
            record["others_cores"] = round(max(0.0, busy - own) / wall, 3)
            record["steal_cores"] = round((stat1[1] - self.stat0[1]) / wall, 3)
        return record


def cores(value):
    """A core count for printing ('?' where it could not be measured)."""
    return "?" if value is None else f"{value:.2f}"


def load_line(record):
    """One line saying how the machine was shared during the interval."""
    return (f"load: others used {cores(record['others_cores'])} of {record['ncpu']} cores, "
            f"we used {cores(record['own_cores'])}, steal {cores(record['steal_cores'])}; "
            f"loadavg start [{record['loadavg_start']}] end [{record['loadavg_end']}] "
            f"over {record['wall_s']:.1f} s")
