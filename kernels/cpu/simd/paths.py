"""The choice of instruction-set path, and the `isa` tag that carries it (and the matrix kinds a
compiled function handles) in its type. See the package docstring."""

from __future__ import annotations

import os
import platform

import numpy as np

from ... import kinds as _kinds

X86_PATHS = ("avx2", "vnni", "avx512")
VNNI_PATHS = ("vnni", "avx512")  # vpdpbusd: on ymm, or on zmm where a kernel family has a 512-bit form (simd/vec.py)
ARM_PATHS = ("neon", "dotprod", "i8mm")  # aarch64 (see simd/neon.py)
PATHS = ("portable",) + X86_PATHS + ARM_PATHS


ALL_KINDS = _kinds.QUANTIZED  # the quantized matrix kinds (kinds.py: row-major and interleaved)


def host_features() -> set[str]:
    """The host CPU's features in LLVM's names. On aarch64 Linux the kernel's hardware capabilities
    (AT_HWCAP, AT_HWCAP2 in /proc/self/auxv) add `neon`, `dotprod` and `i8mm`: they are what the
    kernel lets user code execute, and they are right under qemu-user too, where /proc/cpuinfo (which
    LLVM reads) may describe the machine qemu runs on."""
    import llvmlite.binding as llvm

    try:
        llvm.initialize_native_target()
    except RuntimeError:
        pass
    feats = {name for name, on in llvm.get_host_cpu_features().items() if on}
    if platform.machine() in ("aarch64", "arm64"):
        feats |= arm_hwcaps()
    return feats


# AT_HWCAP / AT_HWCAP2 bits of arm64 Linux (arch/arm64/include/uapi/asm/hwcap.h)
_AT_HWCAP, _AT_HWCAP2 = 16, 26
_HWCAP = {"neon": (_AT_HWCAP, 1 << 1), "dotprod": (_AT_HWCAP, 1 << 20), "i8mm": (_AT_HWCAP2, 1 << 13)}


