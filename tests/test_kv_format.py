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
    """Attention over a cache whose K rows are q8_0 and V rows f16 (or any other pair): the same bits as over
    float32 K and V holding the values those rows hold (and, for q8_0 keys, the queries as q8_0 values)."""
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

    for kt, vt in (("q8_0", "f16"), ("f16", "q8_0"), ("f32", "q8_0"), ("q8_0", "f32")):
        kc, vc = cache(kt, k), cache(vt, v)
        got, want = np.zeros((t, h, d), np.float32), np.zeros((t, h, d), np.float32)
        attention.paged_attention(q, kc, vc, *args, got)
        attention.paged_attention(attention.q8_values(q) if kt == "q8_0" else q, values(kt, kc), values(vt, vc),
                                  *args, want)
        np.testing.assert_array_equal(got, want, err_msg=f"{kt}/{vt}")


def test_kv_type_names():
    from edgeinfer.config import EngineConfig, kv_type_name

    assert kv_type_name("q8_0") == "q8_0" and kv_type_name("q8_0/q8_0") == "q8_0"
    assert kv_type_name("q8_0/f16") == "q8_0/f16"
    assert kv_type_name("q8_0/") == "q8_0/f16" and kv_type_name("/q8_0", "f32") == "f32/q8_0"  # a side not given
    assert EngineConfig(kv_dtype="f16/f16").kv_dtype == "f16" and EngineConfig().kv_dtype == "f16"
    with pytest.raises(ValueError, match="KV type 'q4_0' is not one of f32, f16, q8_0"):
        EngineConfig(kv_dtype="f16/q4_0")
    with pytest.raises(ValueError, match="CUDA backend has no f32/f16 KV cache"):
        EngineConfig(backend="cuda", kv_dtype="f32/f16")
