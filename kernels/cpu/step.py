"""The compiled forward pass: every layer of a llama-family model in one compiled call.

The per-op forward (models/) makes about 20 Python-level kernel calls per layer; each costs
argument unboxing and dispatch, and most launch a parallel region for a few rows of work. Here one
compiled function walks all layers: up to six parallel regions per layer (q/k/v together, attention,
the output projection, gate/up together, the gated activation with its quantization for more than a few
rows, down; a mixture-of-experts layer: the router and the weighted sum, in parallel for many tokens,
and every active expert's gate/up in one region, its down in another) and the small row-wise ops (norms, quantization, RoPE, KV writes, residuals) between them, in plain loops for a few
rows and in parallel for many (PAR_ROWS), the same row functions the per-op kernels run. In the last
layer only the rows that get logits go on past the KV writes. Which ops run is read from the architecture's
config (q/k norms, post-norms, activation, NeoX RoPE, sliding windows), not from a second copy of
each model: the per-op forward stays the reference, and the tests hold the two to the same logits.

A :class:`LayerStack` gathers a model's weights once, at load, into what the compiled function takes:
the matrices in a typed list of (kind, qs, qh, sc, d, m) tuples, the norm weights stacked per layer.
A mixture-of-experts layer (moe.py) has its experts' matrices in a second typed list and its router
stacked with the others'; its FFN slots in the first list hold the shared expert, if any.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange, typed

from ..kinds import is_dense, uses_q8k
from . import int8, moe, ops, quant, units

# per layer, in this order; MATS matrices follow each other in the typed list
MATS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
# which quantization each matmul input needs, per layer: bit 0 Q8 (legacy types), bit 1 Q8_K (K-quants);
# a MoE layer's experts apart from its shared expert (the dense slots)
IN_QKV, IN_O, IN_GATE_UP, IN_DOWN, IN_EXP_GATE_UP, IN_EXP_DOWN = range(6)
_INPUT_OF = (IN_QKV, IN_QKV, IN_QKV, IN_O, IN_GATE_UP, IN_GATE_UP, IN_DOWN)


def _needs(kind: int) -> int:
    return 0 if is_dense(kind) else (2 if uses_q8k(kind) else 1)


class LayerStack:
    """A model's layers in the compiled step's form; None from :meth:`build` when a layer holds a
    float matrix."""

    MATS = MATS

    def __init__(self, cfg, layers, inv_freqs, table, kinds, qk_norm: int, post_norms: bool, gelu: bool,
                 qkv_bias: bool = False, pre_norms: bool = True, moe: bool = False, shared_expert: bool = False):
        n, dim, hd = cfg.n_layer, cfg.dim, cfg.head_dim
        self.table = table  # the kernel units (units.Table) of this process's path
        self.kinds = tuple(sorted(kinds))
        self._tables = {}  # KV cache dtype -> the int64 table of unit addresses the step takes
        self.needs = np.zeros((n, 6), np.int64)
        mats, experts = [], []
        for i, lw in enumerate(layers):
            for j, name in enumerate(MATS):
                w = getattr(lw, name)
                if w is None:  # a MoE layer without a shared expert: a stand-in, never read
                    w = lw.wo
                else:
                    self.needs[i, _INPUT_OF[j]] |= _needs(w.kind)
                mats.append(int8.as_tuple(w))
            if moe:
                for e in range(cfg.n_expert):
                    for j, w in enumerate((lw.exp_gate[e], lw.exp_up[e], lw.exp_down[e])):
                        experts.append(int8.as_tuple(w))
                        self.needs[i, IN_EXP_DOWN if j == 2 else IN_EXP_GATE_UP] |= _needs(w.kind)
        # typed lists built by cached compiled functions: typed.List's own methods, called from
        # Python, compile afresh in every process (a second of start-up)
        self.mats = _typed_list(mats)
        self.experts = _typed_list(experts or mats[:1])  # a stand-in for a dense model: never read

        def stack(name, size, fill=1.0):
            rows = [getattr(lw, name, None) for lw in layers]
            return np.stack([r if r is not None else np.full(size, fill, np.float32) for r in rows]).astype(np.float32)

        self.attn_norm = stack("attn_norm", dim)
        self.ffn_norm = stack("ffn_norm", dim)
        qn, kn = (cfg.n_head * hd, cfg.n_kv_head * hd) if qk_norm == 2 else (hd, hd)
        self.q_norm = stack("q_norm", qn)
        self.k_norm = stack("k_norm", kn)
        self.post_attn_norm = stack("post_attn_norm", dim)
        self.post_ffn_norm = stack("post_ffn_norm", dim)
        # q, k, v biases (qwen2); zeros, and skipped, elsewhere
        self.bias = (stack("bq", cfg.n_head * hd, 0.0), stack("bk", cfg.n_kv_head * hd, 0.0),
                     stack("bv", cfg.n_kv_head * cfg.v_head_dim, 0.0))
        e = cfg.n_expert if moe else 0
        self.router = np.stack([lw.router if moe else np.zeros((dim, 0), np.float32) for lw in layers]).astype(np.float32)
        self.sh_gate = stack("sh_gate", dim, 0.0)
        self.inv_freq = np.stack([np.asarray(f, np.float64) for f in inv_freqs])  # (n_layer, rope_dim / 2)
        self.window = np.array([cfg.sliding_window if cfg.is_sliding(i) else 0 for i in range(n)], np.int64)
        scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / np.sqrt(cfg.head_dim)
        self.ints = (cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.v_head_dim, cfg.ffn_dim, cfg.rope_dim,
                     int(cfg.rope_neox), int(qk_norm), int(post_norms), int(gelu), int(qkv_bias), int(pre_norms))
        # mixture of experts: (experts, experts per token, expert FFN, renormalise, shared expert)
        self.moe_ints = (e, cfg.n_expert_used, cfg.expert_ffn_dim, int(cfg.expert_norm), int(shared_expert))
        self.floats = (np.float32(cfg.norm_eps), np.float32(scale), np.float32(cfg.attn_softcap),
                       np.float32(cfg.rope_mscale), np.float32(cfg.expert_scale))

    @classmethod
    def build(cls, cfg, layers, inv_freqs, table, kinds, *, qk_norm=0, post_norms=False, gelu=False,
              qkv_bias=False, pre_norms=True, moe=False, shared_expert=False):
        """The stack for these layers and the architecture's switches (ArchSpec.stack_flags), or None
        where a matrix is a float one: float matrices (F32, F16, BF16: rare in quantized models) go
        through the per-op path, which keeps their float kernels out of this function's compile."""
        def is_float(w):
            return isinstance(w, np.ndarray) or (w is not None and is_dense(w.kind))

        if any(is_float(getattr(lw, name)) for lw in layers for name in MATS) or \
                (moe and any(is_float(w) for lw in layers for w in (*lw.exp_gate, *lw.exp_up, *lw.exp_down))):
            return None
        return cls(cfg, layers, inv_freqs, table, kinds, int(qk_norm), post_norms, gelu, qkv_bias, pre_norms, moe,
                   shared_expert)

    def units_for(self, kv_dtype) -> np.ndarray:
        """The unit addresses for a KV cache of this dtype: this model's matmul families and attention."""
        t = self._tables.get(kv_dtype)
        if t is None:
            kv = next(k for k, d in units.KV_DTYPES.items() if np.dtype(d) == np.dtype(kv_dtype))
            t = self._tables[kv_dtype] = self.table.for_kinds(self.kinds, kv)
        return t

    def run(self, x, batch, cache) -> np.ndarray:
        """x (T, dim) float32, the embedded tokens, through every layer (x is overwritten) -> the final
        hidden states of the rows batch.logits_idx selects, (L, dim)."""
        return forward_layers(x, batch.positions, batch.token_seq, batch.slot_mapping, batch.block_tables,
                              batch.logits_idx, cache.block_size, cache.k, cache.v, self.mats, self.experts,
                              self.needs, self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm,
                              self.post_attn_norm, self.post_ffn_norm, self.bias, self.router, self.sh_gate,
                              self.inv_freq, self.window, self.ints, self.moe_ints, self.floats, quant.HALF_TO_F32,
                              numba.get_num_threads(), self.units_for(cache.k.dtype))


