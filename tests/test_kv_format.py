"""The one table of KV row formats (kernels/kv_format.py): the names the user may give, the kernels'
element types, the engine's rows and memory's estimates all come from it."""

import numpy as np
import pytest

from edgeinfer.config import KV_TYPES
from edgeinfer.kernels.kv_format import KV_FORMATS


def test_the_kv_types_a_user_may_give_are_the_tables():
    assert tuple(KV_FORMATS) == KV_TYPES


def test_the_kernels_element_types_and_the_backends_table_are_this_one():
    from edgeinfer.kernels import get_backend
    from edgeinfer.kernels.cpu import units

    assert {name: units.KV_DTYPES[name] for name in KV_FORMATS} == {name: (f.storage, f.storage)
                                                                    for name, f in KV_FORMATS.items()}
    assert units.KV_DTYPES["q8_0/f16"] == (np.int8, np.uint16)  # K/V: each its own
    assert len(units.KV_DTYPES) == len(KV_FORMATS) ** 2
    assert get_backend("cpu").KV_FORMATS is KV_FORMATS


@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_row_lengths(d):
    assert KV_FORMATS["f32"].row_len(d) == KV_FORMATS["f16"].row_len(d) == d
    assert KV_FORMATS["q8_0"].row_len(d) == d + d // 16  # llama.cpp's q8_0 block: 34 bytes per 32 values


def test_a_q8_0_cache_needs_heads_in_whole_blocks():
    with pytest.raises(ValueError, match="multiples of 32 .* 48 and 64"):
        KV_FORMATS["q8_0"].check(48, 64)
    KV_FORMATS["f16"].check(48, 64)


def test_the_engines_cache_and_memorys_estimate_read_the_table():
    from edgeinfer import memory
    from edgeinfer.config import EngineConfig
    from edgeinfer.engine.kv_cache import KVCache
    from edgeinfer.kernels import get_backend

    from edgeinfer.config import ModelConfig

    Cfg = ModelConfig(arch="llama", n_layer=2, dim=64, n_head=3, n_kv_head=3, head_dim=64, v_head_dim=32, ffn_dim=128,
                      vocab_size=100, context_length=512, norm_eps=1e-5, rope_base=1e4, rope_dim=64, rope_neox=False)

    kb = get_backend("cpu")
    est = memory.estimate(0, Cfg, EngineConfig(), KV_FORMATS)
    for name, fmt in KV_FORMATS.items():
        cache = KVCache.for_model(Cfg, 2, 4, name, kb=kb)
        assert cache.k.dtype == np.dtype(fmt.storage) and cache.k.shape[-1] == fmt.row_len(64)
        assert cache.nbytes == 8 * est.kv_per_token[name] == 8 * fmt.bytes_per_token(Cfg)
    for k in KV_FORMATS:  # K and V each in its own type: K's rows of 64 values, V's of 32
        for v in KV_FORMATS:
            if k != v:
                cache = KVCache.for_model(Cfg, 2, 4, f"{k}/{v}", kb=kb)
                assert cache.k.dtype == np.dtype(KV_FORMATS[k].storage) and cache.k.shape[-1] == KV_FORMATS[k].row_len(64)
                assert cache.v.dtype == np.dtype(KV_FORMATS[v].storage) and cache.v.shape[-1] == KV_FORMATS[v].row_len(32)
                assert cache.nbytes == 8 * est.kv_per_token[f"{k}/{v}"]


