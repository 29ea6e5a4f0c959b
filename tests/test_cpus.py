"""The default thread count: physical cores only (one CPU per core with SMT), within the cgroup CPU quota (v2's
cpu.max, v1's cfs quota; the smallest on the way to the root), from fake /sys and /proc trees."""

import json
import subprocess
import sys

import pytest

from edgeinfer.cpus import cpu_quota, physical_cores, thread_plan


def fake_topology(root, cores, modern=True):
    """CPU i on core cores[i] (package 0, core_id the core), its SMT siblings listed in core_cpus_list (older
    kernels: thread_siblings_list only)."""
    for i, core in enumerate(cores):
        d = root / f"cpu{i}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text("0\n")
        (d / "core_id").write_text(f"{core}\n")
        siblings = ",".join(str(j) for j, c in enumerate(cores) if c == core)
        (d / "thread_siblings_list").write_text(siblings + "\n")
        if modern:
            (d / "core_cpus_list").write_text(siblings + "\n")
    return str(root)


def fake_cgroup(tmp_path, lines, files):
    """/proc/self/cgroup with `lines`, a cgroup tree with files {relative path: text}."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text("\n".join(lines) + "\n")
    root = tmp_path / "fs"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(proc), str(root)


def test_smt_siblings_count_once(tmp_path):
    sys_cpu = fake_topology(tmp_path / "cpu", [0, 0, 1, 1, 2, 2, 3, 3])  # 4 cores, 2 threads each
    assert physical_cores(list(range(8)), sys_cpu) == 4
    assert physical_cores([0, 1, 2], sys_cpu) == 2  # an affinity that holds both siblings of core 0
    plan = thread_plan(sys_cpu, str(tmp_path / "none"), str(tmp_path / "none"), cpus=list(range(8)))
    assert plan["threads"] == 4 and plan["why"] == "4 physical cores of 8 CPUs allowed; no CPU quota"


def test_an_arm_board_of_clusters_counts_every_core(tmp_path):
    """An RK3588-like board: core_id restarts at 0 in each cluster (4 + 2 + 2), no SMT: 8 cores, not 4."""
    sys_cpu = tmp_path / "cpu"
    for i, core in enumerate([0, 1, 2, 3, 0, 1, 0, 1]):
        d = sys_cpu / f"cpu{i}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text("0\n")
        (d / "core_id").write_text(f"{core}\n")
        (d / "core_cpus_list").write_text(f"{i}\n")
    assert physical_cores(list(range(8)), str(sys_cpu)) == 8
    old = fake_topology(tmp_path / "old", [0, 0, 1, 1], modern=False)  # thread_siblings_list alone
    assert physical_cores([0, 1, 2, 3], old) == 2


def test_an_unreadable_topology_counts_the_cpus(tmp_path):
    plan = thread_plan(str(tmp_path / "missing"), str(tmp_path / "none"), str(tmp_path / "none"), cpus=[0, 1, 2])
    assert plan["threads"] == 3 and plan["physical_cores"] is None and plan["why"].startswith("3 CPUs allowed")


@pytest.mark.parametrize("lines, files, want", [
    (["0::/app/web"], {"app/web/cpu.max": "150000 100000\n"}, 1.5),
    (["0::/app/web"], {"app/web/cpu.max": "max 100000\n", "app/cpu.max": "300000 100000\n"}, 3.0),  # a parent's
    (["0::/app/web"], {"app/web/cpu.max": "400000 100000\n", "app/cpu.max": "200000 100000\n"}, 2.0),  # the smallest
    (["0::/"], {"cpu.max": "max 100000\n"}, None),
    (["4:cpu,cpuacct:/docker/abc", "0::/"], {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
                                              "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}, 2.5),
    (["1:cpu:/"], {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    (["0::/x"], {"x/cpu.max": "garbage\n"}, None),
])
def test_the_cgroup_quota_v2_and_v1(tmp_path, lines, files, want):
    proc, root = fake_cgroup(tmp_path, lines, files)
    assert cpu_quota(proc, root) == want


def test_the_quota_caps_the_threads_at_its_whole_cpus(tmp_path):
    sys_cpu = fake_topology(tmp_path / "cpu", [0, 1, 2, 3, 4, 5, 6, 7])
    proc, root = fake_cgroup(tmp_path, ["0::/job"], {"job/cpu.max": "150000 100000\n"})
    plan = thread_plan(sys_cpu, proc, root, cpus=list(range(8)))
    assert plan["threads"] == 1 and plan["cpu_quota"] == 1.5
    assert plan["why"] == "8 physical cores of 8 CPUs allowed; a CPU quota of 1.5 CPUs"
    proc, root = fake_cgroup(tmp_path / "b", ["0::/job"], {"job/cpu.max": "50000 100000\n"})
    assert thread_plan(sys_cpu, proc, root, cpus=list(range(8)))["threads"] == 1  # never 0


def test_edgeinfer_system_says_why():
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "system", "--json"], capture_output=True, text=True,
                       timeout=120)
    info = json.loads(r.stdout)
    assert info["threads"] >= 1 and "CPUs allowed" in info["threads_why"]
