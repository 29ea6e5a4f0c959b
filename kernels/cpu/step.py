"""The compiled forward pass: every layer of a llama-family model in one compiled call.

The per-op forward (models/) makes about 20 Python-level kernel calls per layer; each costs
argument unboxing and dispatch, and most launch a parallel region for a few rows of work. Here one
compiled function walks all layers: up to six parallel regions per layer (q/k/v together, attention,
the output projection, gate/up together, the gated activation with its quantization for more than a few
rows, down; a mixture-of-experts layer: the router and the weighted sum, in parallel for many tokens,
and every active expert's gate/up in one region, its down in another) and the small row-wise ops (norms,
quantization, RoPE, KV writes, residuals) between them, in plain loops for a few rows and in parallel for
many (parts/rows.py), the same row functions the per-op kernels run. In the last layer only the rows that
get logits go on past the KV writes. Which ops run is read from the architecture's config (q/k norms,
post-norms, activation, NeoX RoPE, sliding windows), not from a second copy of each model: the per-op
forward stays the reference, and the tests hold the two to the same logits.

A layer is a sequence of parts (parts/: norms, attention, the FFN or the experts); each part's module
has a NamedTuple of what its code reads. A :class:`LayerStack` builds them once, at load, from a model's
layers, with every matrix in one typed list of (kind, qs, qh, sc, d, m) tuples (the parts name where each
layer's are) and the experts' in a second. The precompile's signature (parallel_compile.step_sig) is typed
from a stand-in LayerStack's arguments (`stand_in_args`), so no argument type is written twice. LoRA adapters
(lora.py) run after the attention's and the FFN's matmuls, each row at its own scales, where a model has them
(`LayerStack.lora_part`): a unit of their own (lora.call_lora, compiled only for a model with adapters), the very
function the per-op forward calls, so the two give the same bits.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

import numba
import numpy as np
from numba import njit, typed, types
from numba.extending import intrinsic

from ..kinds import QUANTIZED, is_dense
from . import moe as moe_kernels
from . import calls, lora, quant, units
from .calls import call_codegen, check
from .parts import attention, deltanet, ffn, mamba2, norms, per_layer, shortconv
from .parts import moe as moe_part
from .parts.rows import add, norm


class LayerStack:
    """A model's layers in the compiled step's form; None from :meth:`build` when a layer holds a
    float matrix."""

    # a layer's matrices outside the experts
    MATS = (*attention.MATS, *ffn.MATS, *shortconv.MATS, *deltanet.MATS, *mamba2.MATS, *per_layer.MATS)

    def __init__(self, cfg, layers, inv_freqs, table, kinds, qk_norm: int, post_norms: bool, gelu: bool,
                 qkv_bias: bool = False, pre_norms: bool = True, moe: bool = False, shared_expert: bool = False,
                 sinks: bool = False, oai: bool = False, attn_gate: bool = False, feed_forward: bool = True,
                 moe_scored: bool = False, shared_gate: bool = True, v_norm: bool = False, g4_moe: bool = False,
                 typed_lists: bool = True):
        self.table = table  # the kernel units (units.Table) of this process's path
        self.kinds = tuple(sorted(kinds))
        self._tables = {}  # KV cache dtype -> the int64 table of unit addresses the step takes
        mats, experts = [], []
        self.norms = norms.build(cfg, layers, pre_norms, post_norms)
        self.attn = attention.build(cfg, layers, mats, inv_freqs, qk_norm, qkv_bias, sinks, attn_gate, v_norm)
        self.ffn = ffn.build(cfg, layers, mats, gelu, moe, shared_expert, feed_forward)
        self.moe = moe_part.build(cfg, layers, experts, gelu, moe or g4_moe, oai, moe_scored, shared_gate, g4_moe)
        self.conv = shortconv.build(cfg, layers, mats)
        self.delta = deltanet.build(cfg, layers, mats)
        self.mamba = mamba2.build(cfg, layers, mats)
        self.ple = per_layer.build(cfg, layers, mats)
        experts = experts or mats[:1]  # a stand-in for a dense model: never read
        # typed lists built by cached compiled functions: typed.List's own methods, called from Python,
        # compile afresh in every process (a second of start-up); a stand-in keeps the Python lists. Made at
        # the first run (`lists`): a first run's first answers run per op, before the compiled step exists
        self._py_lists, self._typed, self._lists = (mats, experts), typed_lists, None

    def lists(self) -> tuple:
        """(mats, experts): the layers' matrices and experts as the step takes them."""
        if self._lists is None:
            self._lists = tuple(map(_typed_list, self._py_lists)) if self._typed else self._py_lists
        return self._lists

    @classmethod
    def build(cls, cfg, layers, inv_freqs, table, kinds, *, qk_norm=0, post_norms=False, gelu=False,
              qkv_bias=False, pre_norms=True, moe=False, shared_expert=False, sinks=False, oai=False,
              attn_gate=False, feed_forward=True, moe_scored=False, shared_gate=True, v_norm=False, g4_moe=False):
        """The stack for these layers and the architecture's switches (ArchSpec.stack_flags), or None
        where a matrix is a float one: float matrices (F32, F16, BF16: rare in quantized models) go
        through the per-op path, which keeps their float kernels out of this function's compile."""
        def is_float(w):
            return isinstance(w, np.ndarray) or (w is not None and is_dense(w.kind))

        if any(is_float(getattr(lw, name)) for lw in layers for name in cls.MATS) or \
                ((moe or g4_moe) and any(is_float(w) for lw in layers for w in (*(lw.exp_gate or ()), *(lw.exp_up or ()),
                                                                   *(lw.exp_down or ())))):
            return None
        if any(getattr(lw, "ssm_ba", None) is not None and getattr(lw, "ssm_in", None) is not None for lw in layers):
            return None  # older Qwen3-Next files: q, k, v and z in one ssm_in, per op
        mixers = {cfg.mixer(i) for i in range(cfg.n_layer)}
        if not mixers <= {"attention", "mlp", *MIXER_OF}:  # a layer kind the step does not run: per op
            return None
        if len({MIXER_OF[m] for m in mixers if m in MIXER_OF}) > 1:
            return None  # two kinds of recurrent mixer in one model (none so far): the step has one MIXER slot
        return cls(cfg, layers, inv_freqs, table, kinds, int(qk_norm), post_norms, gelu, qkv_bias, pre_norms, moe,
                   shared_expert, sinks, oai, attn_gate, feed_forward, moe_scored, shared_gate, v_norm, g4_moe)

    def units_for(self, k_dtype, v_dtype) -> np.ndarray:
        """The unit addresses for a KV cache whose K and V arrays have these element types: this model's matmul
        families and attention."""
        key = (np.dtype(k_dtype), np.dtype(v_dtype))
        t = self._tables.get(key)
        if t is None:
            t = self._tables[key] = self.table.for_kinds(self.kinds, calls.kv_type_of(*key))
            if self.moe.n_expert:
                t[units.EXPERTS] = units.address(moe_part.forward, experts_sig())
            for name, part in (("shortconv", self.conv), ("deltanet", self.delta), ("mamba2", self.mamba)):
                if part.kind.any():
                    t[units.MIXER] = units.address(MIXERS[name].forward, mixer_sig(name))
        return t

    def lora_part(self, part, where: dict):
        """A model's packed adapters (lora.LoraPart) for this stack, or None where an adapted matrix is one the step
        does not adapt (a recurrent mixer's, an FFN mixer's, the per-layer inputs'): rows with adapters at work then
        run per op. where: (layer, field) -> the matrix's id in part."""
        of = np.full(len(self._py_lists[0]), -1, np.int64)
        for (i, f), mid in where.items():
            if f in attention.MATS:
                at = int(getattr(self.attn, f)[i])
            elif f in ffn.MATS and not self.ffn.mlp[i]:
                at = int(getattr(self.ffn, f)[i])
            else:
                return None
            if at < 0:
                return None
            of[at] = mid
        return part._replace(of_mat=of)

    def args(self, x, batch, cache, table, ple=None, lo=None, rows=None) -> tuple:
        """forward_layers' arguments, in order; ple: every layer's per-layer inputs (n_layer, T, E) (Gemma 4); lo: the
        model's adapters for this stack (lora_part), rows: each row's scales of them (T, n_adapters)."""
        # the recurrent state (a hybrid model's), empty stand-ins for the kinds a model lacks
        conv, ssm_conv = (_NO_STATE4 if a is None else a for a in (cache.conv, cache.ssm_conv))
        return (x, batch.positions, batch.token_seq, batch.slot_mapping, batch.block_tables, batch.window_slots,
                batch.window_tables, batch.logits_idx, cache.block_size, cache.where, cache.k, cache.v, cache.wk,
                cache.wv, *self.lists(), self.norms, self.attn, self.ffn,
                self.moe, quant.HALF_TO_F32, numba.get_num_threads(), table, batch.state_slots, batch.state_snap,
                conv, ssm_conv, _NO_STATE5 if cache.ssm is None else cache.ssm, self.conv, self.delta, self.mamba,
                _NO_PLE if ple is None else ple, self.ple, _NO_LORA if lo is None else lo,
                lora.NO_ROWS if rows is None else rows)

    def run(self, x, batch, cache, ple=None, lo=None, rows=None) -> np.ndarray:
        """x (T, dim) float32, the embedded tokens, through every layer (x is overwritten) -> the final
        hidden states of the rows batch.logits_idx selects, (L, dim); ple: the per-layer inputs (Gemma 4's); lo,
        rows: the adapters and each row's scales of them (args)."""
        table = self.units_for(cache.k.dtype, cache.v.dtype)
        if lo is not None and not table[units.LORA]:
            table[units.LORA] = lora.unit_address()
        return forward_layers(*self.args(x, batch, cache, table, ple, lo, rows))


