"""How many threads the kernels get when nobody says: the physical cores this process may run on, within its
container's CPU quota.

Two threads on the SMT siblings of one core share its vector units: for the matmuls, which keep them busy,
that is slower than one thread (and a thread more to wait for at every parallel region), so only one CPU of
each core counts. A container's CPU quota (cgroup v2's `cpu.max`, v1's `cpu.cfs_quota_us` /
`cpu.cfs_period_us`) caps the CPU time the process gets whatever CPUs it sees: more threads than the quota
are throttled in turn, each parallel region waiting for the slowest, so the default is the quota's whole
CPUs (at least one). The smallest quota on the path from the process's cgroup to the root applies, as the
kernel enforces it. Where the topology or the cgroup files cannot be read (another OS, a restricted /sys),
the CPUs the process may run on count as they are. `edgeinfer system` shows what was found and why.
"""

from __future__ import annotations

import functools
import math
import os

SYS_CPU = "/sys/devices/system/cpu"
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity; every CPU where the OS has no affinity call)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def physical_cores(cpus: list[int], sys_cpu: str = SYS_CPU) -> int | None:
    """How many distinct cores the CPUs are on: distinct sets of SMT siblings (topology/core_cpus_list, older
    kernels' thread_siblings_list; not package and core id, which restart in each cluster of an ARM board); None
    where the topology cannot be read."""
    cores = set()
    for c in cpus:
        siblings = _read(f"{sys_cpu}/cpu{c}/topology/core_cpus_list") or \
            _read(f"{sys_cpu}/cpu{c}/topology/thread_siblings_list")
        if not siblings:
            return None
        cores.add(siblings)
    return len(cores) or None


def _v2_quota(path: str) -> float | None:
    # cgroup v2's cpu.max: "QUOTA PERIOD" or "max PERIOD"
    text = _read(path)
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(folder: str) -> float | None:
    # cgroup v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us
    try:
        quota, period = int(_read(f"{folder}/cpu.cfs_quota_us") or -1), int(_read(f"{folder}/cpu.cfs_period_us") or 0)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _ancestors(path: str) -> list[str]:
    # a cgroup path and every folder above it: /a/b -> ["/a/b", "/a", "/"]
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def cpu_quota(proc_cgroup: str = PROC_CGROUP, root: str = CGROUP_ROOT) -> float | None:
    """The CPUs' worth of time the process's cgroups allow (the smallest on the way to the root), v2 or v1;
    None where there is no quota or it cannot be read."""
    text = _read(proc_cgroup) or ""
    found = []
    for line in text.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if controllers == "":  # v2's unified hierarchy: "0::/path"
            found += [q for p in _ancestors(path) if (q := _v2_quota(f"{root}{p.rstrip('/')}/cpu.max")) is not None]
        elif "cpu" in controllers.split(","):
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                found += [q for p in _ancestors(path) if (q := _v1_quota(f"{root}/{mount}{p.rstrip('/')}")) is not None]
    return min(found) if found else None


def thread_plan(sys_cpu: str = SYS_CPU, proc_cgroup: str = PROC_CGROUP, root: str = CGROUP_ROOT,
                cpus: list[int] | None = None) -> dict:
    """The default thread count and what it came from: {"threads", "allowed_cpus", "physical_cores",
    "cpu_quota", "why"}."""
    cpus = allowed_cpus() if cpus is None else cpus
    cores = physical_cores(cpus, sys_cpu)
    quota = cpu_quota(proc_cgroup, root)
    n = cores or len(cpus)
    why = [f"{cores} physical cores of {len(cpus)} CPUs allowed" if cores else f"{len(cpus)} CPUs allowed"]
    if quota is not None:
        cap = max(1, math.floor(quota + 1e-9))
        why.append(f"a CPU quota of {quota:g} CPUs")
        n = min(n, cap)
    else:
        why.append("no CPU quota")
    return {"threads": max(1, n), "allowed_cpus": len(cpus), "physical_cores": cores, "cpu_quota": quota,
            "why": "; ".join(why)}


@functools.lru_cache(maxsize=1)
def default_threads() -> int:
    """thread_plan()'s thread count, read once per process."""
    return thread_plan()["threads"]
