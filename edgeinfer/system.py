"""What this machine offers the kernels: `edgeinfer system`, and the `system` field of bench results."""

from __future__ import annotations

import os
import platform

ISA_FEATURES = ("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avxvnni",
                "amx-int8", "neon", "dotprod", "i8mm")


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's name from /proc/cpuinfo: x86's "model name"; on ARM boards, whose cpuinfo has none, the
    board's "Model" (Raspberry Pi) or "Hardware" line."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip(), value.strip())
    for key in ("model name", "Model", "Hardware"):
        if key in fields:
            return fields[key]
    return platform.processor() or platform.machine()


def threading_layer() -> str:
    """Numba's threading layer, which is only known once a parallel kernel has run."""
    import numba

    try:
        return numba.threading_layer()
    except ValueError:
        from .kernels.cpu import ops

        ops.warm_threads()
        return numba.threading_layer()


def system_info() -> dict:
    """The CPU, its ISA features, the kernel path (EDGEINFER_KERNELS or the best the CPU runs), threads."""
    import numba

    from .cpus import thread_plan
    from .kernels.cpu import simd

    feats = simd.host_features()
    path = simd.choose_path()
    return {
        "cpu": cpu_name(),
        "machine": platform.machine(),
        "isa_features": [f for f in ISA_FEATURES if f in feats],
        "kernel_path": path,
        "small_kernel_path": simd.small_path(path),  # matmuls of at most small_tokens tokens
        "small_tokens": simd.SMALL_TOKENS,
        "small_tokens_k_quants": simd.SMALL_TOKENS_KX8,  # Q4_K, Q5_K, Q6_K's matmuls (not Q2_K, Q3_K)
        "kernel_paths_available": simd.native_paths(),
        "threads": (plan := thread_plan())["threads"],
        "threads_why": plan["why"],
        "numba_threads": numba.config.NUMBA_NUM_THREADS,
        "threading_layer": threading_layer(),
        "numba": numba.__version__,
        "forced_by_env": os.environ.get("EDGEINFER_KERNELS") or None,
        **cache_places(),
    }


def cache_places() -> dict:
    """The ISA tier the kernels are compiled for and every cache's place and size."""
    from . import registry
    from .kernels.cpu import cache
    from .models.layout_cache import layouts_dir

    places = {"kernels": cache.root(), "layouts": layouts_dir(), "models": str(registry.models_dir())}
    sizes = {name: cache.dir_size(p)[0] for name, p in places.items()}
    return {"kernel_tier": cache.tier().name, "kernel_folder": cache.folder(), "caches": places,
            "cache_bytes": sizes}


def path_label(info: dict) -> str:
    """The kernel path for a report: "avx512", or "avx512 (avx2 for 1-2 tokens, Q4_K-Q6_K 1-4)"."""
    small = info.get("small_kernel_path", info["kernel_path"])
    if small == info["kernel_path"]:
        return info["kernel_path"]
    kq = info.get("small_tokens_k_quants", info["small_tokens"])
    few = f"1-{info['small_tokens']} tokens" + (f", Q4_K-Q6_K 1-{kq}" if kq != info["small_tokens"] else "")
    return f"{info['kernel_path']} ({small} for {few})"


def format_system(info: dict) -> str:
    rows = [("CPU", info["cpu"]), ("machine", info["machine"]),
            ("ISA features", " ".join(info["isa_features"]) or "none of note"),
            ("kernel path", info["kernel_path"] + (" (forced by EDGEINFER_KERNELS)" if info["forced_by_env"] else "")),
            (f"kernels for 1-{info['small_tokens']} tokens (Q4_K-Q6_K 1-{info['small_tokens_k_quants']})",
             info["small_kernel_path"] + ("" if info["small_kernel_path"] == info["kernel_path"]
                                                                   else " (forced by EDGEINFER_SMALL_KERNELS)" if os.environ.get("EDGEINFER_SMALL_KERNELS")
                                                                   else " (faster on this CPU)")),
            ("paths this CPU runs", ", ".join(info["kernel_paths_available"])),
            ("threads", f"{info['threads']}: {info.get('threads_why', '')} (numba's pool: {info['numba_threads']})"),
            ("numba threading layer", info["threading_layer"]), ("numba", info["numba"]),
            ("kernel ISA tier", info["kernel_tier"])]
    rows += [(f"{name} cache", f"{path} ({info['cache_bytes'][name] / 1e6:.1f} MB)")
             for name, path in info["caches"].items()]
    return "\n".join(f"{k:<22} {v}" for k, v in rows)