def stand_in_args(k_dtype, v_dtype=None) -> tuple:
    """forward_layers' arguments for a one-layer model of quantized matrices and a KV cache whose K arrays have
    this element type (and V's v_dtype: the same where None), the typed lists left as Python lists of their
    items: what parallel_compile types the step's signature from (its types are those of every model's, MoE
    or not)."""
    d = 32
    cfg = SimpleNamespace(n_layer=1, dim=d, n_head=1, n_kv_head=1, head_dim=d, v_head_dim=d, ffn_dim=d, rope_dim=d,
                          rope_neox=False, norm_eps=1e-5, attn_scale=None, attn_softcap=0.0, rope_mscale=1.0,
                          sliding_window=0, is_sliding=lambda i: False, n_expert=0, n_expert_used=0,
                          expert_ffn_dim=0, expert_norm=False, expert_scale=0.0, conv_layers=())
    u8, u16 = np.zeros((1, 1), np.uint8), np.zeros((1, 1), np.uint16)
    w = SimpleNamespace(kind=QUANTIZED[0], qs=u8, qh=u8, sc=u8, d=u16, m=u16)
    layer = SimpleNamespace(**{name: w for name in LayerStack.MATS})
    stack = LayerStack(cfg, [layer], [np.zeros(d // 2)], None, (), 0, False, False, typed_lists=False)
    # the engine's Batch and KVCache (edgeinfer/engine): int64 index arrays, int32 block tables
    i64 = np.zeros(1, np.int64)
    i32 = np.zeros((1, 1), np.int32)
    batch = SimpleNamespace(positions=i64, token_seq=i64, slot_mapping=i64, block_tables=i32, window_slots=i64,
                            window_tables=i32, logits_idx=i64, state_slots=i64, state_snap=i64)
    c = np.zeros((1, 1, 1, d), k_dtype)
    cv = c if v_dtype is None else np.zeros((1, 1, 1, d), v_dtype)
    cache = SimpleNamespace(block_size=16, where=np.zeros((1, 2), np.int64), k=c, v=cv, wk=c, wv=cv, conv=None,
                            ssm_conv=None, ssm=None)
    return stack.args(np.zeros((1, d), np.float32), batch, cache, np.zeros(units.TABLE_SIZE, np.int64))


@cache
def experts_sig() -> tuple:
    """parts.moe.forward's argument types (h, r, out, experts, MoePart, layer, luts, threads, table), from the
    stand-in's: the experts unit, compiled for models with experts alone (parallel_compile)."""
    a = stand_in_args(np.float32)
    f2 = types.Array(types.float32, 2, "C")
    return (f2, f2, f2, types.ListType(numba.typeof(a[15][0])), numba.typeof(a[19]), types.int64, numba.typeof(a[20]),
            types.int64, numba.typeof(a[22]))


@intrinsic
def call_experts(typingctx, addr, h, r, out, experts, p, layer, luts, threads, table):
    """The experts unit at addr (Table slot EXPERTS): parts.moe.forward(h, r, out, experts, p, ...), compiled
    apart from the step (a dense model's step never compiles the mixture; a model with experts compiles the
    two side by side)."""
    argtys = (h, r, out, experts, p, layer, luts, threads, table)
    check("experts", argtys, argtys == experts_sig())
    return types.void(addr, *argtys), call_codegen(argtys)


_NO_STATE4 = np.zeros((0, 0, 0, 0), np.float32)
_NO_PLE = np.zeros((0, 0, 0), np.float32)
_NO_STATE5 = np.zeros((0, 0, 0, 0, 0), np.float32)
_NO_LORA = lora.off()


# the recurrent mixers the step runs, by cfg.mixer name, and where each one's part is in forward_layers' arguments
MIXERS = {"shortconv": shortconv, "deltanet": deltanet, "mamba2": mamba2}
# every cfg.mixer name with a recurrent mixer -> its MIXERS unit (attention and "mlp" run in the step itself)
MIXER_OF = {"shortconv": "shortconv", "deltanet": "deltanet", "mamba2": "mamba2", "attn_mamba2": "mamba2"}
_MIXER_ARG = {"shortconv": 28, "deltanet": 29, "mamba2": 30}


@cache
def mixer_sig(name: str) -> tuple:
    """A recurrent mixer unit's argument types (h, out, mats, its part, layer, conv, ssm_conv, ssm, token_seq,
    positions, state_slots, state_snap, luts, threads, table), from the stand-in's: MIXERS[name].forward, a
    unit compiled only for models with those layers."""
    a = stand_in_args(np.float32)
    f2 = types.Array(types.float32, 2, "C")
    t = [numba.typeof(v) for v in a]
    return (f2, f2, types.ListType(numba.typeof(a[14][0])), t[_MIXER_ARG[name]], types.int64, t[25], t[26], t[27],
            t[2], t[1], t[23], t[24], t[20], types.int64, t[22])


@intrinsic
def call_mixer(typingctx, addr, h, out, mats, p, layer, conv, ssm_conv, ssm, token_seq, positions, slots, snap, luts,
               threads, table):
    """The recurrent mixer unit at addr (Table slot MIXER): a hybrid model's mixer of one layer (p: its part,
    parts.shortconv.ConvPart, parts.deltanet.DeltaPart or parts.mamba2.Mamba2Part) on h -> out, compiled apart
    from the step (a model without such layers never compiles it)."""
    argtys = (h, out, mats, p, layer, conv, ssm_conv, ssm, token_seq, positions, slots, snap, luts, threads, table)
    check("recurrent mixer", argtys, any(argtys == mixer_sig(name) for name in MIXERS))
    return types.void(addr, *argtys), call_codegen(argtys)


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
def forward_layers(x, positions, token_seq, slot_mapping, block_tables, window_slots, window_tables, keep, block_size,
                   where, k_cache, v_cache, wk, wv, mats, experts, nm, at, ff, mo, luts, threads, table, state_slots,
                   state_snap, conv, ssm_conv, ssm, cv, dn, mb, ple, pl, lo, lr):
    # x (T, dim) through every layer -> the rows `keep` (L,) of the result, (L, dim). k_cache/v_cache
    # (n_layers, n_slots, KVH, D|Dv) float32 or float16 bits (or q8_0 rows), wk/wv the same for the
    # sliding-window layers in a window pool, addressed through window_slots and window_tables; where
    # (n_layer, 2): each layer's pool (1: the window pool) and index in it (engine/kv_cache.py); mats: typed
    # list of (kind, qs, qh, sc, d, m), experts: the same for MoE layers' experts; nm, at, ff, mo, cv, dn, mb:
    # the parts (parts.norms.NormsPart, parts.attention.AttnPart, parts.ffn.FfnPart, parts.moe.MoePart,
    # parts.shortconv.ConvPart, parts.deltanet.DeltaPart, parts.mamba2.Mamba2Part; no feed-forward block
    # where ff.block is 0, an FFN as the mixer where ff.mlp). A recurrent layer's mixer runs every row through
    # its sequence's state (conv, ssm_conv, ssm: the cache's; state_slots, state_snap: the batch's) in a unit
    # of its own (call_mixer). In the last layer only the kept rows go past the KV writes or the recurrent
    # mixer (attention, output projection, feed-forward), as llama.cpp does: no other row is read after.
    # table: the kernel units' addresses (units.Table.for_kinds), through which matmuls, attention, experts
    # and mixers run. ple (n_layer, T, E), pl (parts.per_layer.PerLayerPart): each layer's per-layer input,
    # added after its feed-forward block where pl.on, and its output scale (Gemma 4's). lo (lora.LoraPart): LoRA
    # adapters beside the attention's and FFN's matrices where lo.on, at each row's scales lr (T, n_adapters).
    T, dim = x.shape
    n_layer = where.shape[0]
    h = np.empty((T, dim), np.float32)
    # q, k and v of the largest layer; each layer's are views of its own sizes (at.dims)
    qbuf = np.empty(T * at.n_head * at.head_dim, np.float32)
    kbuf = np.empty(T * at.n_kv * at.head_dim, np.float32)
    vbuf = np.empty(T * at.n_kv * at.v_head_dim, np.float32)
    no_inp = np.empty((T, 0), np.float32)
    gate = np.empty((T, at.n_head * at.head_dim if at.gate else 0), np.float32)  # the attention's output gates
    scratch = np.empty(ffn.scratch_size(T, ff), np.float32)  # the dense FFNs' gate and up (ffn.forward)
    for layer in range(n_layer):
        last = layer == n_layer - 1
        if nm.pre:
            norm(x, nm.attn[layer], nm.eps, h)
        else:
            h[:] = x
        if cv.kind[layer] or dn.kind[layer] or mb.kind[layer] == 1 or ff.mlp[layer]:  # a mixer without KV
            f = np.empty((T, dim), np.float32)
            if cv.kind[layer]:
                call_mixer(table[units.MIXER], h, f, mats, cv, layer, conv, ssm_conv, ssm, token_seq, positions,
                           state_slots, state_snap, luts, threads, table)
            elif dn.kind[layer]:
                call_mixer(table[units.MIXER], h, f, mats, dn, layer, conv, ssm_conv, ssm, token_seq, positions,
                           state_slots, state_snap, luts, threads, table)
            elif mb.kind[layer]:
                call_mixer(table[units.MIXER], h, f, mats, mb, layer, conv, ssm_conv, ssm, token_seq, positions,
                           state_slots, state_snap, luts, threads, table)
            else:
                ffn.mlp(h, f, mats, ff, layer, luts, threads, table)
            inp = ple[layer] if pl.on else no_inp
            if last:
                xs = x[keep]
                _mixer_out(xs, f[keep], nm, layer)
                _ffn_block(xs, mats, experts, nm, ff, mo, layer, luts, threads, table, scratch, lo, _rows(lo, lr, keep))
                per_layer.forward(xs, inp[keep] if pl.on else inp, mats, pl, layer, luts, threads, table)
                return xs
            _mixer_out(x, f, nm, layer)
            _ffn_block(x, mats, experts, nm, ff, mo, layer, luts, threads, table, scratch, lo, lr)
            per_layer.forward(x, inp, mats, pl, layer, luts, threads, table)
            continue
        kc, vc, slots, tables, q, k, v = layer_views(where, layer, k_cache, v_cache, wk, wv, slot_mapping,
                                                     block_tables, window_slots, window_tables, at, qbuf, kbuf, vbuf, T)
        inp = ple[layer] if pl.on else no_inp
        attention.project(h, q, k, v, gate, positions, slots, kc, vc, mats, at, layer, luts, threads, table, lo, lr)
        par = np.empty((T, dim if mb.kind[layer] == 2 else 0), np.float32)  # Falcon-H1: Mamba2 beside attention
        if mb.kind[layer] == 2:
            call_mixer(table[units.MIXER], h, par, mats, mb, layer, conv, ssm_conv, ssm, token_seq, positions,
                       state_slots, state_snap, luts, threads, table)
        if last:
            xs = x[keep]
            _rest(xs, q[keep], gate[keep], par[keep], positions[keep], token_seq[keep], tables, block_size, kc, vc,
                  mats, experts, nm, at, ff, mo, layer, luts, threads, table, scratch, lo, _rows(lo, lr, keep))
            per_layer.forward(xs, inp[keep] if pl.on else inp, mats, pl, layer, luts, threads, table)
            return xs
        _rest(x, q, gate, par, positions, token_seq, tables, block_size, kc, vc, mats, experts, nm, at, ff, mo, layer,
              luts, threads, table, scratch, lo, lr)
        per_layer.forward(x, inp, mats, pl, layer, luts, threads, table)
    return x[keep]  # no layers


@njit(nogil=True, cache=True)
def layer_views(where, layer, k_cache, v_cache, wk, wv, slot_mapping, block_tables, window_slots, window_tables, at,
                qbuf, kbuf, vbuf, T):
    # an attention layer's K and V arrays and how tokens address them (the window pool's, or the full-context
    # one's), and its q, k, v for T tokens as views of the buffers, of the layer's own sizes (at.dims)
    nh, nkv, hd, vd = at.dims[layer, 0], at.dims[layer, 1], at.dims[layer, 2], at.dims[layer, 3]
    q = qbuf[:T * nh * hd].reshape((T, nh, hd))
    k = kbuf[:T * nkv * hd].reshape((T, nkv, hd))
    v = vbuf[:T * nkv * vd].reshape((T, nkv, vd))
    i = where[layer, 1]
    if where[layer, 0] == 1:
        return wk[i], wv[i], window_slots, window_tables, q, k, v
    return k_cache[i], v_cache[i], slot_mapping, block_tables, q, k, v


@njit(inline="always", nogil=True, cache=True)
def _rows(lo, lr, keep):
    # the kept rows' adapter scales (the last layer's)
    return lr[keep] if lo.on else lr


@njit(nogil=True, cache=True)
def _rest(x, q, gate, par, positions, token_seq, block_tables, block_size, kc, vc, mats, experts, nm, at, ff, mo,
          layer, luts, threads, table, scratch, lo, lr):
    # a layer after its KV writes: attention of q (T, H, D) (gated by gate where the model has one), output
    # projection (plus par, a mixer's output beside it, where it has columns), residual, feed-forward,
    # residual, on x (T, dim) in place
    T, dim = x.shape
    f = np.empty((T, dim), np.float32)
    attention.attend(q, gate, positions, token_seq, block_tables, block_size, kc, vc, mats, at, layer, luts, threads,
                     table, f, lo, lr)
    if par.shape[1]:
        add(f, par)
    _mixer_out(x, f, nm, layer)
    _ffn_block(x, mats, experts, nm, ff, mo, layer, luts, threads, table, scratch, lo, lr)


@njit(inline="always", nogil=True, cache=True)
def _mixer_out(x, f, nm, layer):
    # the mixer's output f (T, dim) post-normed and scaled where the model says, added to x
    if nm.post:
        norm(f, nm.post_attn[layer], nm.eps, f)
    if nm.res_scale != 0:
        f *= nm.res_scale
    add(x, f)


@njit(nogil=True, cache=True)
def _ffn_block(x, mats, experts, nm, ff, mo, layer, luts, threads, table, scratch, lo, lr):
    # a layer's feed-forward block on x (T, dim) in place: norm, the FFN or the experts, post-norm, residual
    # (none where the model's layers have no such block: ff.block 0)
    if not ff.block:
        return
    T, dim = x.shape
    f = np.empty((T, dim), np.float32)
    h = np.empty((T, dim), np.float32)
    if nm.pre:
        norm(x, nm.ffn[layer], nm.eps, h)
    else:
        h[:] = x
    if mo.n_expert == 0 or not mo.on[layer]:
        ffn.forward(h, f, mats, ff, layer, luts, threads, table, scratch, lo, lr)
    elif mo.g4:  # Gemma 4: the dense FFN and the experts side by side, each normed apart
        ffn.forward(h, f, mats, ff, layer, luts, threads, table, scratch, lo, lr)
        norm(f, mo.post1[layer], nm.eps, f)
        r = np.empty((T, dim), np.float32)  # the router's input
        norm(x, mo.ones, nm.eps, r)
        r *= mo.rdiv
        for t in range(T):
            r[t] *= mo.rscale[layer]
        norm(x, mo.pre2[layer], nm.eps, h)
        e = np.empty((T, dim), np.float32)
        call_experts(table[units.EXPERTS], h, r, e, experts, mo, layer, luts, threads, table)
        norm(e, mo.post2[layer], nm.eps, e)
        add(f, e)
    else:
        call_experts(table[units.EXPERTS], h, h, f, experts, mo, layer, luts, threads, table)
        if ff.shared:
            s = np.empty((T, dim), np.float32)
            ffn.forward(h, s, mats, ff, layer, luts, threads, table, scratch, lo, lr)
            if mo.sh_gated:
                moe_kernels.shared_gate_add(f, s, h, mo.sh_gate[layer])
            else:  # granitehybrid: added as it is
                add(f, s)
    if nm.post:
        norm(f, nm.post_ffn[layer], nm.eps, f)
    if nm.res_scale != 0:
        f *= nm.res_scale
    add(x, f)