def arm_hwcaps(auxv: bytes | None = None) -> set[str]:
    """`neon` (ASIMD), `dotprod` (ASIMDDP) and `i8mm` from an aarch64 Linux process's auxiliary vector
    (pairs of native-endian uint64: type, value); empty where it cannot be read."""
    if auxv is None:
        try:
            with open("/proc/self/auxv", "rb") as f:
                auxv = f.read()
        except OSError:
            return set()
    words = np.frombuffer(auxv[: len(auxv) // 16 * 16], np.uint64).reshape(-1, 2)
    caps = {int(t): int(v) for t, v in words}
    return {name for name, (at, bit) in _HWCAP.items() if caps.get(at, 0) & bit}


# Set to 1 (the test suite does), an AVX2 machine also lists the x86 paths it lacks (vnni, avx512): their
# kernels compile with the instructions past AVX2 written in AVX2's (simd/vec.py's _call), so the tests run
# every x86 path's arithmetic on any x86 machine. Never chosen unless forced (EDGEINFER_KERNELS).
EMULATE_ENV = "EDGEINFER_EMULATE_PATHS"


def available_paths() -> list[str]:
    """The paths this CPU can execute, slowest first; with EMULATE_ENV=1 on an AVX2 machine, then the x86
    paths it runs only emulated."""
    paths = native_paths()
    if os.environ.get(EMULATE_ENV, "") == "1" and "avx2" in paths:
        paths += [p for p in X86_PATHS if p not in paths]
    return paths


def native_paths() -> list[str]:
    """The paths this CPU executes in its own instructions, slowest first."""
    f = host_features()
    paths = ["portable"]
    if "avx2" in f and "fma" in f and "f16c" in f:
        paths.append("avx2")
        if "avxvnni" in f or ("avx512vnni" in f and "avx512vl" in f):
            paths.append("vnni")
            if {"avx512f", "avx512bw", "avx512vl", "avx512vnni"} <= f:  # 512-bit registers (Ice Lake, Zen 4 and later)
                paths.append("avx512")
    if "neon" in f:  # aarch64's Advanced SIMD, in every ARMv8-A core
        paths.append("neon")
        if "dotprod" in f:  # sdot/udot: ARMv8.2 (Cortex-A55/A76, Raspberry Pi 5, Apple M1, Graviton 2)
            paths.append("dotprod")
            if "i8mm" in f:  # smmla: ARMv8.6 (Cortex-A510/A710/X2, Apple M2, Graviton 3)
                paths.append("i8mm")
    return paths


def choose_path() -> str:
    forced = os.environ.get("EDGEINFER_KERNELS", "").strip().lower()
    if forced:
        have = available_paths()
        if forced not in PATHS:
            raise ValueError(f"EDGEINFER_KERNELS must be one of {', '.join(PATHS)}, got {forced!r}")
        if forced not in have:
            raise ValueError(f"EDGEINFER_KERNELS={forced}: this CPU cannot run that path (it can run {', '.join(have)})")
        return forced
    return native_paths()[-1]


# Matmuls of at most SMALL_TOKENS tokens (a decode step, two streams) may run another path's kernels than
# the batches: every path computes the same bits from the same interleaved weights, so a token's result
# does not change with the kernels its batch size picks. Measured (decode_ceiling.py, Qwen2.5-Coder 1.5B,
# 2 threads) on AMD Zen 4, which executes a 512-bit operation as two 256-bit halves: one token's matmuls
# took 30-40% longer in the avx512 kernels than in the avx2 ones (Q4_K_M 43.7 against 31.4 ms), while from
# 4 tokens on the avx512 kernels are the faster (IQ4_XS, 8 tokens: 59 against 103 ms). The K-quants'
# interleaved kernels (kx8: Q4_K, Q5_K, Q6_K) keep the small path to 4 tokens (SMALL_TOKENS_KX8): a 4-token
# pass of the 1.5B's matmuls (Q4_K_M) took 42.5-43.1 ms on avx2 against 48.8-49.5 on avx512, Gemma 3 270M's
# 11.0-11.9 against 13.5-15.2, while the legacy types' (SmolLM2's Q4_1, the 0.5B's Q5_0) were as fast or
# faster on avx512 (6.1-6.2 against 6.3-7.1 ms); at 8 tokens avx512 leads again (the 1.5B: 63.6 against
# 69.6-78.7 ms). A speculative verification of 3-4 tokens is where this counts.
SMALL_TOKENS = 2
SMALL_TOKENS_KX8 = 4
# per matrix kind (kinds.py's ids): at most how many tokens its matmul runs on the small path
SMALL_TOKENS_OF = tuple(SMALL_TOKENS_KX8 if k.family == "kx8" else SMALL_TOKENS for k in _kinds.KINDS)
SMALL_ENV = "EDGEINFER_SMALL_KERNELS"  # the path of the small matmuls' kernels, forced
_HALF_WIDTH_512 = {"znver4"}  # LLVM's names of the CPUs whose 512-bit units are two 256-bit halves


def host_cpu() -> str:
    """LLVM's name of the host CPU (znver4, sapphirerapids, neoverse-n1, ...)."""
    import llvmlite.binding as llvm

    try:
        llvm.initialize_native_target()
    except RuntimeError:
        pass
    return llvm.get_host_cpu_name()


def small_path(path: str, cpu: str | None = None) -> str:
    """The path whose kernels run the matmuls of a few tokens (SMALL_TOKENS_OF) when the batches run `path`'s:
    avx2 under avx512 on a CPU with half-width 512-bit units (cpu: LLVM's name, the host's by default),
    `path` itself elsewhere. SMALL_ENV forces it to `path` or a path before it in the same family (one whose
    instructions the process's ISA tier holds and whose layout is the same)."""
    forced = os.environ.get(SMALL_ENV, "").strip().lower()
    if forced:
        family = next((f for f in (X86_PATHS, ARM_PATHS) if path in f), (path,))
        allowed = family[: family.index(path) + 1]
        if forced not in allowed:
            raise ValueError(f"{SMALL_ENV}={forced}: under the {path} path it must be one of {', '.join(allowed)}")
        return forced
    if path == "avx512" and (cpu if cpu is not None else host_cpu()) in _HALF_WIDTH_512:
        return "avx2"
    return path


def isa_tag(path: str, kinds=None) -> np.ndarray:
    """The `isa` argument that selects `path` in the kernels, and the matrix kinds they must handle (None:
    every kind). Both live in the argument's type (an empty array of a record dtype whose field names
    say them), so a compiled function holds the code of that path and those kinds alone: a model's
    forward pass compiles the matmul kernels of its own weight types, not of all sixteen."""
    kinds = ALL_KINDS if kinds is None else tuple(sorted({int(k) for k in kinds}))
    if path not in PATHS or not kinds or not set(kinds) <= set(ALL_KINDS):
        raise ValueError(f"bad kernel tag: path {path!r}, kinds {kinds}")
    return np.empty(0, np.dtype([(path, np.uint8)] + [(f"k{k}", np.uint8) for k in kinds]))


def path_of(isa) -> str:
    """Inside an @overload: the path an `isa` argument's type names."""
    return next(iter(isa.dtype.fields))


def kinds_of(isa) -> frozenset:
    """Inside an @overload: the matrix kinds an `isa` argument's type names."""
    return frozenset(int(name[1:]) for name in isa.dtype.fields if name.startswith("k"))
