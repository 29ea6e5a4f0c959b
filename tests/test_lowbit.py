"""The types below 4.5 bits (Q2_K, Q3_K, IQ4_NL, IQ4_XS): quantizers against llama.cpp's own blocks, with and
without an importance matrix, and loading them for the kernels (quant/repack.py's WIDENED) against gguf's
dequantize."""

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from edgeinfer.kernels import get_backend, kinds
from edgeinfer.quant import kquants, lowbit
from edgeinfer.quant.repack import WIDENED, loaded_bytes, repack
from edgeinfer.quant.tool import WEIGHTED, quantize_rows

GOLDEN = Path(__file__).parent / "golden" / "lowbit_blocks.npz"  # benchmarks/make_lowbit_golden.py
PLAIN_TYPES = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS")
IMATRIX_TYPES = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "Q4_K", "Q5_K", "Q6_K")
kb = get_backend("cpu")


def sample():
    """The reference input: (48, 1024) float32 with a few heavy columns (as activation outliers make
    weights' columns matter unequally), a zero row, a constant row, a row zero but for its first 32 values,
    and an importance row spanning four orders of magnitude."""
    rng = np.random.default_rng(37)
    x = (rng.standard_normal((48, 1024)) * 0.02).astype(np.float32)
    x[:, ::97] *= 6
    x[3] = 0
    x[7] = 0.0125
    x[11] = 0
    x[11, :32] = rng.standard_normal(32).astype(np.float32) * 0.05
    imp = (10.0 ** rng.uniform(-3, 1, 1024)).astype(np.float32)
    return x, imp


def _quantize(name, x, w=None):
    return quantize_rows(x, T[name], w)


@pytest.mark.parametrize("name", PLAIN_TYPES)
def test_quantizer_equals_llama_cpp_reference_block_for_block(name):
    x, _ = sample()
    want = np.load(GOLDEN)[f"{name}_plain"]
    got = _quantize(name, x)
    assert got.shape == want.shape
    block = GGML_QUANT_SIZES[T[name]][1]
    same = (got.reshape(-1, block) == want.reshape(-1, block)).all(axis=1)
    assert same.all(), f"{(~same).sum()} of {same.size} blocks differ from llama.cpp's"


@pytest.mark.parametrize("name", IMATRIX_TYPES)
def test_imatrix_quantizer_equals_llama_cpp_block_for_block(name):
    x, imp = sample()
    want = np.load(GOLDEN)[f"{name}_imatrix"]
    got = _quantize(name, x, imp)
    block = GGML_QUANT_SIZES[T[name]][1]
    same = (got.reshape(-1, block) == want.reshape(-1, block)).all(axis=1)
    assert same.all(), f"{(~same).sum()} of {same.size} blocks differ from llama.cpp's"


@pytest.mark.parametrize("name", IMATRIX_TYPES)
def test_the_imatrix_lowers_the_error_it_weights(name):
    x, imp = sample()
    t = T[name]
    err = {}
    for with_imx in (False, True):
        y = gguf.quants.dequantize(_quantize(name, x, imp if with_imx else None), t).reshape(x.shape)
        err[with_imx] = float((imp * (y - x) ** 2).sum())
    assert err[True] < err[False]


# relative RMS error on the sample (its heavy columns included), with a margin over what each type reaches
ERROR_BOUND = {"Q2_K": 0.38, "Q3_K": 0.24, "IQ4_NL": 0.11, "IQ4_XS": 0.11}


@pytest.mark.parametrize("name", PLAIN_TYPES)
def test_round_trip_error_and_the_special_rows(name):
    x, imp = sample()
    for w in (None, imp):
        y = gguf.quants.dequantize(_quantize(name, x, w), T[name]).reshape(x.shape)
        assert np.isfinite(y).all()
        assert np.all(y[3] == 0)  # an all-zero row stays zero
        assert np.all(y[11, 32:] == 0)
        assert np.abs(y[7] - x[7]).max() <= 0.3 * 0.0125  # a constant row, within its own grid
        g = np.delete(x, [3, 7, 11], axis=0)
        gy = np.delete(y, [3, 7, 11], axis=0)
        assert np.sqrt(((gy - g) ** 2).mean() / (g ** 2).mean()) < ERROR_BOUND[name]


