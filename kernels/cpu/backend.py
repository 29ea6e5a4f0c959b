"""The CPU backend: the kernel interface the models call (see kernels/__init__.py)."""

from __future__ import annotations

import numba
import numpy as np

from .. import kinds
from ..kv_format import KV_FORMATS  # noqa: F401  (the KV cache's row formats, for the engine)
from . import background, int8, moe, quant, simd, units
from . import attention
from .dense import GELU_F16, dense, encoder_attention, gelu_, layernorm, set_blas_threads, silu  # noqa: F401
from .layout import INTERLEAVED, interleave8
from .lora import Adapted, Rows, lora_embed_add, pack as lora_pack, warm_up as lora_warm_up  # noqa: F401  (adapters beside matrices, for the models)
from .mask import mask_logits  # noqa: F401  (a sampling helper: structured output's mask)
from .ops import (attn_temperature, gelu_tanh_mul, rmsnorm, rope, sigmoid_mul_, silu_mul, softcap, swiglu_oai,  # noqa: F401
                  write_kv)
from .recurrent import delta_rule, gated_group_norm, norm_gate, shortconv, ssm_conv, ssm_scan  # noqa: F401

NAME = "cpu"
# The instruction-set path of the int8 kernels, chosen once from the host CPU (or EDGEINFER_KERNELS).
KERNEL_PATH = simd.choose_path()
# The path of the kernels of matmuls of a few tokens (a decode step): simd.small_path.
SMALL_PATH = simd.small_path(KERNEL_PATH)
# the addresses of these paths' separately compiled kernel units (units.py), filled as models need them
UNITS = units.Table(KERNEL_PATH, SMALL_PATH, background.done)


