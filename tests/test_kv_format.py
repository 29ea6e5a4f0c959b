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

    assert units.KV_DTYPES == {name: f.storage for name, f in KV_FORMATS.items()}
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