def _typed_list(items):
    out = _new_list(items[0])
    for w in items[1:]:
        _append(out, w)
    return out


@njit(cache=True)
def _new_list(first):
    mats = typed.List()
    mats.append(first)
    return mats


@njit(cache=True)
def _append(mats, w):
    mats.append(w)


@njit(nogil=True, cache=True)
def _alloc_q(T, K, need):
    # room for x (T, K) quantized: (Q8 arrays, Q8_K arrays), empty where no matrix reading x needs one
    a = (np.empty((T, K if need & 1 else 0), np.uint8), np.empty((T, K // 32 if need & 1 else 0), np.float32),
         np.empty((T, K // 32 if need & 1 else 0), np.float32))
    b = (np.empty((T, K if need & 2 else 0), np.uint8), np.empty((T, K // 256 if need & 2 else 0), np.float32),
         np.empty((T, K // 32 if need & 2 else 0), np.int32), np.empty((T, K // 16 if need & 2 else 0), np.int32))
    return a, b


# Row-wise ops run in a plain loop for a few rows (decode: a parallel region's launch costs more than
# the work) and in parallel from PAR_ROWS rows up (prefill). The row functions are the same either way,
# so the choice never changes a result.
PAR_ROWS = 16


@njit(nogil=True, cache=True)
def _norm(x, w, eps, out):
    # rmsnorm of every row of x (R, D) into out
    if x.shape[0] >= PAR_ROWS:
        ops.rmsnorm(x, w, eps, out)
    else:
        for r in range(x.shape[0]):
            ops.rmsnorm_row(x, w, eps, out, r)


@njit(parallel=True, nogil=True, cache=True)
def _quantize_rows(x, need, a, b):
    for t_ in prange(x.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        if need & 1:
            int8.quantize_q8_row(x, a[0], a[1], a[2], t)
        if need & 2:
            int8.quantize_q8k_row(x, b[0], b[1], b[2], b[3], t)


@njit(nogil=True, cache=True)
def _quantize(x, need):
    # x (T, K) -> (Q8 arrays, Q8_K arrays), each made only when some matrix reading x needs it
    T, K = x.shape
    a, b = _alloc_q(T, K, need)
    if T >= PAR_ROWS:
        _quantize_rows(x, need, a, b)
    else:
        for t in range(T):
            if need & 1:
                int8.quantize_q8_row(x, a[0], a[1], a[2], t)
            if need & 2:
                int8.quantize_q8k_row(x, b[0], b[1], b[2], b[3], t)
    return a, b


@njit(parallel=True, nogil=True, cache=True)
def _rope_kv_rows(q, k, v, positions, inv_freq, neox, rope_dim, mscale, slot_mapping, kc, vc):
    for t_ in prange(q.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        ops.rope_row(q[:, :, :rope_dim], positions, inv_freq, neox, t, mscale)
        ops.rope_row(k[:, :, :rope_dim], positions, inv_freq, neox, t, mscale)
        ops.write_kv_row(k, v, slot_mapping, kc, vc, t)


@njit(nogil=True, cache=True)
def _rope_kv(q, k, v, positions, inv_freq, neox, rope_dim, mscale, slot_mapping, kc, vc):
    # RoPE on q and k, then k and v into their KV slots
    if q.shape[0] >= PAR_ROWS:
        _rope_kv_rows(q, k, v, positions, inv_freq, neox, rope_dim, mscale, slot_mapping, kc, vc)
    else:
        for t in range(q.shape[0]):
            ops.rope_row(q[:, :, :rope_dim], positions, inv_freq, neox, t, mscale)
            ops.rope_row(k[:, :, :rope_dim], positions, inv_freq, neox, t, mscale)
            ops.write_kv_row(k, v, slot_mapping, kc, vc, t)


@njit(parallel=True, nogil=True, cache=True)
def _add_rows(x, f):
    for t_ in prange(x.shape[0]):
        t = np.int64(t_)  # prange counts in uint64: one row function for both loops
        ops.add_row(x, f, t)


@njit(nogil=True, cache=True)
def _add(x, f):
    # x += f, row by row
    if x.shape[0] >= PAR_ROWS:
        _add_rows(x, f)
    else:
        for t in range(x.shape[0]):
            ops.add_row(x, f, t)


@njit(nogil=True, cache=True)
def _add_bias(x, b):
    # x (T, D) += b (D,) on every row: a few thousand adds, in a plain loop even for prefill
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += b[i]


@njit(nogil=True, cache=True)
def _act_quantize_chunk(gate, up, gelu, need, a, b, chunk, per_row, i):
    # chunk i (of per_row per row) of the gated activation and its quantization
    t = i // per_row
    c = i % per_row
    ops.gated_act_range(gate, up, gate, gelu, t, c * chunk, (c + 1) * chunk)
    if need & 1:
        int8.quantize_q8_blocks(gate, a[0], a[1], a[2], t, c * chunk // 32, (c + 1) * chunk // 32)
    if need & 2:
        int8.quantize_q8k_blocks(gate, b[0], b[1], b[2], b[3], t, c * chunk // 256, (c + 1) * chunk // 256)


@njit(parallel=True, nogil=True, cache=True)
def _act_quantize_par(gate, up, gelu, need, a, b, chunk, per_row):
    for i_ in prange(gate.shape[0] * per_row):
        _act_quantize_chunk(gate, up, gelu, need, a, b, chunk, per_row, np.int64(i_))


# below this many elements the gated activation runs in a plain loop (a decode step's few rows): a
# parallel region's launch and wake-up cost more than the work
PAR_ACT = 8192


@njit(nogil=True, cache=True)
def _act_quantize(gate, up, gelu, need, a, b):
    # gate = act(gate) * up, then quantized into a (Q8) and/or b (Q8_K), in chunks of 256 elements, in
    # parallel for many: the widest row-wise op of a layer, done where the work is (the same arithmetic,
    # per element and per block, as gated_act_row followed by the quantize_*_row functions)
    T, F = gate.shape
    chunk = 256 if F % 256 == 0 else 32
    per_row = F // chunk
    if T * F >= PAR_ACT:
        _act_quantize_par(gate, up, gelu, need, a, b, chunk, per_row)
    else:
        for i in range(T * per_row):
            _act_quantize_chunk(gate, up, gelu, need, a, b, chunk, per_row, i)


@njit(nogil=True, cache=True)
def forward_layers(x, positions, token_seq, slot_mapping, block_tables, keep, block_size, k_cache, v_cache, mats,
                   experts, needs, attn_norm, ffn_norm, q_norm, k_norm, post_attn_norm, post_ffn_norm, bias, router,
                   sh_gate, inv_freq, window, ints, moe_ints, floats, luts, threads, table):
    # x (T, dim) through every layer -> the rows `keep` (L,) of the result, (L, dim). k_cache/v_cache
    # (n_layer, n_slots, KVH, D|Dv) float32 or float16 bits; mats: typed list of (kind, qs, qh, sc, d, m),
    # MATS order per layer; experts: the same for MoE layers' experts (see _moe); norms (n_layer, size).
    # In the last layer only the kept rows go past the KV writes (attention, output projection,
    # feed-forward), as llama.cpp does: no other row is read after. table: the kernel units' addresses
    # (units.Table.for_kinds), through which matmuls and attention run.
    n_head, n_kv, hd, vhd, ffn, rope_dim, neox, qk_norm, post_norms, gelu, qkv_bias, pre_norms = ints
    eps, scale, softcap, mscale, w_scale = floats
    T, dim = x.shape
    n_layer = k_cache.shape[0]
    h = np.empty((T, dim), np.float32)
    q = np.empty((T, n_head, hd), np.float32)
    k = np.empty((T, n_kv, hd), np.float32)
    v = np.empty((T, n_kv, vhd), np.float32)
    q2 = q.reshape(T, n_head * hd)
    k2 = k.reshape(T, n_kv * hd)
    v2 = v.reshape(T, n_kv * vhd)
    qf = q.reshape(T * n_head, hd)
    kf = k.reshape(T * n_kv, hd)
    # the FFN's gate and up outputs, (T, ffn) each, allocated once for every layer: a prompt's are tens of MB,
    # which the allocator would otherwise hand back to the system and fault in again, page by page, per layer
    scratch = np.empty(2 * T * ffn if moe_ints[0] == 0 or moe_ints[4] else 0, np.float32)  # dense FFNs (or shared experts)
    for layer in range(n_layer):
        wq, wk, wv = mats[layer * 7], mats[layer * 7 + 1], mats[layer * 7 + 2]
        if pre_norms:
            _norm(x, attn_norm[layer], eps, h)
        else:
            h[:] = x
        a8, a8k = _quantize(h, needs[layer, 0])
        int8.matmuls(wq, wk, wv, np.int64(3), a8, a8k, luts, q2, k2, v2, threads, table)
        if qkv_bias:
            _add_bias(q2, bias[0][layer])
            _add_bias(k2, bias[1][layer])
            _add_bias(v2, bias[2][layer])
        if qk_norm == 1:  # per head
            _norm(qf, q_norm[layer], eps, qf)
            _norm(kf, k_norm[layer], eps, kf)
        elif qk_norm == 2:  # over each token's whole projection
            _norm(q2, q_norm[layer], eps, q2)
            _norm(k2, k_norm[layer], eps, k2)
        kc = k_cache[layer]
        vc = v_cache[layer]
        _rope_kv(q, k, v, positions, inv_freq[layer], neox, rope_dim, mscale, slot_mapping, kc, vc)
        if layer < n_layer - 1:
            _rest(x, q, positions, token_seq, block_tables, block_size, kc, vc, mats, experts, needs, layer, ffn_norm,
                  post_attn_norm, post_ffn_norm, router, sh_gate, window, ints, moe_ints, floats, luts, threads, table,
                  scratch)
    xs = x[keep]
    _rest(xs, q[keep], positions[keep], token_seq[keep], block_tables, block_size, k_cache[n_layer - 1],
          v_cache[n_layer - 1], mats, experts, needs, n_layer - 1, ffn_norm, post_attn_norm, post_ffn_norm, router,
          sh_gate, window, ints, moe_ints, floats, luts, threads, table, scratch)
    return xs


@njit(nogil=True, cache=True)
def _rest(x, q, positions, token_seq, block_tables, block_size, kc, vc, mats, experts, needs, layer, ffn_norm,
          post_attn_norm, post_ffn_norm, router, sh_gate, window, ints, moe_ints, floats, luts, threads, table,
          scratch):
    # a layer after its KV writes: attention of q (T, H, D), output projection, residual, feed-forward,
    # residual, on x (T, dim) in place
    n_head, n_kv, hd, vhd, ffn, rope_dim, neox, qk_norm, post_norms, gelu, qkv_bias, pre_norms = ints
    n_expert = moe_ints[0]
    shared = moe_ints[4]
    eps, scale, softcap, mscale, w_scale = floats
    T, dim = x.shape
    wo = mats[layer * 7 + 3]
    att = np.empty((T, n_head, vhd), np.float32)
    units.call_attention(table[units.ATTENTION], q, kc, vc, token_seq, positions, block_tables, block_size, scale,
                         window[layer], softcap, att)
    f = np.empty((T, dim), np.float32)
    o8, o8k = _quantize(att.reshape(T, n_head * vhd), needs[layer, 1])
    int8.matmuls(wo, wo, wo, np.int64(1), o8, o8k, luts, f, f, f, threads, table)
    if post_norms:
        _norm(f, post_attn_norm[layer], eps, f)
    _add(x, f)
    h = np.empty((T, dim), np.float32)
    if pre_norms:
        _norm(x, ffn_norm[layer], eps, h)
    else:
        h[:] = x
    if n_expert == 0:
        _ffn(h, f, mats, layer, needs, ffn, gelu, luts, threads, table, scratch)
    else:
        _moe(h, f, experts, router[layer], needs, layer, moe_ints, w_scale, gelu, luts, threads, table)
        if shared:
            s = np.empty((T, dim), np.float32)
            _ffn(h, s, mats, layer, needs, ffn, gelu, luts, threads, table, scratch)
            moe.shared_gate_add(f, s, h, sh_gate[layer])
    if post_norms:
        _norm(f, post_ffn_norm[layer], eps, f)
    _add(x, f)


@njit(nogil=True, cache=True)
def _ffn(h, out, mats, layer, needs, ffn, gelu, luts, threads, table, scratch):
    # the gated FFN of h (T, dim) -> out (T, dim), with the layer's gate/up/down matrices; scratch: room for
    # gate and up (forward_layers)
    T = h.shape[0]
    wg, wu, wd = mats[layer * 7 + 4], mats[layer * 7 + 5], mats[layer * 7 + 6]
    g8, g8k = _quantize(h, needs[layer, 2])
    gate = scratch[: T * ffn].reshape(T, ffn)
    up = scratch[T * ffn: 2 * T * ffn].reshape(T, ffn)
    int8.matmuls(wg, wu, wu, np.int64(2), g8, g8k, luts, gate, up, up, threads, table)
    d8, d8k = _alloc_q(T, ffn, needs[layer, 3])
    _act_quantize(gate, up, gelu, needs[layer, 3], d8, d8k)
    int8.matmuls(wd, wd, wd, np.int64(1), d8, d8k, luts, out, out, out, threads, table)


@njit(nogil=True, cache=True)
def _moe(h, out, experts, router, needs, layer, moe_ints, w_scale, gelu, luts, threads, table):
    # the mixture-of-experts FFN of h (T, dim) -> out (T, dim) (moe.py): route, sort the (token, slot)
    # pairs by expert, every active expert's gate/up in one parallel region and its down in another,
    # the weighted sum. Expert e of this layer: experts[(layer * E + e) * 3 + (0 gate, 1 up, 2 down)].
    n_expert, k, fe, norm_w, shared = moe_ints
    T, dim = h.shape
    ids = np.empty((T, k), np.int64)
    wts = np.empty((T, k), np.float32)
    moe.route(h, router, k, norm_w != 0, w_scale, ids, wts)
    offsets, order, pos = moe.plan(ids, n_expert)
    # each token quantized once, its rows then gathered: the same bits as quantizing the gathered rows
    q8, q8k = _quantize(h, needs[layer, IN_EXP_GATE_UP])
    a8 = (q8[0][order], q8[1][order], q8[2][order])
    a8k = (q8k[0][order], q8k[1][order], q8k[2][order], q8k[3][order])
    gate = np.empty((T * k, fe), np.float32)
    up = np.empty((T * k, fe), np.float32)
    base = layer * n_expert * 3
    moe.expert_matmuls(experts, base, 0, offsets, a8, a8k, luts, gate, up, threads, table)
    d8, d8k = _alloc_q(T * k, fe, needs[layer, IN_EXP_DOWN])
    _act_quantize(gate, up, gelu, needs[layer, IN_EXP_DOWN], d8, d8k)
    y = np.empty((T * k, dim), np.float32)
    moe.expert_matmuls(experts, base, 2, offsets, d8, d8k, luts, y, y, threads, table)
    moe.combine(y, pos, wts, out)
