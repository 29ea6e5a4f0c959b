"""The CUDA backend (numba.cuda): the CPU backend's functions over device arrays.

Weights are uploaded once, in their repacked quantized form (the same fields as kernels/cpu), and decoded inside
the kernels; activations and the (float32) KV cache live on the device; logits come back to the host for sampling.
Kernels give one thread to each output element (or row): simple and exact, and the place to start tiling for speed.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import kinds
from ..kv_format import KV_FORMATS  # noqa: F401  (the KV cache's row formats, for the engine; f32 only here)
from . import quant
from ..cpu.mask import mask_logits  # noqa: F401  (on the host: the sampler reads host logits)
from ..cpu.ops import rotate_pair

NAME = "cuda"
MAX_HEAD_DIM = 512  # per-thread accumulator in paged attention

_bits = np.arange(65536, dtype=np.uint32)
HALF_TO_F32 = np.stack([_bits.astype(np.uint16).view(np.float16).astype(np.float32), (_bits << 16).view(np.float32)])
del _bits
_LUTS = None


def check_available() -> None:
    if not cuda.is_available():
        raise RuntimeError(
            "the CUDA backend needs an NVIDIA GPU with a working driver, and none was found "
            "(numba.cuda.is_available() is False; on a machine without a GPU, use the cpu backend)"
        )


def _on_device(a) -> bool:
    return hasattr(a, "copy_to_host")  # device arrays, real or simulated


def _luts():
    global _LUTS
    if _LUTS is None:
        _LUTS = cuda.to_device(HALF_TO_F32)
    return _LUTS


def _blocks(n: int, per: int = 128) -> int:
    return max(1, (n + per - 1) // per)


class DeviceWeight:
    """A repacked weight matrix W (N, K) on the device; kind kinds.F32 is a float32 matrix."""

    def __init__(self, kind: int, shape, **fields):
        self.kind = kind
        self.shape = tuple(shape)
        for k, v in fields.items():
            setattr(self, k, v)


def _dev(a: np.ndarray):
    a = np.ascontiguousarray(a)
    if a.size == 0:  # keep a (N, 1) placeholder: zero-size device arrays are awkward to pass
        a = np.zeros(a.shape[:-1] + (1,), a.dtype)
    return cuda.to_device(a)


def interleaves(kind: int) -> bool:
    """The CUDA kernels read the row-major layout (quant/repack.py) of every kind."""
    return False


def upload(a):
    if hasattr(a, "kind") and hasattr(a, "qs"):
        return DeviceWeight(a.kind, a.shape, qs=_dev(a.qs), qh=_dev(a.qh), sc=_dev(a.sc), d=_dev(a.d), m=_dev(a.m))
    a = np.ascontiguousarray(a)
    if a.ndim == 2 and a.dtype == np.float32:
        return DeviceWeight(kinds.F32, a.shape, w=cuda.to_device(a))
    return cuda.to_device(a)


def _grid2(a: int, b: int):
    tb = (16, 16)
    return (_blocks(a, 16), _blocks(b, 16)), tb


def precompile(kinds, kv_type: str, stream=None, experts: bool = False, mixers: tuple = (), later: bool = False):
    """The CPU backend compiles its kernels ahead in worker processes; numba.cuda compiles each kernel
    at its first launch, so there is nothing to start here."""
    return None


def ready() -> None:
    return None


def show_compile_progress(stream=None) -> None:
    """numba.cuda compiles each kernel at its first launch, in a moment: there is no status line to show."""
    return None


def kind_of(kind: int) -> int:
    return kind


def layer_stack(cfg, layers, inv_freqs, **flags):
    """No compiled whole-model step here: the models run their per-op forward on this backend."""
    return None


def quantize_input(x):
    """x (T, K) prepared for several matmuls: the CUDA kernels read float32 activations as they are."""
    return x


def matmul_many(ws, x) -> list:
    return [matmul(w, x) for w in ws]  # one launch each


def matmul(w, x, out=None):
    # W (N, K) @ x (T, K) -> out (T, N)
    t, n = x.shape[0], w.shape[0]
    if out is None:
        out = cuda.device_array((t, n), np.float32)
    grid, tb = _grid2(n, t)
    if w.kind == kinds.F32:
        quant.matmul_f32[grid, tb](w.w, x, out)
    else:
        quant.matmul_q[grid, tb](w.kind, w.qs, w.qh, w.sc, w.d, w.m, _luts(), x, out)
    return out


def embed(w, ids):
    # rows of W (V, D) for ids (T,) -> (T, D)
    ids = ids if _on_device(ids) else cuda.to_device(np.ascontiguousarray(ids, np.int64))
    out = cuda.device_array((ids.shape[0], w.shape[1]), np.float32)
    grid, tb = _grid2(ids.shape[0], w.shape[1])
    if w.kind == kinds.F32:
        quant.embed_f32[grid, tb](w.w, ids, out)
    else:
        quant.embed_q[grid, tb](w.kind, w.qs, w.qh, w.sc, w.d, w.m, _luts(), ids, out)
    return out


def dequantize(w) -> np.ndarray:
    if w.kind == kinds.F32:
        return w.w.copy_to_host()
    out = embed(w, cuda.to_device(np.arange(w.shape[0], dtype=np.int64)))
    return out.copy_to_host()


# -- norms, rope, attention, activations -------------------------------------------------------


@cuda.jit
def _rmsnorm(x, w, eps, out):
    # x (R, D) * w / rms(x) -> out; one thread per row
    r = cuda.grid(1)
    if r < x.shape[0]:
        ss = float32(0.0)
        for i in range(x.shape[1]):
            ss += x[r, i] * x[r, i]
        inv = float32(1.0) / math.sqrt(ss / x.shape[1] + eps)
        for i in range(x.shape[1]):
            out[r, i] = x[r, i] * inv * w[i]


def rmsnorm(x, w, eps, out):
    _rmsnorm[_blocks(x.shape[0]), 128](x, w, np.float32(eps), out)


_rotate_pair = cuda.jit(device=True)(rotate_pair)  # the CPU's pair rotation, as a device function


@cuda.jit
def _rope(x, positions, inv_freq, neox, mscale):
    # x (T, H, D) in place; one thread per (token, head); cos and sin times mscale (see the CPU rope)
    t, h = cuda.grid(2)
    if t < x.shape[0] and h < x.shape[1]:
        half = inv_freq.shape[0]
        for i in range(half):
            ang = float32(positions[t]) * inv_freq[i]
            c = math.cos(ang) * mscale
            s = math.sin(ang) * mscale
            if neox:
                _rotate_pair(x, t, h, i, i + half, c, s)
            else:
                _rotate_pair(x, t, h, 2 * i, 2 * i + 1, c, s)


def rope(x, positions, inv_freq, neox, mscale=1.0):
    grid, tb = _grid2(x.shape[0], x.shape[1])
    _rope[grid, tb](x, positions, inv_freq, bool(neox), np.float32(mscale))


@cuda.jit
def _write_kv(k, v, slots, kc, vc):
    t = cuda.grid(1)
    if t < k.shape[0]:
        s = slots[t]
        for g in range(k.shape[1]):
            for i in range(k.shape[2]):
                kc[s, g, i] = k[t, g, i]
            for i in range(v.shape[2]):
                vc[s, g, i] = v[t, g, i]


def write_kv(k, v, slot_mapping, k_cache, v_cache):
    _write_kv[_blocks(k.shape[0]), 128](k, v, slot_mapping, k_cache, v_cache)


@cuda.jit
def _paged_attention(q, kc, vc, token_seq, positions, tables, bs, scale, window, softcap, out):
    # q (T, H, D), caches (n_slots, KVH, D); one thread per (token, head), online softmax
    t, h = cuda.grid(2)
    if t < q.shape[0] and h < q.shape[1]:
        g = h // (q.shape[1] // kc.shape[1])
        pos = positions[t]
        row = token_seq[t]
        lo = 0
        if window > 0 and pos - window + 1 > 0:
            lo = pos - window + 1
        acc = cuda.local.array(MAX_HEAD_DIM, float32)
        dv = vc.shape[2]
        for i in range(dv):
            acc[i] = 0.0
        mx = -math.inf
        denom = float32(0.0)
        for j in range(lo, pos + 1):
            slot = tables[row, j // bs] * bs + j % bs
            s = float32(0.0)
            for i in range(q.shape[2]):
                s += q[t, h, i] * kc[slot, g, i]
            s *= scale
            if softcap > 0:
                s = softcap * math.tanh(s / softcap)
            if s > mx:
                corr = math.exp(mx - s)
                denom *= corr
                for i in range(dv):
                    acc[i] *= corr
                mx = s
            p = math.exp(s - mx)
            denom += p
            for i in range(dv):
                acc[i] += p * vc[slot, g, i]
        for i in range(dv):
            out[t, h, i] = acc[i] / denom


def paged_attention(q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window, softcap, out, sinks=None):
    if v_cache.shape[2] > MAX_HEAD_DIM or q.shape[2] > MAX_HEAD_DIM or sinks is not None:
        raise ValueError(f"the CUDA backend handles head sizes up to {MAX_HEAD_DIM} and no attention sinks yet")
    grid, tb = _grid2(q.shape[0], q.shape[1])
    _paged_attention[grid, tb](q, k_cache, v_cache, token_seq, positions, block_tables, int(block_size),
                               np.float32(scale), int(window), np.float32(softcap), out)


@cuda.jit
def _silu_mul(g, u, out):
    t, i = cuda.grid(2)
    if t < g.shape[0] and i < g.shape[1]:
        x = g[t, i]
        out[t, i] = x / (float32(1.0) + math.exp(-x)) * u[t, i]


@cuda.jit
def _gelu_tanh_mul(g, u, out):
    t, i = cuda.grid(2)
    if t < g.shape[0] and i < g.shape[1]:
        x = g[t, i]
        c = float32(0.7978845608028654)  # sqrt(2 / pi)
        out[t, i] = float32(0.5) * x * (float32(1.0) + math.tanh(c * (x + float32(0.044715) * x * x * x))) * u[t, i]


def silu_mul(g, u, out):
    grid, tb = _grid2(g.shape[0], g.shape[1])
    _silu_mul[grid, tb](g, u, out)


def gelu_tanh_mul(g, u, out):
    grid, tb = _grid2(g.shape[0], g.shape[1])
    _gelu_tanh_mul[grid, tb](g, u, out)


@cuda.jit
def _softcap(x, cap):
    r, i = cuda.grid(2)
    if r < x.shape[0] and i < x.shape[1]:
        x[r, i] = cap * math.tanh(x[r, i] / cap)


def softcap(x, cap):
    grid, tb = _grid2(x.shape[0], x.shape[1])
    _softcap[grid, tb](x, np.float32(cap))


# -- sampling helpers ---------------------------------------------------------------------------


@cuda.jit
def _argmax_rows(x, out):
    r = cuda.grid(1)
    if r < x.shape[0]:
        best = 0
        for i in range(1, x.shape[1]):
            if x[r, i] > x[r, best]:
                best = i
        out[r] = best


@cuda.jit
def _log_softmax_rows(x, out):
    r = cuda.grid(1)
    if r < x.shape[0]:
        mx = x[r, 0]
        for i in range(1, x.shape[1]):
            mx = max(mx, x[r, i])
        s = float32(0.0)
        for i in range(x.shape[1]):
            s += math.exp(x[r, i] - mx)
        lse = mx + math.log(s)
        for i in range(x.shape[1]):
            out[r, i] = x[r, i] - lse


def argmax_rows(x) -> np.ndarray:
    x = x if _on_device(x) else cuda.to_device(np.ascontiguousarray(x, np.float32))
    out = cuda.device_array(x.shape[0], np.int64)
    _argmax_rows[_blocks(x.shape[0]), 128](x, out)
    return out.copy_to_host()


def log_softmax_rows(x) -> np.ndarray:
    x = x if _on_device(x) else cuda.to_device(np.ascontiguousarray(x, np.float32))
    out = cuda.device_array(x.shape, np.float32)
    _log_softmax_rows[_blocks(x.shape[0]), 128](x, out)
    return out.copy_to_host()


# -- arrays --------------------------------------------------------------------------------------


@cuda.jit
def _fill(a, value):
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] = value


@cuda.jit
def _add(x, y):
    r, c = cuda.grid(2)
    if r < x.shape[0] and c < x.shape[1]:
        x[r, c] += y[r, c]


@cuda.jit
def _add_bias(x, b):
    r, c = cuda.grid(2)
    if r < x.shape[0] and c < x.shape[1]:
        x[r, c] += b[c]


@cuda.jit
def _scale(x, s):
    r, c = cuda.grid(2)
    if r < x.shape[0] and c < x.shape[1]:
        x[r, c] *= s


@cuda.jit
def _relu_sqr(x):
    r, c = cuda.grid(2)
    if r < x.shape[0] and c < x.shape[1]:
        v = max(x[r, c], np.float32(0.0))
        x[r, c] = v * v


@cuda.jit
def _take_rows(x, idx, out):
    r, c = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = x[idx[r], c]


def zeros(shape, dtype=np.float32):
    a = cuda.device_array(shape, dtype)
    if a.size:  # (no window pool: an empty one; a launch of no blocks is an error)
        _fill[_blocks(a.size, 256), 256](a.reshape(a.size), 0)
    return a


def empty(shape, dtype=np.float32):
    return cuda.device_array(shape, dtype)


def to_host(a) -> np.ndarray:
    return a.copy_to_host() if _on_device(a) else np.asarray(a)


def add_(x, y) -> None:
    grid, tb = _grid2(x.shape[0], x.shape[1])
    _add[grid, tb](x, y)


def add_bias_(x, b) -> None:
    grid, tb = _grid2(x.shape[0], x.shape[1])
    _add_bias[grid, tb](x, b)


def scale_(x, s: float) -> None:
    grid, tb = _grid2(x.shape[0], x.shape[1])
    _scale[grid, tb](x, np.float32(s))


def relu_sqr_(x) -> None:
    grid, tb = _grid2(x.shape[0], x.shape[1])
    _relu_sqr[grid, tb](x)


def take_rows(x, idx):
    out = cuda.device_array((idx.shape[0], x.shape[1]), np.float32)
    grid, tb = _grid2(idx.shape[0], x.shape[1])
    _take_rows[grid, tb](x, idx, out)
    return out


class _DeviceBatch:  # the engine's Batch on the device (window_*: a window pool's slots and tables)
    __slots__ = ("token_ids", "positions", "token_seq", "slot_mapping", "block_tables", "logits_idx", "window_slots",
                 "window_tables")


def prepare_batch(batch):
    d = _DeviceBatch()
    for name in _DeviceBatch.__slots__:
        setattr(d, name, cuda.to_device(np.ascontiguousarray(getattr(batch, name))))
    return d


def kv_store(x, dtype: str):
    if dtype != "f32":
        raise ValueError(f"the CUDA backend has no {dtype} KV cache yet: use kv_type 'f32'")
    return x


def set_threads(n: int) -> None:
    pass  # the GPU schedules its own threads
