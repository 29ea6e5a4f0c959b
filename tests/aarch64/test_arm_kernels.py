"""The aarch64 kernel paths (neon, dotprod, i8mm): the host's features choose them, each matmul kernel on each
path against the same numpy reference and extremes as on x86 (tests/test_kernels.py's tests, collected here
again for this machine's paths), batched equal to single bit for bit, every path's bits equal to the
portable path's, and the instructions each path compiles to."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES

from edgeinfer.kernels import kinds
from edgeinfer.kernels.cpu import simd
from edgeinfer.kernels.cpu.layout import interleave8
from edgeinfer.quant.repack import repack
from test_kernels import (K_QUANTS, QUANT_TYPES, random_tensor, test_batched_rows_equal_single_token_bit_for_bit,  # noqa: F401
                          test_int8_matmul_at_the_extremes_of_its_ranges, test_int8_matmul_matches_integer_reference,
                          unit_table)

ARM = [p for p in simd.available_paths() if p in simd.ARM_PATHS]
# run.sh's qemu CPU (None on a real board)
QEMU_CPU = os.environ.get("EDGEINFER_QEMU_CPU", "max") if os.environ.get("EDGEINFER_AARCH64_EMULATED") else None
under_qemu_max = pytest.mark.skipif(QEMU_CPU != "max", reason="what qemu's -cpu max offers (run.sh's default)")


@under_qemu_max
def test_qemu_max_offers_every_aarch64_path():
    # run.sh's `-cpu max` has dotprod and i8mm: every path below is exercised, none silently absent
    assert simd.available_paths() == ["portable", "neon", "dotprod", "i8mm"]
    assert simd.choose_path() == "i8mm"


@under_qemu_max
@pytest.mark.parametrize("cpu, best", [("cortex-a72", "neon"), ("neoverse-n1", "dotprod")])
def test_a_lesser_core_gets_its_own_path(cpu, best):
    """A Raspberry Pi 4 (Cortex-A72: no dotprod) and a Neoverse N1 / Pi 5-class core (dotprod, no i8mm), as
    qemu emulates them: the kernel path and the ISA tier follow the features the kernel reports."""
    env = dict(os.environ, EDGEINFER_QEMU_CPU=cpu)
    env.pop("EDGEINFER_KERNELS", None)
    code = ("from edgeinfer.kernels.cpu import simd, cache; "
            "print(simd.choose_path(), cache.tier_for(simd.choose_path(), simd.host_features()).name)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    path, tier = out.stdout.split()
    assert path == best
    assert tier == {"neon": "armv8-a", "dotprod": "armv8.2-a-dotprod"}[best]


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_every_aarch64_path_gives_the_portable_bits(t):
    """The interleaved kernels on neon, dotprod and i8mm against their portable twin, for a decode step, a
    smmla pair, an odd batch (a pair and a lone token) and more than one tile: the same bits."""
    from edgeinfer.kernels.cpu.backend import QInput, matmul_int8

    rng = np.random.default_rng(36)
    n, k = 21, GGML_QUANT_SIZES[t][0] * (2 if t in K_QUANTS else 8)
    raw, _ = random_tensor(t, n, k, rng)
    w = interleave8(repack(raw, t, (k, n)))
    for tokens in (1, 2, 5, 35):
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        want = np.empty((tokens, n), np.float32)
        matmul_int8(w, QInput(x), want, unit_table("portable", w.kind))
        for path in ARM:
            got = np.empty((tokens, n), np.float32)
            matmul_int8(w, QInput(x), got, unit_table(path, w.kind))
            np.testing.assert_array_equal(got, want, err_msg=f"{path}, {tokens} tokens")


# -- what the kernels compile to --------------------------------------------------------------------

def unit_asm(path: str, family: str) -> str:
    """The assembly of a kernel unit (units.rows_unit: the family's kernels inlined into one function).
    A unit loaded from the kernel cache keeps its optimised LLVM module but no assembly (numba's
    inspect_asm returns a placeholder for cached code), so the module is emitted again with the same target
    machine: the instructions the object code holds."""
    from edgeinfer.kernels.cpu.units import ROWS_SIG, rows_unit

    unit_table(path, kinds.FAMILIES[family][0])  # compiled or loaded, as the kernels run
    u = rows_unit(path, family)
    lib = u.overloads[ROWS_SIG].library
    return str(lib._codegen._tm.emit_assembly(lib._get_module_for_linking()))


def blocks(asm: str) -> list[list[str]]:
    """The basic blocks of an assembly listing: lists of instruction lines (labels start new blocks)."""
    out, cur = [], []
    for line in asm.splitlines():
        s = line.split("//")[0].strip()
        if not s or s.startswith("."):
            if s.endswith(":") and cur:
                out.append(cur)
                cur = []
            continue
        if s.endswith(":"):
            if cur:
                out.append(cur)
            cur = []
            continue
        cur.append(s)
        if s.split()[0] in ("b", "ret") or s.split()[0].startswith(("b.", "cbz", "cbnz", "tbz", "tbnz")):
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


DOT = {"dotprod": r"sdot\s+v", "i8mm": r"smmla\s+v", "neon": r"smull2?\s+v\d+\.8h"}
# scalar work on the data inside a dot-product block: byte or half-word loads, scalar multiplies of bytes
SCALAR = r"^(ldrs?b|ldrs?h|sxtb|uxtb)\s|^(mul|madd|smaddl|smull)\s+w"


@pytest.mark.parametrize("family", ["x8", "kx8", "q8x8", "nlx8", "k23x8"])
@pytest.mark.parametrize("path", ARM)
def test_kernels_compile_to_the_dot_product_instructions(path, family):
    """Each interleaved family on each aarch64 path: its dot product instruction is there (sdot on dotprod;
    smmla for batches and sdot for one token on i8mm, where Q3_K/Q2_K's k23x8 runs dotprod's sdot kernel;
    smull/smlal with saddlp on neon), no other path's, and the blocks that do the dot products hold no
    scalar loads or multiplies of bytes."""
    asm = unit_asm(path, family)
    body = "\n".join(" ".join(b) for b in blocks(asm))
    dot = DOT["dotprod"] if (path, family) == ("i8mm", "k23x8") else DOT[path]
    assert re.search(dot, body), f"no {dot} in {path} {family}"
    if path == "i8mm":
        assert re.search(DOT["dotprod"], body)  # the one-token path
    if path == "neon":
        assert re.search(r"saddlp\s+v", body) and not re.search(r"sdot|smmla", body)
    if path == "dotprod":
        assert not re.search(r"smmla", body)
    hot = [b for b in blocks(asm) if any(re.search(dot, i) for i in b)]
    assert hot
    for b in hot:
        scalar = [i for i in b if re.search(SCALAR, i)]
        assert not scalar, f"{path} {family}: scalar work in a dot-product block: {scalar}"
