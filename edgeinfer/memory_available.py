"""How much memory this process may still take, for sizing a context when nobody says (memory.context_for_memory):
the machine's available memory (/proc/meminfo's MemAvailable: free memory and the page cache the kernel can
drop), within the container's memory limit where it has one (cgroup v2's memory.max less memory.current, v1's
memory.limit_in_bytes less memory.usage_in_bytes; the tightest on the path from the process's cgroup to the
root). Elsewhere the free physical pages (os.sysconf), or None where nothing can be read.
"""

from __future__ import annotations

import os

from .cpus import CGROUP_ROOT, PROC_CGROUP, _ancestors, _read

MEMINFO = "/proc/meminfo"


def _meminfo_available(path: str) -> int | None:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * 1024  # kB
    return None


def _stat(path: str, name: str) -> int:
    # a field of a cgroup's memory.stat ("name value" lines), 0 where absent
    for line in (_read(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _left(folder: str, limit: str, usage: str, stat: str) -> int | None:
    # a cgroup's limit less its usage, or None where it has no limit ("max", or v1's near-2**63 "unlimited").
    # Its usage counts the page cache its files filled (a model read, a pull); the inactive part of it is
    # reclaimed before the limit bites, so it does not count (as kubelet's working set leaves it out)
    lim, use = _read(f"{folder}/{limit}"), _read(f"{folder}/{usage}")
    if lim is None or use is None or not lim.isdigit() or not use.isdigit() or int(lim) >= 2**60:
        return None
    return max(int(lim) - max(int(use) - _stat(f"{folder}/memory.stat", stat), 0), 0)


def cgroup_left(proc_cgroup: str = PROC_CGROUP, root: str = CGROUP_ROOT) -> int | None:
    """The bytes the process's cgroups still allow it (the tightest on the way to the root), v2 or v1; None
    where there is no limit or it cannot be read."""
    found = []
    for line in (_read(proc_cgroup) or "").splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if controllers == "":  # v2's unified hierarchy: "0::/path"
            found += [b for p in _ancestors(path) if (b := _left(f"{root}{p.rstrip('/')}", "memory.max",
                                                                 "memory.current", "inactive_file")) is not None]
        elif "memory" in controllers.split(","):
            found += [b for p in _ancestors(path)
                      if (b := _left(f"{root}/memory{p.rstrip('/')}", "memory.limit_in_bytes",
                                     "memory.usage_in_bytes", "total_inactive_file")) is not None]
    return min(found) if found else None


def available_memory(meminfo: str = MEMINFO, proc_cgroup: str = PROC_CGROUP, root: str = CGROUP_ROOT) -> int | None:
    """The bytes this process may still take (see the module's text), or None where that cannot be read."""
    machine = _meminfo_available(meminfo)
    if machine is None:
        try:
            machine = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            machine = None
    left = cgroup_left(proc_cgroup, root)
    known = [b for b in (machine, left) if b is not None]
    return min(known) if known else None
