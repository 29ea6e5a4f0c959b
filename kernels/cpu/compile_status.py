"""Whether numba's on-disk cache holds the CPU kernels yet, and a warm-up that compiles them all."""

from __future__ import annotations

import glob
import os

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))


def _cache_dirs() -> list[str]:
    import numba

    # NUMBA_CACHE_DIR, or the source-hash directory kernels/cpu/__init__.py chose
    return [numba.config.CACHE_DIR or os.path.join(_HERE, "__pycache__")]


def is_cached() -> bool:
    """True when compiled versions of the main kernels are on disk (a later run just loads them)."""
    for d in _cache_dirs():
        if glob.glob(os.path.join(d, "**", "step.forward_layers-*.nbi"), recursive=True) and \
                glob.glob(os.path.join(d, "**", "attention.paged_attention-*.nbi"), recursive=True):
            return True
    return False


def warmup() -> None:
    """Compile (or load from cache) every CPU kernel with the argument types the runtime uses."""
    from . import attention, ops, quant

    luts = quant.HALF_TO_F32
    u8 = np.zeros((2, 128), np.uint8)
    u16 = np.zeros((2, 8), np.uint16)
    y = np.zeros((2, 256), np.float32)
    quant.dequant_rows(2, u8, u8, u8, u16, u16, luts, np.zeros(1, np.int64), y[:1])
    from types import SimpleNamespace

    from . import backend

    # zero weights shaped generously for every layout: same array types as repacked tensors
    for kind in range(10):  # every matmul family, for one token and for several
        w = SimpleNamespace(kind=kind, shape=(2, 256), qs=np.zeros((2, 256), np.uint8), qh=np.zeros((2, 32), np.uint8),
                            sc=np.zeros((2, 16), np.uint8), d=np.zeros((2, 256), np.uint16),
                            m=np.zeros((2, 256), np.uint16))
        for tokens in (1, 2):
            backend.matmul(w, np.zeros((tokens, 256), np.float32))
    x = np.ones((2, 8), np.float32)
    ops.rmsnorm(x, np.ones(8, np.float32), 1e-5, x)
    q = np.ones((2, 2, 8), np.float32)
    ops.rope(q, np.zeros(2, np.int64), np.ones(4), True)
    ops.rope(q[:, :, :4], np.zeros(2, np.int64), np.ones(2), False)
    kc = np.zeros((16, 1, 8), np.float32)
    ops.write_kv(q[:, :1], q[:, :1], np.arange(2, dtype=np.int64), kc, kc)
    out = np.zeros((2, 2, 8), np.float32)
    for cache in (kc, kc.view(np.uint16)[:, :, :8]):  # float32 and float16-bits KV caches
        cache = np.ascontiguousarray(cache)
        ops.write_kv(cache[:2], cache[:2], np.arange(2, dtype=np.int64), cache, cache)
        attention.paged_attention(q, cache, cache, np.zeros(2, np.int64), np.arange(2, dtype=np.int64),
                                  np.zeros((1, 1), np.int32), 16, np.float32(0.3), 0, np.float32(0.0), out)
    _warm_step(backend)
    ops.silu_mul(x, x, x)
    ops.gelu_tanh_mul(x, x, x)
    ops.softcap(x, np.float32(30.0))


def _warm_step(backend) -> None:
    """The compiled layer step (step.py), on a one-layer stand-in model of zero Q8_0 weights: one compile
    covers every weight type, since the step dispatches on each matrix's kind as it runs."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(n_layer=1, dim=256, n_head=2, n_kv_head=1, head_dim=128, v_head_dim=128, ffn_dim=256,
                          rope_dim=128, rope_neox=True, norm_eps=1e-6, attn_scale=None, attn_softcap=0.0,
                          sliding_window=0, is_sliding=lambda layer: False)

    def q8_0(n, k):
        return SimpleNamespace(kind=2, shape=(n, k), qs=np.zeros((n, k), np.uint8), qh=np.zeros((n, 0), np.uint8),
                               sc=np.zeros((n, 0), np.uint8), d=np.zeros((n, k // 32), np.uint16),
                               m=np.zeros((n, 0), np.uint16))

    layer = SimpleNamespace(wq=q8_0(256, 256), wk=q8_0(128, 256), wv=q8_0(128, 256), wo=q8_0(256, 256),
                            w_gate=q8_0(256, 256), w_up=q8_0(256, 256), w_down=q8_0(256, 256),
                            attn_norm=np.ones(256, np.float32), ffn_norm=np.ones(256, np.float32))
    stack = backend.layer_stack(cfg, [layer], [np.ones(64)])
    kv = np.zeros((1, 16, 1, 128), np.float32)
    cache = SimpleNamespace(k=kv, v=kv, block_size=16)
    one = np.zeros(1, np.int64)
    batch = SimpleNamespace(positions=one, token_seq=one, slot_mapping=one, block_tables=np.zeros((1, 1), np.int32),
                            logits_idx=one)
    stack.run(np.ones((1, 256), np.float32), batch, cache)
