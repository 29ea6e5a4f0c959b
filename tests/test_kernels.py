"""CPU kernels against numpy references built on gguf.quants.dequantize."""

import platform
from unittest.mock import patch

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import njit

from edgeinfer.kernels import get_backend, kinds
from edgeinfer.kernels.cpu import attention, ops, simd
from edgeinfer.kernels.cpu.layout import INTERLEAVED, interleave8
from edgeinfer.quant import repack as repack_module
from edgeinfer.quant.repack import DIRECT_TYPES, KIND, repack, repack_interleaved

kb = get_backend("cpu")
QUANT_TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.Q3_K, T.Q2_K, T.MXFP4]
ALL_TYPES = [T.F16, T.BF16] + QUANT_TYPES
# Byte offsets of the float16 scale fields in each block, set to finite values in random blocks.
F16_FIELDS = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q4_K: (0, 2),
              T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_NL: (0,), T.Q3_K: (108,), T.Q2_K: (80, 82), T.MXFP4: ()}
# Byte offsets of E8M0 scales (a power of two 2^(e - 128)), set to those of small weights (2^-16 .. 2^-1)
E8M0_FIELDS = {T.MXFP4: (0,)}


def random_tensor(t, n, k, rng):
    """Raw GGUF bytes (n, row_bytes) of a random tensor of type t, and its float reference (n, k)."""
    if t == T.F16:
        raw = rng.standard_normal((n, k)).astype(np.float16).view(np.uint8)
    elif t == T.BF16:
        raw = (rng.standard_normal((n, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        block, size = GGML_QUANT_SIZES[t]
        raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
        for off in F16_FIELDS[t]:
            raw[:, :, off:off + 2] = (rng.standard_normal((n, k // block, 1)) * 0.05).astype(np.float16).view(np.uint8)
        for off in E8M0_FIELDS.get(t, ()):
            raw[:, :, off] = rng.integers(112, 128, (n, k // block), dtype=np.uint8)
        raw = raw.reshape(n, -1)
    ref = gguf.quants.dequantize(raw, t).reshape(n, k).astype(np.float32)
    return raw, ref


def shapes_for(t, rng):
    block = GGML_QUANT_SIZES[t][0]
    return [(int(rng.integers(1, 40)) | 1, block * int(rng.integers(1, 5))) for _ in range(3)]  # odd row counts


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_is_bit_exact_with_gguf(t):
    rng = np.random.default_rng(KIND[t])
    for n, k in shapes_for(t, rng):
        raw, ref = random_tensor(t, n, k, rng)
        w = repack(raw, t, (k, n))
        # exact: the kernels compute d * q (+ m) in float32 as gguf's reference does
        np.testing.assert_array_equal(kb.dequantize(w), ref)


K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q3_K, T.Q2_K)


def q8_reference(x, block):
    """numpy twin of the kernels' activation quantization: (int8 values, per-block scale) for 32-blocks
    (llama.cpp's Q8_0: d = max|x| / 127) or 256-blocks (Q8_K: the largest-magnitude value maps to -127)."""
    t, k = x.shape
    xb = x.reshape(t, k // block, block)
    if block == 32:
        d = np.abs(xb).max(axis=2) / np.float32(127)
        inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
        q = np.rint(xb * inv[:, :, None])
    else:
        vmax = np.take_along_axis(xb, np.abs(xb).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
        iscale = np.where(vmax != 0, np.float32(-127) / np.where(vmax != 0, vmax, 1), 0).astype(np.float32)
        q = np.minimum(127, np.rint(iscale[:, :, None] * xb))
        d = np.where(vmax != 0, np.float32(1) / np.where(iscale != 0, iscale, 1), 0).astype(np.float32)
    return q.astype(np.int8).reshape(t, k), d.astype(np.float32)


@pytest.mark.parametrize("block", [32, 256])
def test_activation_quantization_matches_numpy_twin(block):
    from edgeinfer.kernels.cpu.backend import QInput

    rng = np.random.default_rng(block)
    x = (rng.standard_normal((5, 512)) * rng.uniform(0.01, 100, (5, 1))).astype(np.float32)
    x[2, :256] = 0  # an all-zero block
    # ties in magnitude (Q8_K takes the first, with its sign): the negative first, 32-chunks apart; the
    # positive first, side by side; and a positive largest value whose negative twin rounds to +127
    m = np.abs(x[3]).max() * 2
    x[3, 40], x[3, 200], x[3, 300], x[3, 301] = -m, m, m, -m
    x[4, 10], x[4, 20] = m, -m
    qx = QInput(x)
    xq, xd, sums, *more = qx.q8() if block == 32 else qx.q8k()
    q, d = q8_reference(x, block)
    np.testing.assert_array_equal(xq.view(np.int8), q)
    np.testing.assert_array_equal(xd, d)
    # the sums the kernels fold offsets and mins through: d * sum(q) per 32 (Q8), or sum(q) per 32 and
    # per 16 (Q8_K)
    per32 = q.reshape(5, -1, 32).astype(np.int64).sum(axis=2)
    if block == 32:
        np.testing.assert_array_equal(sums, d * per32.astype(np.float32))
    else:
        np.testing.assert_array_equal(sums, per32)
        np.testing.assert_array_equal(more[0], q.reshape(5, -1, 16).astype(np.int64).sum(axis=2))


def int8_reference(ref, x, t):
    """float64 product of the dequantized weights with the dequantized int8 activation: the exact value
    of the integer arithmetic the kernels do, up to float32 rounding of the scales."""
    block = 256 if t in K_QUANTS else 32
    q, d = q8_reference(x, block)
    xd = (q.astype(np.float64).reshape(x.shape[0], -1, block) * d[:, :, None]).reshape(x.shape)
    return xd @ ref.T.astype(np.float64), d, block


def float_bound(k, a, b):
    # float32 accumulation over k terms in another order than float64: about k * eps32 * sum|a_i b_i|,
    # with a 4x margin
    return 4 * k * np.finfo(np.float32).eps * (np.abs(a) @ np.abs(b).T) + 1e-6


@pytest.mark.parametrize("path", simd.available_paths())
@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_int8_matmul_matches_integer_reference(t, path):
    """Every instruction-set path this CPU runs (the portable one always) computes the same integer sums."""
    from edgeinfer.kernels.cpu.backend import QInput, matmul_int8

    rng = np.random.default_rng(100 + KIND[t])
    for n, k in shapes_for(t, rng):
        raw, ref = random_tensor(t, n, k, rng)
        for w in layouts(repack(raw, t, (k, n)), path):
            for tokens in (1, 3, 17, 40):
                x = rng.standard_normal((tokens, k)).astype(np.float32)
                got = np.empty((tokens, n), np.float32)
                matmul_int8(w, QInput(x), got, unit_table(path, w.kind))
                want, d, block = int8_reference(ref, x, t)
                assert np.all(np.abs(got - want) <= float_bound(k, np.repeat(d, block, axis=1) * 127, ref))


@pytest.mark.parametrize("path", simd.available_paths())
@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_int8_matmul_at_the_extremes_of_its_ranges(t, path):
    """Every quant at its largest (all bits set: Q4 nibbles 15, Q5 31, Q6_K 63, K-quant scales and mins 63;
    IQ4_NL's index 15, its grid's largest value, 113, and index 0, its most negative, -127; MXFP4's index 15,
    -12, and 7, +12; Q3_K's 3 with
    scale 31 and, in half the rows, its -4 with scale -32; Q2_K's 3 with scale and min 15)
    against activations all at +127 or all at -127: the 16-bit partial sums the SIMD paths keep are at their
    fullest here, and must not wrap or saturate."""
    from edgeinfer.kernels.cpu.backend import QInput, matmul_int8

    block, size = GGML_QUANT_SIZES[t]
    n, k = 16, 2 * block if t in K_QUANTS else 8 * block
    raw = np.full((n, k // block, size), 0xFF, np.uint8)
    if t == T.Q6_K:
        raw[:, :, 192:208] = 0x80  # its int8 scales at their largest magnitude, -128
    for off in F16_FIELDS[t]:
        raw[:, :, off:off + 2] = np.array([0.01], np.float16).view(np.uint8)
    if t == T.MXFP4:  # a scale of 2^-8 (e 120) and half the rows at the grid's other end, +12
        raw[:, :, 0] = 120
        raw[n // 2:, :, 1:] = 0x77
    if t == T.IQ4_NL:
        raw[n // 2:, :, 2:] = 0  # half the rows at the grid's other end, -127
    if t == T.Q3_K:  # half the rows at -4 (no hmask bit, low bits 0) times the most negative scale, -32
        raw[n // 2:, :, 0:96] = 0
        raw[n // 2:, :, 96:108] = 0
    raw = raw.reshape(n, -1)
    ref = gguf.quants.dequantize(raw, t).reshape(n, k).astype(np.float32)
    for w in layouts(repack(raw, t, (k, n)), path):
        for sign, tokens in ((1, 1), (-1, 1), (1, 3), (-1, 3)):  # the one-token path and a tile
            x = np.full((tokens, k), sign, np.float32)
            got = np.empty((tokens, n), np.float32)
            matmul_int8(w, QInput(x), got, unit_table(path, w.kind))
            want, d, blk = int8_reference(ref, x, t)
            assert np.all(np.abs(got - want) <= float_bound(k, np.repeat(d, blk, axis=1) * 127, ref))


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_matches_dequantized_weights(t):
    """Against gguf's dequantize and the float activation: the only extra error is the activation's
    rounding to 8 bits, at most half a step (d / 2) per element, so |error| <= sum_j |w_j| d_j / 2."""
    rng = np.random.default_rng(200 + KIND[t])
    for n, k in shapes_for(t, rng):
        raw, ref = random_tensor(t, n, k, rng)
        w = repack(raw, t, (k, n))
        for tokens in (1, 3, 17):
            x = rng.standard_normal((tokens, k)).astype(np.float32)
            got = kb.matmul(w, x)
            want = x.astype(np.float64) @ ref.T.astype(np.float64)
            bound = float_bound(k, x, ref)
            if t in QUANT_TYPES:
                block = 256 if t in K_QUANTS else 32
                d = np.abs(x.reshape(tokens, -1, block)).max(axis=2) / 127
                bound = bound + 1.001 * (np.repeat(d, block, axis=1) / 2) @ np.abs(ref).T.astype(np.float64)
            assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("path", simd.available_paths())
@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_batched_rows_equal_single_token_bit_for_bit(t, path):
    """Batches of 2 to 9 tokens (the small batches of several streams and of speculative verification), 33
    and 37 (more than one 32-token tile, and leftovers) give each token the bits of the one-token decode
    path, in both layouts."""
    from edgeinfer.kernels.cpu.backend import QInput, matmul_int8

    rng = np.random.default_rng(7)
    n, k = 33, GGML_QUANT_SIZES[t][0] * 3
    raw, _ = random_tensor(t, n, k, rng)
    x = rng.standard_normal((37, k)).astype(np.float32)
    for w in layouts(repack(raw, t, (k, n)), path):
        isa = unit_table(path, w.kind)
        single = np.empty((37, n), np.float32)
        for i in range(37):
            matmul_int8(w, QInput(x[i:i + 1]), single[i:i + 1], isa)
        for tokens in (2, 3, 4, 5, 6, 7, 8, 9, 33, 37):
            batched = np.empty((tokens, n), np.float32)
            matmul_int8(w, QInput(x[:tokens]), batched, isa)
            np.testing.assert_array_equal(batched, single[:tokens], err_msg=f"{tokens} tokens")


_TABLES = {}


def unit_table(path, kind):
    """The kernel-unit addresses (units.Table) of `path`, with the unit of `kind` compiled."""
    from edgeinfer.kernels.cpu import units

    table = _TABLES.setdefault(path, units.Table(path))
    return table.for_kinds((kind,))


def layouts(w, path=None):
    """A repacked matrix, and for a quantized type also its eight-row interleaved form; for a SIMD `path` the
    interleaved form alone (the row-major kernels take no path: the portable run covers them)."""
    if w.kind not in INTERLEAVED:
        return (w,)
    return (interleave8(w),) if path not in (None, "portable") else (w, interleave8(w))


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_every_path_gives_the_portable_bits_for_whole_row_groups_and_pairs(t):
    """With one thread a task holds several row groups, so avx512's two-group vectors run whole pairs, a pair
    whose second group is partial (29 rows) and an odd last group (24, 40): every path's bits are the
    portable path's, for one token, a few, and more than a 32-token tile."""
    import numba

    from edgeinfer.kernels.cpu.backend import QInput, matmul_int8

    rng = np.random.default_rng(11)
    k = 512 if t in K_QUANTS else 96
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        for n in (16, 24, 29, 40):
            raw, _ = random_tensor(t, n, k, rng)
            w = interleave8(repack(raw, t, (k, n)))
            for tokens in (1, 5, 37):
                x = rng.standard_normal((tokens, k)).astype(np.float32)
                want = np.empty((tokens, n), np.float32)
                matmul_int8(w, QInput(x), want, unit_table("portable", w.kind))
                for path in simd.available_paths()[1:]:
                    got = np.empty((tokens, n), np.float32)
                    matmul_int8(w, QInput(x), got, unit_table(path, w.kind))
                    np.testing.assert_array_equal(got, want, err_msg=f"{path}, {n} rows, {tokens} tokens")
    finally:
        numba.set_num_threads(threads)


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_interleaved_layout_holds_the_same_weights_and_results(t):
    """interleave8 moves bytes only (Q6_K's also packs its values back to six bits): the same dequantized rows
    (odd row counts padded), and on every path the same output bits for the interleaved matrix, for a few
    tokens and for more than a 32-token tile (avx512's two row groups per vector included: 13 rows are one
    group and a part, 40 an odd number)."""
    from edgeinfer.kernels.cpu.backend import QInput, matmul_int8

    rng = np.random.default_rng(9)
    k = 512 if t in K_QUANTS else 96
    for n in (8, 13, 40):
        raw, ref = random_tensor(t, n, k, rng)
        w = repack(raw, t, (k, n))
        x8 = interleave8(w)
        np.testing.assert_array_equal(kb.dequantize(x8), kb.dequantize(w))
        # in place (what loading does): the same arrays, made in the row-major copy's memory
        spent = repack(raw, t, (k, n))
        x8_inplace = interleave8(spent, inplace=True)
        for f in ("qs", "qh", "sc", "d", "m"):
            np.testing.assert_array_equal(getattr(x8_inplace, f), getattr(x8, f))
        if n % 8 == 0 and t != T.Q6_K:  # Q6_K's values leave their byte each for six bits: a new, smaller array
            assert np.shares_memory(x8_inplace.qs, spent.qs)
        if t == T.Q6_K:
            assert x8.qs.nbytes == -(-n // 8) * 8 * k * 3 // 4  # the file's six bits a weight (ql, qh)
        if t in (T.Q3_K, T.Q2_K):  # built a group at a time (more chunks than one), in place and not
            from edgeinfer.kernels.formats import k23

            with patch.object(k23, "K23_CHUNK_BYTES", 1):
                for inplace in (False, True):
                    chunked = interleave8(repack(raw, t, (k, n)), inplace=inplace)
                    for f in ("qs", "qh", "sc", "d", "m"):
                        np.testing.assert_array_equal(getattr(chunked, f), getattr(x8, f))
        if t in DIRECT_TYPES:  # straight from the file's bytes (what loading does), in chunks of a few rows
            with patch.object(repack_module, "CHUNK_BYTES", 2 * raw.shape[-1] if raw.ndim > 1 else 64):
                released = []
                direct = repack_interleaved(raw, t, (k, n), release=lambda r0, r1: released.append((r0, r1)))
            assert direct.kind == x8.kind and released[0][0] == 0 and released[-1][1] == n
            for f in ("qs", "qh", "sc", "d", "m"):
                np.testing.assert_array_equal(getattr(direct, f), getattr(x8, f))
                assert getattr(direct, f).dtype == getattr(x8, f).dtype
        np.testing.assert_array_equal(kb.dequantize(x8), ref)
        for tokens in (5, 37):
            x = rng.standard_normal((tokens, k)).astype(np.float32)
            outs = []
            for path in simd.available_paths():
                o = np.empty((tokens, n), np.float32)
                matmul_int8(x8, QInput(x), o, unit_table(path, x8.kind))
                outs.append(o)
            for path, o in zip(simd.available_paths()[1:], outs[1:]):
                np.testing.assert_array_equal(o, outs[0], err_msg=f"{path}, {tokens} tokens")


def test_float16_conversion_matches_numpy():
    from numba import njit

    from edgeinfer.kernels.cpu.ops import f32_to_f16_bits

    @njit
    def convert(a, bits):
        for i in range(a.size):
            bits[i] = f32_to_f16_bits(a[i])

    rng = np.random.default_rng(5)
    a = (rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000)).astype(np.float32)
    a = np.concatenate([a, np.array([0, -0.0, 65504, 65520, 1e-8, 5.96e-8, 2.98e-8, 6.1e-5, np.inf, -np.inf, 1e10],
                                    np.float32)])
    bits = np.empty(a.size, np.uint16)
    convert(a, bits)
    with np.errstate(over="ignore"):
        want = a.astype(np.float16)
    np.testing.assert_array_equal(bits, want.view(np.uint16))


def test_kernel_path_choice(monkeypatch):
    have = simd.native_paths()
    assert have[0] == "portable" and simd.available_paths()[:len(have)] == have
    monkeypatch.delenv("EDGEINFER_KERNELS", raising=False)
    assert simd.choose_path() == have[-1]  # never an emulated path unless forced
    monkeypatch.setenv("EDGEINFER_KERNELS", "portable")
    assert simd.choose_path() == "portable"
    monkeypatch.setenv("EDGEINFER_KERNELS", "sse9")
    with pytest.raises(ValueError, match="EDGEINFER_KERNELS must be one of portable, avx2, vnni, avx512, neon, dotprod, i8mm"):
        simd.choose_path()


def test_small_matmuls_path_choice(monkeypatch):
    """On Zen 4 (512-bit operations in two halves) the avx512 path's matmuls of 1-2 tokens run the avx2
    kernels; elsewhere a path's own; EDGEINFER_SMALL_KERNELS forces the path or one before it in its family."""
    monkeypatch.delenv(simd.SMALL_ENV, raising=False)
    assert simd.small_path("avx512", cpu="znver4") == "avx2"
    assert simd.small_path("avx512", cpu="sapphirerapids") == "avx512"
    assert simd.small_path("avx512", cpu="znver5") == "avx512"
    assert simd.small_path("vnni", cpu="znver4") == "vnni"
    assert simd.small_path("i8mm", cpu="neoverse-v2") == "i8mm"
    monkeypatch.setenv(simd.SMALL_ENV, "vnni")
    assert simd.small_path("avx512", cpu="sapphirerapids") == "vnni"
    for path, forced in (("avx2", "avx512"), ("avx512", "portable"), ("avx512", "neon"), ("dotprod", "i8mm")):
        monkeypatch.setenv(simd.SMALL_ENV, forced)
        with pytest.raises(ValueError, match=f"EDGEINFER_SMALL_KERNELS={forced}: under the {path} path"):
            simd.small_path(path)


@pytest.mark.skipif("avx512" not in simd.available_paths(), reason="an x86 machine runs the avx512 path (emulated on AVX2)")
def test_a_table_with_a_small_path_sends_one_and_two_tokens_to_its_units():
    """units.Table(path, small_path): matmuls of 1-2 tokens call the small path's unit, of 3 and more the
    path's (the K-quants' 1-4 and 5 on), and every batch size keeps the portable bits."""
    from edgeinfer.kernels.cpu import units
    from edgeinfer.kernels.cpu.backend import QInput, matmul_int8

    rng = np.random.default_rng(5)
    t = T.Q4_K
    raw, _ = random_tensor(t, 40, 512, rng)
    w = interleave8(repack(raw, t, (512, 40)))
    fam = units.FAMILY_OF[w.kind]
    table = units.Table("avx512", "avx2").for_kinds((w.kind,))
    big, small = (units.address(units.rows_unit(p, fam), units.ROWS_SIG) for p in ("avx512", "avx2"))
    assert big != small
    assert [int(table[units.slot(w.kind, n)]) for n in (1, 2, 3, 4, 5, 8)] == [small] * 4 + [big] * 2
    legacy = kinds.Q4_0_X8
    assert [int(units.slot(legacy, n)) - legacy for n in (1, 2, 3)] == [units.SMALL, units.SMALL, 0]
    x = rng.standard_normal((5, 512)).astype(np.float32)
    want = np.empty((5, 40), np.float32)
    matmul_int8(w, QInput(x), want, unit_table("portable", w.kind))
    for n in (1, 2, 3, 4, 5):
        got = np.empty((n, 40), np.float32)
        matmul_int8(w, QInput(x[:n]), got, table)
        np.testing.assert_array_equal(got, want[:n], err_msg=f"{n} tokens")


_AVX2 = {"avx2", "fma", "f16c"}
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl"}


@pytest.mark.parametrize("feats, paths", [
    (_AVX2, ["portable", "avx2"]),                                         # Zen 3, Haswell
    (_AVX2 | {"avxvnni"}, ["portable", "avx2", "vnni"]),                   # Alder Lake: VNNI on ymm only
    (_AVX512, ["portable", "avx2"]),                                       # Skylake-X: AVX-512 without VNNI
    (_AVX512 | {"avx512vnni"}, ["portable", "avx2", "vnni", "avx512"]),    # Ice Lake, Sapphire Rapids, Zen 4
    (_AVX2 | {"avx512vnni", "avx512vl"}, ["portable", "avx2", "vnni"]),    # no avx512bw: no zmm byte shuffles
])
def test_x86_paths_follow_the_cpus_features(monkeypatch, feats, paths):
    """avx512 (the 512-bit kernels) needs AVX-512 F, BW, VL and VNNI; vnni needs VNNI on ymm (AVX-512 VL or AVX-VNNI)."""
    from edgeinfer.kernels.cpu.simd import paths as paths_module

    monkeypatch.setattr(paths_module, "host_features", lambda: set(feats))
    monkeypatch.delenv("EDGEINFER_KERNELS", raising=False)
    monkeypatch.delenv(simd.EMULATE_ENV, raising=False)
    assert simd.available_paths() == paths
    assert simd.choose_path() == paths[-1]
    if "avx512" not in paths:
        monkeypatch.setenv("EDGEINFER_KERNELS", "avx512")
        with pytest.raises(ValueError, match="this CPU cannot run that path"):
            simd.choose_path()
    # emulated, the paths the CPU lacks are listed after its own, chosen only when forced
    monkeypatch.setenv(simd.EMULATE_ENV, "1")
    monkeypatch.delenv("EDGEINFER_KERNELS", raising=False)
    assert simd.available_paths() == paths + [p for p in ("vnni", "avx512") if p not in paths]
    assert simd.choose_path() == paths[-1]
    monkeypatch.setenv("EDGEINFER_KERNELS", "avx512")
    assert simd.choose_path() == "avx512"


def test_no_emulated_paths_without_avx2(monkeypatch):
    from edgeinfer.kernels.cpu.simd import paths as paths_module

    monkeypatch.setattr(paths_module, "host_features", lambda: {"sse4.2"})
    monkeypatch.setenv(simd.EMULATE_ENV, "1")
    assert simd.available_paths() == ["portable"]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 instructions")
def test_vnni_instructions_sum_as_the_cpu_does():
    """vpdpbusd (ymm, zmm) and vpdpwssd as the kernels get them, native where the code generator's tier has
    them and emulated in AVX2 where not: unsigned times signed bytes summed in fours, and signed 16-bit pairs,
    added to the accumulator modulo 2**32 (no saturation), at the ends of their ranges."""
    from numba import njit

    @njit
    def run(a, b, acc, out8, out16, outw):
        simd.store8i(out8, 0, simd.dpbusd(simd.load8i(acc, 0), simd.load32(a, 0), simd.load32(b, 0)))
        simd.store8i(out16, 0, simd.dpbusd(simd.load16i(acc, 0), simd.load32(a, 0, 32), simd.load32(b, 0, 32)))
        simd.store8i(outw, 0, simd.dpwssd(simd.load16i(acc, 0), simd.load16i(a.view(np.int32), 0),
                                          simd.load16i(b.view(np.int32), 0)))

    rng = np.random.default_rng(5)
    for extreme in (False, True):
        a = rng.integers(0, 256, 64).astype(np.uint8)
        b = rng.integers(0, 256, 64).astype(np.uint8)
        acc = rng.integers(-2**31, 2**31, 16).astype(np.int32)
        if extreme:  # the largest sums of products, on an accumulator at the edge of int32
            a[:] = 255
            b[:] = 128  # -128 as a signed byte
            b[32:] = 127
            acc[:] = [2**31 - 1, -2**31] * 8
        out8, out16, outw = np.empty(8, np.int32), np.empty(16, np.int32), np.empty(16, np.int32)
        run(a, b, acc, out8, out16, outw)
        prod = (a.astype(np.int64) * b.view(np.int8).astype(np.int64)).reshape(16, 4).sum(axis=1)
        want = ((acc.astype(np.int64) + prod + 2**31) % 2**32 - 2**31).astype(np.int32)
        np.testing.assert_array_equal(out8, want[:8])
        np.testing.assert_array_equal(out16, want)
        pw = (a.view(np.int16).astype(np.int64) * b.view(np.int16).astype(np.int64)).reshape(16, 2).sum(axis=1)
        np.testing.assert_array_equal(outw, ((acc.astype(np.int64) + pw + 2**31) % 2**32 - 2**31).astype(np.int32))


@pytest.mark.parametrize("caps, paths", [
    ({}, ["portable"]),
    ({16: 1 << 1}, ["portable", "neon"]),                                    # Cortex-A72 (Raspberry Pi 4)
    ({16: (1 << 1) | (1 << 20)}, ["portable", "neon", "dotprod"]),           # Cortex-A76 (Raspberry Pi 5)
    ({16: (1 << 1) | (1 << 20), 26: 1 << 13}, ["portable", "neon", "dotprod", "i8mm"]),  # Neoverse V1
    ({16: (1 << 1) | (1 << 20) | (1 << 13)}, ["portable", "neon", "dotprod"]),  # i8mm's bit is HWCAP2's
])
def test_aarch64_paths_follow_the_kernels_hardware_capabilities(monkeypatch, caps, paths):
    """On aarch64 the paths come from AT_HWCAP/AT_HWCAP2 in the auxiliary vector (/proc/self/auxv), read here
    from bytes as the kernel lays them out, then chosen as on a board."""
    from edgeinfer.kernels.cpu.simd import paths as paths_module

    words = [w for at, val in caps.items() for w in (at, val)] + [6, 4096, 0, 0]  # AT_PAGESZ, AT_NULL
    auxv = np.array(words, np.uint64).tobytes()
    feats = simd.arm_hwcaps(auxv)
    monkeypatch.setattr(paths_module, "host_features", lambda: feats)
    monkeypatch.delenv("EDGEINFER_KERNELS", raising=False)
    assert simd.available_paths() == paths
    assert simd.choose_path() == paths[-1]
    if "dotprod" not in paths:
        monkeypatch.setenv("EDGEINFER_KERNELS", "dotprod")
        with pytest.raises(ValueError, match="this CPU cannot run that path"):
            simd.choose_path()


def test_repacked_weights_take_the_files_bytes():
    rng = np.random.default_rng(1)
    for t in ALL_TYPES:
        raw, _ = random_tensor(t, 8, 512, rng)
        w = repack(raw, t, (512, 8))
        # K-quants' 12-byte packed scales become 16 plain bytes (at most 3% more; Q3_K 114 bytes per
        # 110); Q6_K's 6-bit values are unpacked to bytes (256 + 16 + 2 bytes per 210)
        limit = {T.Q6_K: 274 / 210, T.Q3_K: 114 / 110}.get(t, 1.03)
        assert w.nbytes == repack_module.loaded_bytes(t, 8 * 512, raw.nbytes), t.name
        assert raw.nbytes <= w.nbytes <= raw.nbytes * limit, t.name
        if KIND[t] in INTERLEAVED:  # the SIMD kernels' layout (Q6_K: back to the file's six bits a value)
            x8 = interleave8(w)
            assert x8.nbytes == repack_module.loaded_bytes(t, 8 * 512, raw.nbytes, interleaved=True), t.name
            assert raw.nbytes <= x8.nbytes <= raw.nbytes * (1 if t == T.Q6_K else limit), t.name


def test_embed_rows():
    rng = np.random.default_rng(2)
    raw, ref = random_tensor(T.Q8_0, 50, 64, rng)
    w = repack(raw, T.Q8_0, (64, 50))
    ids = np.array([3, 0, 49, 3])
    np.testing.assert_array_equal(kb.embed(w, ids), ref[ids])


def test_unsupported_type_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported tensor type IQ2_XXS"):
        repack(np.zeros((1, 66), np.uint8), T.IQ2_XXS, (256, 1))


def test_rmsnorm():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    out = np.empty_like(x)
    ops.rmsnorm(x, w, 1e-6, out)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)  # float32 sums of 64 squares


@pytest.mark.parametrize("neox", [False, True])
def test_rope_matches_complex_rotation(neox):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 3, 16)).astype(np.float32)
    pos = np.array([0, 1, 5, 17, 100, 2000])
    inv = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    got = x.copy()
    ops.rope(got, pos, inv, neox)
    if neox:
        z = x[..., :8] + 1j * x[..., 8:]
    else:
        z = x[..., 0::2] + 1j * x[..., 1::2]
    z = z * np.exp(1j * pos[:, None, None] * inv[None, None, :])
    ref = np.concatenate([z.real, z.imag], -1) if neox else np.stack([z.real, z.imag], -1).reshape(x.shape)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)  # float32 cos/sin of angles up to 2000 rad


def _attention_reference(q, k, v, positions, scale, window, sinks=None):
    # sinks (H,): a logit per head that joins the softmax with no value (llama.cpp's soft_max_ext with sinks)
    t, h, d = q.shape
    group = h // k.shape[1]
    out = np.zeros((t, h, v.shape[2]))
    for i in range(t):
        for j in range(h):
            p = positions[i]
            lo = max(0, p - window + 1) if window > 0 else 0
            s = (k[lo:p + 1, j // group] @ q[i, j]) * scale
            m = s.max() if sinks is None else max(s.max(), sinks[j])
            e = np.exp(s - m)
            total = e.sum() + (0.0 if sinks is None else np.exp(sinks[j] - m))
            out[i, j] = (e / total) @ v[lo:p + 1, j // group]
    return out


@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("d", [8, 12], ids=["vector", "head-size-not-a-multiple-of-8"])
@pytest.mark.parametrize("window", [0, 5])
def test_paged_attention_reads_through_block_tables(window, d, sinks):
    """Scattered blocks, windows, both kernels (tiled, and scalar for head sizes not a multiple of 8), and
    gpt-oss's attention sinks (one large enough to take most of a row's weight, one far below)."""
    rng = np.random.default_rng(5)
    seq_len, h, kvh, bs = 37, 4, 2, 4
    k = rng.standard_normal((seq_len, kvh, d)).astype(np.float32)
    v = rng.standard_normal((seq_len, kvh, d)).astype(np.float32)
    blocks = rng.permutation(20)[: -(-seq_len // bs)]  # scattered, out-of-order physical blocks
    kc = np.zeros((20 * bs, kvh, d), np.float32)
    vc = np.zeros_like(kc)
    slots = blocks[np.arange(seq_len) // bs] * bs + np.arange(seq_len) % bs
    ops.write_kv(k, v, slots.astype(np.int64), kc, vc)
    positions = np.array([0, 3, 4, 20, 36])
    q = rng.standard_normal((len(positions), h, d)).astype(np.float32)
    out = np.zeros((len(positions), h, d), np.float32)
    table = np.zeros((2, 16), np.int32)
    table[1, : len(blocks)] = blocks
    sk = np.array([2.5, -30.0, 0.3, -1.0], np.float32) if sinks else np.zeros(0, np.float32)
    attention.paged_attention(q, kc, vc, np.ones(len(positions), np.int64), positions, table, bs, np.float32(0.35),
                              window, np.float32(0.0), sk, out, 2)
    ref = _attention_reference(q, k, v, positions, 0.35, window, sk if sinks else None)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)  # online softmax in float32


@njit(cache=False)
def _transpose8(a, out):
    c = simd.transpose8(simd.loadf8(a, 0), simd.loadf8(a, 8), simd.loadf8(a, 16), simd.loadf8(a, 24),
                        simd.loadf8(a, 32), simd.loadf8(a, 40), simd.loadf8(a, 48), simd.loadf8(a, 56))
    for i in range(8):
        simd.storef8(out, 8 * i, c[i])


def test_transpose8_moves_values_exactly():
    a = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    a[5], a[17], a[40] = -0.0, np.inf, np.nan
    out = np.zeros(64, np.float32)
    _transpose8(a, out)
    assert np.array_equal(out.view(np.uint32), a.reshape(8, 8).T.ravel().view(np.uint32))


@pytest.mark.parametrize("kv", ["f32", "f16", "q8_0"])
def test_paged_attention_decode_rows_with_a_window_starting_inside_eight_keys(kv):
    """A decode row whose window starts and ends inside a group of eight keys (the tile takes eight keys' rows
    at once, repeating a key inside the window for those outside): the reference's values, and the same bits
    as that row computed in a batch beside other tokens of its sequence, and with its KV heads' query heads split
    between tasks (more threads than KV heads)."""
    rng = np.random.default_rng(11)
    seq_len, h, kvh, d, bs, window = 45, 8, 2, 64, 4, 7
    k = rng.standard_normal((seq_len, kvh, d)).astype(np.float32)
    v = rng.standard_normal((seq_len, kvh, d)).astype(np.float32)
    blocks = rng.permutation(16)[: -(-seq_len // bs)]
    slots = (blocks[np.arange(seq_len) // bs] * bs + np.arange(seq_len) % bs).astype(np.int64)
    width, dt = {"f32": (d, np.float32), "f16": (d, np.uint16), "q8_0": (d * 17 // 16, np.int8)}[kv]
    kc, vc = np.zeros((16 * bs, kvh, width), dt), np.zeros((16 * bs, kvh, width), dt)
    kin, vin = (k, v) if kv != "f16" else (k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16))
    ops.write_kv(kin, vin, slots, kc, vc)
    table = blocks.astype(np.int32)[None]
    q = rng.standard_normal((3, h, d)).astype(np.float32)
    positions = np.array([29, 37, 44])  # windows from key 23, 31 and 38

    def attend(rows, threads):
        out = np.zeros((len(rows), h, d), np.float32)
        attention.paged_attention(q[rows], kc, vc, np.zeros(len(rows), np.int64), positions[rows], table, bs,
                                  np.float32(0.125), window, np.float32(0.0), np.zeros(0, np.float32), out, threads)
        return out

    batch = attend([0, 1, 2], 1)
    for i in range(3):
        for threads in (1, 4, 8):  # 2 KV heads: no split, 2 parts, 4 parts
            assert np.array_equal(attend([i], threads)[0].view(np.uint32), batch[i].view(np.uint32))
    if kv != "q8_0":
        k16, v16 = (k, v) if kv == "f32" else (k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32))
        np.testing.assert_allclose(batch, _attention_reference(q, k16, v16, positions, 0.125, window), rtol=1e-4, atol=1e-5)


def test_activations():
    rng = np.random.default_rng(6)
    g = rng.standard_normal((3, 40)).astype(np.float32) * 3
    u = rng.standard_normal((3, 40)).astype(np.float32)
    out = np.empty_like(g)
    ops.silu_mul(g, u, out)
    np.testing.assert_allclose(out, g / (1 + np.exp(-g.astype(np.float64))) * u, rtol=1e-5, atol=1e-6)
    ops.gelu_tanh_mul(g, u, out)
    gd = g.astype(np.float64)
    ref = 0.5 * gd * (1 + np.tanh(np.sqrt(2 / np.pi) * (gd + 0.044715 * gd ** 3))) * u
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_paged_attention_with_float16_cache():
    rng = np.random.default_rng(8)
    seq_len, h, kvh, d, bs = 20, 2, 1, 16, 4
    k = rng.standard_normal((seq_len, kvh, d)).astype(np.float32)
    v = rng.standard_normal((seq_len, kvh, d)).astype(np.float32)
    kc = np.zeros((8 * bs, kvh, d), np.uint16)
    vc = np.zeros_like(kc)
    slots = np.arange(seq_len, dtype=np.int64)
    ops.write_kv(k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16), slots, kc, vc)
    q = rng.standard_normal((3, h, d)).astype(np.float32)
    positions = np.array([0, 9, 19])
    out = np.zeros((3, h, d), np.float32)
    attention.paged_attention(q, kc, vc, np.zeros(3, np.int64), positions, np.arange(8, dtype=np.int32)[None], bs,
                              np.float32(0.25), 0, np.float32(0.0), np.zeros(0, np.float32), out, 2)
    # exact against a reference that reads the same float16-rounded K and V
    k16, v16 = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(out, _attention_reference(q, k16, v16, positions, 0.25, 0), rtol=1e-4, atol=1e-5)


_WIDEN = """
import json, sys
import numpy as np
import edgeinfer.kernels.cpu
from numba import njit
from edgeinfer import LLM, SamplingParams
from edgeinfer.kernels.cpu import simd
from edgeinfer.kernels.cpu.simd.floats import half_in_hardware

@njit
def widen(a, out):
    for i in range(0, a.shape[0], 8):
        simd.storef8(out, i, simd.loadf8(a, i))

bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
out = np.empty(65536, np.float32)
widen(bits, out)
with np.errstate(invalid="ignore"):
    want = bits.view(np.float16).astype(np.float32)
nan = np.isnan(want)
exact = bool(np.array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32)) and np.isnan(out[nan]).all())
llm = LLM(sys.argv[1], kv_type="f16", progress=False)
ids = llm.generate("the hen sat", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].token_ids
print(json.dumps({"native": half_in_hardware(), "exact": exact, "ids": ids}))
"""


def test_float16_widening_is_exact_and_the_portable_path_runs_an_f16_kv_cache(tiny_llama_path):
    """loadf8 widens float16 bits exactly on every tier: with F16C (vcvtph2ps) and on the portable
    x86-64-v2 tier, which has no F16C (integer lanes: LLVM's own conversion there is a call Numba cannot
    link, which aborted the process); and the portable path decodes with the default f16 KV cache, giving
    the native path's tokens."""
    import json
    import os
    import subprocess
    import sys

    runs = {}
    for path in ("portable", None):
        env = {k: v for k, v in os.environ.items() if k != "EDGEINFER_KERNELS"}
        if path:
            env["EDGEINFER_KERNELS"] = path
        r = subprocess.run([sys.executable, "-c", _WIDEN, str(tiny_llama_path)], capture_output=True, text=True,
                           env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[path] = json.loads(r.stdout.strip().splitlines()[-1])
    assert runs["portable"]["exact"] and runs[None]["exact"]
    if platform.machine() in ("x86_64", "AMD64"):
        assert runs["portable"]["native"] is False
    assert runs["portable"]["ids"] == runs[None]["ids"] and len(runs[None]["ids"]) == 8