class QInput:
    """A matmul input x (T, K) float32 and, made on first use, its int8 quantizations: Q8 (32-blocks)
    for the legacy weight types, Q8_K (256-blocks) for the K-quants. One serves every matrix that
    reads the same input (q/k/v, gate/up)."""

    __slots__ = ("x", "_q8", "_q8k")

    def __init__(self, x: np.ndarray):
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self._q8 = self._q8k = None

    @property
    def shape(self):
        return self.x.shape

    def q8(self):
        # (xq (T, K) int8 as uint8, xd (T, K/32) float32, xs (T, K/32) float32 d * sum(q))
        if self._q8 is None:
            t, k = self.x.shape
            self._q8 = (np.empty((t, k), np.uint8), np.empty((t, k // 32), np.float32), np.empty((t, k // 32), np.float32))
            int8.quantize_q8(self.x, *self._q8)
        return self._q8

    def q8k(self):
        # (xq (T, K) int8 as uint8, xd (T, K/256) float32, xb (T, K/32) and xb16 (T, K/16) int32 sums)
        if self._q8k is None:
            t, k = self.x.shape
            self._q8k = (np.empty((t, k), np.uint8), np.empty((t, k // 256), np.float32), np.empty((t, k // 32), np.int32),
                         np.empty((t, k // 16), np.int32))
            int8.quantize_q8k(self.x, *self._q8k)
        return self._q8k


def quantize_input(x) -> QInput:
    """x (T, K) prepared once for several matmuls that read it."""
    return x if isinstance(x, QInput) else QInput(x)

def _fields(w):
    return w.kind, w.qs, w.qh, w.sc, w.d, w.m, quant.HALF_TO_F32


def matmul(w, x, out: np.ndarray | None = None) -> np.ndarray:
    # W (N, K) @ x (T, K) -> out (T, N). W: a repacked QTensor or a float32 ndarray; x: float32 or a QInput.
    qx = quantize_input(x)
    if isinstance(w, Adapted):  # the matrix, then its adapters' low-rank products (lora.py)
        out = matmul(w.base, qx, out)
        w.add(qx.x, out)
        return out
    if isinstance(w, np.ndarray):
        return np.matmul(qx.x, w.T, out=out)
    if out is None:
        out = np.empty((qx.shape[0], w.shape[0]), np.float32)
    # Each kernel reduces every output element in one fixed order, whatever the batch, and each
    # token's activation is quantized alone: batched and solo generation agree bit for bit.
    if kinds.is_dense(w.kind):
        quant.matmul_half(w.kind, w.d, quant.HALF_TO_F32, qx.x, out)
    else:
        matmul_int8(w, qx, out, UNITS.for_kinds((w.kind,)))
    return out


def matmul_many(ws, x) -> list:
    """[W_j @ x for W_j in ws]: up to three matrices reading the same x (q/k/v, gate/up, a recurrent layer's
    projections) in one parallel region of the int8 kernels, the same bits as matmul on each; float
    matrices (or more than three) one by one."""
    qx = quantize_input(x)
    if any(isinstance(w, Adapted) for w in ws):
        outs = matmul_many([w.base if isinstance(w, Adapted) else w for w in ws], qx)
        for w, out in zip(ws, outs):
            if isinstance(w, Adapted):
                w.add(qx.x, out)
        return outs
    if not 1 < len(ws) <= 3 or any(isinstance(w, np.ndarray) or kinds.is_dense(w.kind) for w in ws):
        return [matmul(w, qx) for w in ws]
    outs = [np.empty((qx.shape[0], w.shape[0]), np.float32) for w in ws]
    q8k = [kinds.uses_q8k(w.kind) for w in ws]
    q8 = qx.q8() if not all(q8k) else _NO_Q8
    q8kx = qx.q8k() if any(q8k) else _NO_Q8K
    wt = [int8.as_tuple(w) for w in ws]
    wt += wt[:1] * (3 - len(ws))
    o = outs + outs[:1] * (3 - len(ws))
    int8.matmuls(wt[0], wt[1], wt[2], len(ws), q8, q8kx, quant.HALF_TO_F32, o[0], o[1], o[2], numba.get_num_threads(),
                 UNITS.for_kinds(tuple(w.kind for w in ws)))
    return outs


def matmul_int8(w, qx: QInput, out: np.ndarray, table: np.ndarray) -> None:
    # W (N, K) quantized @ qx (T, K) -> out (T, N) (C-contiguous), through the units in `table` (units.Table)
    q8, q8k = (_NO_Q8, qx.q8k()) if kinds.uses_q8k(w.kind) else (qx.q8(), _NO_Q8K)
    wt = int8.as_tuple(w)
    int8.matmuls(wt, wt, wt, 1, q8, q8k, quant.HALF_TO_F32, out, out, out, numba.get_num_threads(), table)


# stand-ins for the activation format a matrix does not read
_NO_Q8 = (np.empty((0, 0), np.uint8), np.empty((0, 0), np.float32), np.empty((0, 0), np.float32))
_NO_Q8K = (np.empty((0, 0), np.uint8), np.empty((0, 0), np.float32), np.empty((0, 0), np.int32),
           np.empty((0, 0), np.int32))


def precompile(kinds, kv_type: str, stream=None, experts: bool = False, mixers: tuple = (), later: bool = False):
    """Start compiling, in worker processes, the kernels a model with matrices of these kinds (as this
    backend holds them: `kind_of`), this KV type, (experts) a mixture of experts and these recurrent mixers
    needs and the cache lacks (parallel_compile.py); `ready` waits for it. later: a first answer need not
    wait for the compiled step (it compiles in the background: `step_ready`)."""
    from . import parallel_compile

    return parallel_compile.start(KERNEL_PATH, kinds, [kv_type], stream=stream, small_path=SMALL_PATH,
                                  experts=experts, mixers=tuple(mixers), later=later)


def kind_of(kind: int) -> int:
    """The kind a quantized matrix of row-major `kind` (quant/repack.py) has once uploaded here."""
    return INTERLEAVED[kind] if interleaves(kind) else kind


def ready() -> None:
    """Return once every compile `precompile` started is done (before the first forward pass), but for
    what only the compiled step needs, which a first run compiles in the background (`step_ready`)."""
    from . import parallel_compile

    parallel_compile.wait_all()


def step_ready() -> bool:
    """Whether the compiled step may run (layer_stack's): until a first run's background compile of it
    (background.py) is done, the models run per op, with the same bits."""
    return background.done()


def show_compile_progress(stream=None) -> None:
    """From now on, a status line on stderr (or `stream`) whenever kernels compile (a first run, or a new
    model's weight types; later runs load them from Numba's cache). Idempotent."""
    from . import compile_status

    compile_status.show_progress(stream)


def layer_stack(cfg, layers, inv_freqs, **flags):
    """The model's layers as one compiled call (step.LayerStack), or None where that cannot run them.
    inv_freqs: each layer's RoPE inverse frequencies; flags: the architecture's (ArchSpec.stack_flags)."""
    from .step import LayerStack

    if not cfg.rope:  # NoPE: no frequencies, so RoPE rotates nothing (nor scales by rope_mscale): q, k as they are
        inv_freqs = [np.zeros(0, np.float64) for _ in inv_freqs]
    mats = [getattr(lw, name) for lw in layers for name in LayerStack.MATS]
    mats += [w for lw in layers for name in ("exp_gate", "exp_up", "exp_down") for w in (getattr(lw, name) or ())]
    quantized = {k for w in mats if (k := getattr(w, "kind", None)) is not None and kinds.is_quantized(k)}
    return LayerStack.build(cfg, layers, inv_freqs, UNITS, quantized, **flags)


def altup_stack(cfg, layers, inv_freqs, sparse_layers: int, sparse_std, **flags):
    """Gemma 3n's layers as one compiled call: (step.LayerStack, altup.AltupPart) for altup.run, or None where
    that cannot run them (a float matrix, LAuReL's not F16/BF16)."""
    from . import altup

    stack = layer_stack(cfg, layers, inv_freqs, **flags)
    part = None if stack is None else altup.build(cfg, layers, sparse_layers, sparse_std)
    return None if part is None else (stack, part)


def altup_run(stack, streams, batch, cache, ple) -> np.ndarray:
    """streams (n, T, dim) through every layer of altup_stack's `stack` -> the kept rows of each (n, L, dim)."""
    from . import altup

    return altup.run(*stack, streams, batch, cache, ple)


def altup_modalities(x, router_norm, router, eps) -> np.ndarray:
    """Gemma 3n's router: tanh(router . rmsnorm(x) / dim) of x (T, dim) -> (T, n) (altup.modalities)."""
    from . import altup

    out = np.empty((x.shape[0], router.shape[0]), np.float32)
    altup.modalities(x, router_norm, router, np.float32(eps), out)
    return out


def altup_predict(streams, mod, coef) -> np.ndarray:
    """Every stream (n, T, dim) predicted from all of them by the modalities mod (T, n) (altup.predict)."""
    from . import altup

    out = np.empty_like(streams)
    altup.predict(streams, mod, coef, out)
    return out


def altup_correct(pred, act, active: int, mod, coef) -> np.ndarray:
    """Every prediction (n, T, dim) moved by the innovation of act (T, dim) (altup.correct)."""
    from . import altup

    out = np.empty_like(pred)
    altup.correct(pred, act, active, mod, coef, out)
    return out


def sparsify_(g, std_mul) -> None:
    """Each row of g less its mean + std_mul standard deviations, cut at 0, in place (Gemma 3n's FFN gates)."""
    from . import altup

    altup.sparsify(g, np.float32(std_mul))


# -- mixture of experts (moe.py) --------------------------------------------------------------------


def moe_route(h, router_t, k: int, norm_w: bool, w_scale: float):
    """h (T, D), router_t (D, E) float32 (transposed) -> (ids (T, k) int64, weights (T, k) float32): each
    token's k experts."""
    t = h.shape[0]
    ids, wts = np.empty((t, k), np.int64), np.empty((t, k), np.float32)
    moe.route(np.ascontiguousarray(h), router_t, np.int64(k), bool(norm_w), np.float32(w_scale), ids, wts)
    return ids, wts


def moe_route_scored(h, router_t, k: int, sigmoid: bool, bias, norm_w: bool, w_scale: float):
    """moe_route with a sigmoid (or softmax) gating and a per-expert selection bias (E,) (lfm2moe)."""
    t = h.shape[0]
    ids, wts = np.empty((t, k), np.int64), np.empty((t, k), np.float32)
    moe.route_scored(np.ascontiguousarray(h), router_t, np.int64(k), bool(sigmoid), bias, bool(norm_w),
                     np.float32(w_scale), ids, wts)
    return ids, wts


def moe_route_topk_softmax(h, router_t, bias, k: int):
    """gpt-oss's routing: the k largest of the logits plus the router's bias (E,), weighted by a softmax over those k."""
    t = h.shape[0]
    ids, wts = np.empty((t, k), np.int64), np.empty((t, k), np.float32)
    moe.route_topk_softmax(np.ascontiguousarray(h), router_t, bias, np.int64(k), ids, wts)
    return ids, wts


def moe_plan(ids, n_expert: int):
    """ids (T, k) -> (offsets (E + 1,), order (T * k,), pos (T, k)): the (token, slot) pairs sorted by expert."""
    return moe.plan(ids, np.int64(n_expert))


def moe_combine(y, pos, wts, out) -> None:
    """out[t] = sum_j wts[t, j] * y[pos[t, j]], in slot order."""
    moe.combine(np.ascontiguousarray(y), pos, wts, out)


def moe_shared_add(out, s, h, w_gate) -> None:
    """out += sigmoid(h . w_gate) * s, per token (qwen2moe's shared expert)."""
    moe.shared_gate_add(out, np.ascontiguousarray(s), np.ascontiguousarray(h), w_gate)


def embed(w, ids: np.ndarray) -> np.ndarray:
    # rows of W (V, D) for ids (T,) -> (T, D) float32
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if isinstance(w, np.ndarray):
        return w[ids].astype(np.float32)
    out = np.empty((ids.shape[0], w.shape[1]), np.float32)
    units.embedding_unit(w.kind)(*_fields(w), ids, out)  # a unit of this kind's decode alone
    return out


def dequantize(w) -> np.ndarray:
    # the whole W (N, K) as float32 (tests and the quantize tool; never on the inference path)
    if isinstance(w, np.ndarray):
        return w.astype(np.float32)
    out = np.empty(w.shape, np.float32)
    quant.dequant_rows(*_fields(w), np.arange(w.shape[0], dtype=np.int64), out)
    return out


# -- sampling helpers -----------------------------------------------------------------------------


def argmax_rows(x) -> np.ndarray:
    # (R, V) -> (R,) int64
    return np.argmax(np.asarray(x), axis=1)


def log_softmax_rows(x) -> np.ndarray:
    # (R, V) -> (R, V) float32
    x = np.asarray(x, np.float64)
    m = x.max(axis=1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))).astype(np.float32)


# -- arrays: the CPU backend works on numpy arrays in place ---------------------------------------


def zeros(shape, dtype=np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)


def empty(shape, dtype=np.float32) -> np.ndarray:
    return np.empty(shape, dtype)


def interleaves(kind: int) -> bool:
    """Whether this backend keeps quantized matrices of row-major `kind` in the interleaved layout
    (layout.py): the loader may then build that layout straight from the file (quant.repack_interleaved)."""
    return kind in INTERLEAVED and KERNEL_PATH != "portable"


def upload(a):
    """A weight or constant, placed where the kernels read it: numpy arrays stay as they are; on the SIMD
    paths, quantized matrices are regrouped eight rows at a time, in place (layout.interleave8)."""
    if not isinstance(a, np.ndarray) and getattr(a, "kind", None) in INTERLEAVED and KERNEL_PATH != "portable":
        return interleave8(a, inplace=True)  # the loader drops the row-major copy
    return a


def prepare_batch(batch):
    """A Batch's index arrays, placed where the kernels read them."""
    return batch


def to_host(a) -> np.ndarray:
    return a


def add_(x, y) -> None:
    # x += y, (R, D)
    x += y


_NO_SINKS = np.zeros(0, np.float32)


def paged_attention(q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window, softcap, out,
                    sinks=None) -> None:
    """Paged attention (attention.paged_attention) -> out (T, H, Dv); sinks (H,) float32: each head's attention
    sink (gpt-oss), None: none."""
    attention.paged_attention(q, k_cache, v_cache, token_seq, positions, block_tables, block_size, scale, window,
                              softcap, _NO_SINKS if sinks is None else sinks, out, numba.get_num_threads())


def add_bias_(x, b) -> None:
    # x += b, b (D,) added to every row of x (R, D)
    x += b


def scale_(x, s: float) -> None:
    # x *= s
    x *= np.float32(s)


def relu_sqr_(x) -> None:
    # x = relu(x)^2, in place (Nemotron-H's feed-forward activation)
    np.maximum(x, np.float32(0.0), out=x)
    x *= x


def take_rows(x, idx):
    # x[idx] -> (len(idx), D)
    return x[idx]


def kv_store(x, dtype: str):
    """x (float32) in a form write_kv takes for a KV cache of `dtype`: float16 bits for "f16"; float32
    for "f32" and "q8_0" (write_kv quantizes each row into q8_0 blocks)."""
    return x.astype(np.float16).view(np.uint16) if dtype == "f16" else x


def set_threads(n: int) -> None:
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))
    set_blas_threads(max(1, int(n)))  # encoder models' matmuls