def test_a_row_length_the_type_cannot_take_or_a_wrong_importance_is_an_error():
    x, imp = sample()
    with pytest.raises(ValueError, match="columns"):
        lowbit.quantize_q3_k(x, imp[:512])
    with pytest.raises(ValueError, match="columns"):
        kquants.quantize_q4_k(x, imp[:256])
    with pytest.raises(ValueError):
        lowbit.quantize_iq4_xs(x[:, :200])


def test_every_quantizer_with_an_importance_is_in_the_tool():
    assert {t.name for t in WEIGHTED} == set(IMATRIX_TYPES)


# -- loading: the widened kinds --------------------------------------------------------------------


def _values(w):
    """A row-major widened QTensor's weights as float32, by its host kind's definition."""
    n, k = w.shape
    if w.kind == kinds.Q6_K:
        v = w.qs.view(np.int8).astype(np.float32).reshape(n, -1, 16)
        sc = w.sc.view(np.int8).astype(np.float32).reshape(n, -1)
        d = np.repeat(w.d.view(np.float16).astype(np.float32), 16, axis=1)
        return (v * (d * sc)[:, :, None]).reshape(n, k)
    assert w.kind == kinds.Q8_0
    v = w.qs.view(np.int8).astype(np.float32).reshape(n, -1, 32)
    return (v * w.d.view(np.float16).astype(np.float32)[:, :, None]).reshape(n, k)


@pytest.mark.parametrize("name", PLAIN_TYPES)
def test_widened_weights_equal_gguf_dequantize(name):
    x, imp = sample()
    t = T[name]
    raw = _quantize(name, x, imp)
    ref = gguf.quants.dequantize(raw, t).reshape(x.shape)
    w = repack(raw, t, (x.shape[1], x.shape[0]))
    assert w.kind == WIDENED[t] and w.ggml_type == t
    got = _values(w)
    if t in (T.Q3_K, T.IQ4_NL):
        np.testing.assert_array_equal(got, ref)  # exact: the same integers and scales
    elif t == T.IQ4_XS:  # each 32-block's scale d * (ls - 32) rounded to float16
        blk = np.abs(ref.reshape(48, -1, 32)).max(axis=2, keepdims=True)
        assert np.all(np.abs(got - ref).reshape(48, -1, 32) <= blk * 2.0 ** -11)
    else:  # Q2_K: 8 bits again per 32-block: half a step of max / 127, plus the step's float16 rounding (2^-11)
        blk = np.abs(ref.reshape(48, -1, 32)).max(axis=2, keepdims=True)
        assert np.all(np.abs(got - ref).reshape(48, -1, 32) <= blk / 127 * (0.5 + 127 * 2.0 ** -11) + 1e-9)
    assert w.nbytes == loaded_bytes(t, x.size, raw.nbytes)


@pytest.mark.parametrize("name", PLAIN_TYPES)
def test_matmul_of_a_widened_type_matches_its_dequantized_weights(name):
    """The kernels of the host kind on this CPU's path (interleaved on the SIMD paths), one token and a batch:
    within the activation's 8-bit rounding of the float product, and a batch equal to its tokens alone."""
    x, imp = sample()
    t = T[name]
    raw = _quantize(name, x, imp)
    ref = gguf.quants.dequantize(raw, t).reshape(x.shape).astype(np.float64)
    w = kb.upload(repack(raw, t, (x.shape[1], x.shape[0])))
    rng = np.random.default_rng(5)
    a = rng.standard_normal((9, x.shape[1])).astype(np.float32)
    got = kb.matmul(w, a)
    want = a.astype(np.float64) @ ref.T
    block = 256 if WIDENED[t] == kinds.Q6_K else 32
    d = np.abs(a.reshape(9, -1, block)).max(axis=2) / 127
    bound = (1.001 * (np.repeat(d, block, axis=1) / 2) @ np.abs(ref).T + 4 * 1024 * 1.2e-7 * np.abs(a) @ np.abs(ref).T
             + 1e-6)
    if t in (T.IQ4_XS, T.Q2_K):  # and the widening's own rounding per element (the test above)
        blk = np.repeat(np.abs(ref.reshape(48, -1, 32)).max(axis=2), 32, axis=1)
        bound = bound + np.abs(a) @ (blk * (2.0 ** -11 if t == T.IQ4_XS else (0.5 + 127 * 2.0 ** -11) / 127)).T
    assert np.all(np.abs(got - want) <= bound)
    one = kb.matmul(w, a[4:5])
    np.testing.assert_array_equal(one[0], got[4])