def test_k_and_v_each_in_its_own_type_read_as_their_values_exactly():
    """Attention over a cache whose K rows are q8_0 and V rows f16 (or any other pair, every type on both sides):
    the same bits as over float32 K and V holding the values those rows hold (and the queries as the keys' type
    takes them, as llama.cpp's flash attention: q8_0 values for a quantized K, bfloat16 values for bf16)."""
    from numba import njit

    from edgeinfer.kernels.cpu import attention, ops

    rng = np.random.default_rng(7)
    n, kvh, d, h, t = 48, 2, 64, 4, 20
    k = (rng.standard_normal((n, kvh, d)) * rng.uniform(0.1, 4, (n, kvh, 1))).astype(np.float32)
    v = rng.standard_normal((n, kvh, d)).astype(np.float32)
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    args = (np.zeros(t, np.int64), np.arange(n - t, n), np.arange(n // 16, dtype=np.int32)[None], 16,
            np.float32(0.125), 0, np.float32(0.0), np.zeros(0, np.float32))

    def cache(name, x):
        f = KV_FORMATS[name]
        c = np.zeros((n, kvh, f.row_len(d)), f.storage)
        ops.write_kv(x, x, np.arange(n), c, np.zeros_like(c))  # (the same rows twice: only K's are kept)
        return c

    @njit
    def loaded(c, out):  # what each row holds, as float32 (kv_load: the kernels' reading of one value)
        for s in range(out.shape[0]):
            for g in range(out.shape[1]):
                for i in range(out.shape[2]):
                    out[s, g, i] = ops.kv_load(c, s, g, i)

    def values(name, c):
        out = np.zeros((n, kvh, d), np.float32)
        loaded(c, out)
        return out

    from edgeinfer.kernels.cpu import kv_rotation

    def queries(kt):  # a quantized K's rows are rotated (d = 64: in one chunk), and so are the queries
        if kt in ("f32", "f16"):
            return q
        return attention.bf16_values(q) if kt == "bf16" else attention.q8_values(kv_rotation.rotated(q, 64))

    pairs = [("q8_0", "f16"), ("f16", "q4_0"), ("f32", "q8_0")]  # (each pair is a compile: a quantized side each way)
    for kt, vt in pairs + [(f, f) for f in ("bf16", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")]:
        kc, vc = cache(kt, k), cache(vt, v)
        got, want = np.zeros((t, h, d), np.float32), np.zeros((t, h, d), np.float32)
        attention.paged_attention(q, kc, vc, *args, got, 2)
        attention.paged_attention(queries(kt), values(kt, kc), values(vt, vc), *args, want, 2)
        if vt not in ("f32", "f16", "bf16"):  # rotated values: the output rotated back
            want = kv_rotation.rotated(want, 64)
        np.testing.assert_array_equal(got, want, err_msg=f"{kt}/{vt}")
        assert np.isfinite(got).all()
        if kt == vt:  # the values are the row format's, near the (rotated) float ones (what a coarse format costs)
            err = np.abs(values(kt, kc) - (k if kt == "bf16" else kv_rotation.rotated(k, 64))).mean() / np.abs(k).mean()
            assert err < {"bf16": 0.005, "q5_1": 0.05, "q5_0": 0.06}.get(kt, 0.11), (kt, err)


def test_kv_type_names():
    from edgeinfer.config import EngineConfig, kv_type_name

    assert kv_type_name("q8_0") == "q8_0" and kv_type_name("q8_0/q8_0") == "q8_0"
    assert kv_type_name("q8_0/f16") == "q8_0/f16"
    assert kv_type_name("q8_0/") == "q8_0/f16" and kv_type_name("/q8_0", "f32") == "f32/q8_0"  # a side not given
    assert EngineConfig(kv_dtype="f16/f16").kv_dtype == "f16" and EngineConfig().kv_dtype == "f16"
    assert kv_type_name("q4_0/iq4_nl") == "q4_0/iq4_nl" and kv_type_name("bf16") == "bf16"
    with pytest.raises(ValueError, match="KV type 'q3_k' is not one of f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0, "
                                         "iq4_nl"):
        EngineConfig(kv_dtype="f16/q3_k")
    with pytest.raises(ValueError, match="CUDA backend has no f32/f16 KV cache"):
        EngineConfig(backend="cuda", kv_dtype="f32/f16")


def _write_rows(name, x):
    # x (n, 64) float32 through write_kv into a cache of this format with heads of 32 (rows of a head size
    # that is not a multiple of 64 are not rotated), as its raw bytes (n, row of 64 values)
    from edgeinfer.kernels.cpu import ops

    f = KV_FORMATS[name]
    x = x.reshape(-1, 2, 32)
    c = np.zeros((x.shape[0], 2, f.row_len(32)), f.storage)
    ops.write_kv(x, x, np.arange(x.shape[0]), c, np.zeros_like(c))
    return c, c.view(np.uint8).reshape(x.shape[0], -1)


def _read_rows(c, d):
    from numba import njit

    from edgeinfer.kernels.cpu import ops

    @njit
    def read(c, out):
        for s in range(out.shape[0]):
            for i in range(out.shape[1]):
                out[s, i] = ops.kv_load(c, s, i // 32, i % 32)

    out = np.zeros((c.shape[0], d), np.float32)
    read(c, out)
    return out


def test_quantized_rows_are_rotated_as_llama_cpps_are():
    """With a quantized K (or V) of head size 64 or more, the rows are rotated by the orthonormal Walsh-Hadamard
    matrix before they are quantized (llama.cpp's attn_rot_k/attn_rot_v): K in the largest power-of-two chunk
    of the head size, V in chunks of 64; the queries go the same way, and the output comes back."""
    from edgeinfer.kernels.cpu import kv_rotation, ops

    def hadamard(n):  # as llama.cpp's ggml_gen_hadamard builds it: Sylvester's, over sqrt(n)
        h = np.ones((1, 1))
        while h.shape[0] < n:
            h = np.block([[h, h], [h, -h]])
        return h / np.sqrt(n)

    assert [kv_rotation.k_chunk(d) for d in (32, 64, 80, 128, 192, 256)] == [0, 64, 0, 128, 64, 256]
    assert [kv_rotation.v_chunk(d) for d in (32, 64, 128, 256)] == [0, 64, 64, 64]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 128)).astype(np.float32)
    r = kv_rotation.rotated(x, 128)
    np.testing.assert_allclose(r, x @ hadamard(128).T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kv_rotation.rotated(r, 128), x, rtol=1e-5, atol=1e-5)  # H H = I
    np.testing.assert_allclose(kv_rotation.rotated(x, 64)[..., 64:], x[..., 64:] @ hadamard(64).T, rtol=1e-5,
                               atol=1e-5)
    from gguf import GGMLQuantizationType, quants

    def q8_blocks(c):  # our q8_0 rows (quants, then the scales) as gguf's blocks (scale, quants)
        qs = c[..., :128].reshape(-1, 4, 32).view(np.uint8)
        return np.concatenate([c[..., 128:].reshape(-1, 4, 2).view(np.uint8), qs], axis=2).reshape(-1)

    k, v = np.zeros((3, 2, 136), np.int8), np.zeros((3, 2, 136), np.int8)
    ops.write_kv(x, x, np.arange(3), k, v)  # K's rotation is of 128 values, V's of 64
    for c, n in ((k, 128), (v, 64)):
        want = quants.quantize(kv_rotation.rotated(x, n).reshape(-1, 128), GGMLQuantizationType.Q8_0)
        np.testing.assert_array_equal(q8_blocks(c), want.reshape(-1))
    other = quants.quantize(kv_rotation.rotated(x, 64).reshape(-1, 128), GGMLQuantizationType.Q8_0)
    assert not np.array_equal(q8_blocks(k), other.reshape(-1))  # (the chunk sizes differ: so do the rows)
    # attention at d = 128, q4_0 K and V: the queries rotated in K's chunk, the output back in V's
    from edgeinfer.kernels.cpu import attention

    n, t = 32, 5
    kk = rng.standard_normal((n, 2, 128)).astype(np.float32)
    q = rng.standard_normal((t, 4, 128)).astype(np.float32)
    f = KV_FORMATS["q4_0"]
    kc, vc = np.zeros((n, 2, f.row_len(128)), f.storage), np.zeros((n, 2, f.row_len(128)), f.storage)
    ops.write_kv(kk, kk[::-1].copy(), np.arange(n), kc, vc)
    args = (np.zeros(t, np.int64), np.arange(n - t, n), np.arange(n // 16, dtype=np.int32)[None], 16,
            np.float32(0.09), 0, np.float32(0.0), np.zeros(0, np.float32))
    got, want = np.zeros((t, 4, 128), np.float32), np.zeros((t, 4, 128), np.float32)
    attention.paged_attention(q, kc, vc, *args, got, 2)
    values = [quants.dequantize(c.view(np.uint8).reshape(n * 2, -1), GGMLQuantizationType.Q4_0).reshape(n, 2, 128)
              for c in (kc, vc)]
    attention.paged_attention(attention.q8_values(kv_rotation.rotated(q, 128)), *values, *args, want, 2)
    np.testing.assert_array_equal(got, kv_rotation.rotated(want, 64))


@pytest.mark.parametrize("name", ["bf16", "q5_1", "q5_0", "q4_1", "q4_0"])
def test_rows_are_written_as_ggml_quantizes_and_read_as_it_dequantizes(name):
    """A row of each type holds ggml's blocks byte for byte: what gguf's reference quantizer (ggml's
    quantize_row_*_ref, which llama.cpp's CPU runs when it stores K and V of these types) writes, and reads as
    gguf's dequantize reads them."""
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((24, 64)) * rng.uniform(0.01, 5, (24, 1))).astype(np.float32)
    x[2, :32] = 0  # an all-zero block
    x[3, 40:50] = -2.5  # a run of equal values
    qt = GGMLQuantizationType[name.upper()]
    c, raw = _write_rows(name, x)
    np.testing.assert_array_equal(raw, quants.quantize(x, qt).view(np.uint8).reshape(raw.shape))
    np.testing.assert_array_equal(_read_rows(c, 64), quants.dequantize(raw, qt).reshape(x.shape))


# llama.cpp's quantize_row_iq4_nl_ref (its CPU's from_float for IQ4_NL) on the rows of the test below, from
# the pinned llama-cpp-python's libggml-base (gguf has no iq4_nl quantizer)
IQ4_NL_LLAMA_CPP = "0e21c87e7eb53615ab480c405f271b87c67ade20b44aecc6bbadd713bab90da264c350898bacd62ce55825eb93e5791502f1be441568c3ad1b87a8d93b06b7b859bd9a93794d8346000050e7ff73ffff0000e0e8cfd3ffff00006b295b7b5cbc89c910d73339654cad4a2a399cac74886cb85da3bd70365ca765968785e70aaa57cdeb9e9eac3411a843394f37a64a06502a0c459bbe9a85af72db98a2be3a42fba50aadb9b79a77dac76d833bab7b0bbbbb8b8b84299bc8a579cf9c8057655a07ceab7bc9a8e2286a90a77a9e8ebda3615ae87cc7a9525a"


def test_iq4_nl_rows_are_llama_cpps():
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(11)
    x = (rng.standard_normal((6, 64)) * rng.uniform(0.01, 5, (6, 1))).astype(np.float32)
    x[2, :32] = 0
    x[3, 7] = 9.0
    x[4, 40:50] = -2.5
    want = np.frombuffer(bytes.fromhex(IQ4_NL_LLAMA_CPP), np.uint8).reshape(6, 36)  # (two blocks a row)
    c, raw = _write_rows("iq4_nl", x)
    qt = GGMLQuantizationType.IQ4_NL
    values = quants.dequantize(raw, qt).reshape(x.shape)
    np.testing.assert_array_equal(values, quants.dequantize(want, qt).reshape(x.shape))
    np.testing.assert_array_equal(_read_rows(c, 64), values)
    blocks, want_blocks = raw.reshape(12, 18), want.reshape(12, 18)
    live = want_blocks[:, :2].any(axis=1)  # (an all-zero block's quants are whatever ggml's stack held: d = 0)
    assert live.sum() == 11
    np.testing.assert_array_equal(blocks[live], want_blocks[live])


def test_a_rotated_v_comes_back_on_the_scalar_path_too():
    """Heads whose size is not a multiple of 8 (K of 60 here) take the scalar attention path: a quantized V's
    rotation is undone there too."""
    from edgeinfer.kernels.cpu import attention, kv_rotation, ops

    rng = np.random.default_rng(9)
    n, t = 32, 4
    k = rng.standard_normal((n, 1, 60)).astype(np.float32)
    v = rng.standard_normal((n, 1, 64)).astype(np.float32)
    q = rng.standard_normal((t, 2, 60)).astype(np.float32)
    vc = np.zeros((n, 1, KV_FORMATS["q8_0"].row_len(64)), np.int8)
    ops.write_kv(v, v, np.arange(n), vc, np.zeros_like(vc))
    args = (np.zeros(t, np.int64), np.arange(n - t, n), np.arange(n // 16, dtype=np.int32)[None], 16,
            np.float32(0.13), 0, np.float32(0.0), np.zeros(0, np.float32))
    got, want = np.zeros((t, 2, 64), np.float32), np.zeros((t, 2, 64), np.float32)
    attention.paged_attention(q, k, vc, *args, got, 2)
    vr = _read_q8(vc)
    attention.paged_attention(q, k, vr, *args, want, 2)
    np.testing.assert_array_equal(got, kv_rotation.rotated(want, 64))
    np.testing.assert_allclose(got, _softmax_attention(q, k, v, 0.13, n - t), atol=0.03)


def _read_q8(c):
    from numba import njit

    from edgeinfer.kernels.cpu import ops

    @njit
    def read(c, out):
        for s in range(out.shape[0]):
            for g in range(out.shape[1]):
                for i in range(out.shape[2]):
                    out[s, g, i] = ops.kv_load(c, s, g, i)

    out = np.zeros(c.shape[:2] + (c.shape[2] * 16 // 17,), np.float32)
    read(c, out)
    return out


def _softmax_attention(q, k, v, scale, first):
    # plain causal attention in float64 (one KV head): query t at position first + t
    out = np.zeros(q.shape[:2] + (v.shape[2],))
    for t in range(q.shape[0]):
        s = np.einsum("hd,nd->hn", q[t], k[:first + t + 1, 0]) * scale
        p = np.exp(s - s.max(1, keepdims=True))
        out[t] = (p / p.sum(1, keepdims=True)) @ v[:first + t + 1, 0]
    return out
