"""The `gemma3n` architecture (Gemma 3n E2B, E4B), per op (llama.cpp's gemma3n.cpp). Its layer is Gemma 3's (q/k
norms, V RMS-normed, unscaled scores, GELU-gated FFN, post-norms, every fifth layer global, the last layers reading
the KV of earlier ones) run on one of four streams of the residual (AltUp):
- the embedding (times sqrt(dim)) is the first stream; the others are its projections (altup_proj), each scaled
  to the first's magnitude;
- a layer predicts every stream from all four (altup_predict_coef of the router's tanh modalities of the active
  stream), runs the active prediction through attention and its FFN, with LAuReL (a rank-64 residual,
  laurel_l/laurel_r, normed) beside the attention, the two averaged (times 1/sqrt 2) before the FFN; the first
  ten layers' FFN gates keep only what lies beyond mean + 1.645 std of their row (activation sparsity);
- then corrects every stream by the innovation (the layer's output less its prediction) times
  altup_correct_coef's coefficients (plus one), and adds the per-layer input (models/per_layer.py's inputs,
  through the corrected active stream times altup_correct_scale, gated and projected) to the other streams;
- at the end the other streams go back through altup_unembd_proj (each scaled to the first's magnitude) and
  the four are averaged.
On the CPU every layer runs in one compiled call (kernels/cpu/altup.py: the same row functions as the per-op
path here, so the two agree bit for bit); the CUDA backend does not run it."""

from __future__ import annotations

import numpy as np
from . import decoder, parts, per_layer
from .common import ModelLoadError, WeightLoader
from .decoder import ArchSpec

SPEC = ArchSpec("gemma3n", rope_neox=True, qk_norm=True, post_norms=True, activation="gelu_tanh", embed_scale=True,
                softcaps=True, swa_pattern=5, layer_shapes=True, per_layer_input=True, v_norm=True, attn_scale_one=True,
                altup=True)

SPARSE_LAYERS = 10  # llama.cpp's n_layer_sparsity: the layers whose FFN gates are made sparse
SPARSE_STD = np.float32(1.6448533535003662)  # and its f_sparsity_std_mul (the normal distribution's 95th percentile)


class Model(decoder.Model):
    def __init__(self, gf, kb, spec: ArchSpec, cfg=None, n_ctx=None):
        if kb.NAME != "cpu":
            raise ModelLoadError(f"gemma3n is not on the {kb.NAME} backend yet (use the CPU)")
        super().__init__(gf, kb, spec, cfg, n_ctx)
        self.n_altup, self.active = self.cfg.altup, self.cfg.altup_active

    def _extra(self, ld: WeightLoader, cfg) -> None:
        # the model's AltUp projections (n_altup - 1 of each), read as float32 (n, dim, dim)
        n, d = cfg.altup - 1, cfg.dim
        self.altup_proj = ld.matrix_rows("altup_proj.weight", (n, d, d), [d] * n)
        self.altup_unembd = ld.matrix_rows("altup_unembd_proj.weight", (n, d, d), [d] * n)

    def _stack(self, kb, spec):
        # the compiled walk over the streams (kernels/cpu/altup.py), or None: per op
        cfg = self.cfg
        return kb.altup_stack(cfg, self.layers, [self.layer_inv_freq(i) for i in range(cfg.n_layer)], SPARSE_LAYERS,
                              SPARSE_STD, **spec.stack_flags)

    def forward(self, batch, cache, hidden: bool = False) -> np.ndarray:
        """Logits (or final hidden states) as decoder.Model.forward's, through the four streams: every layer in
        one compiled call where the backend has one (the CPU's), else per op (forward_per_op)."""
        if self.stack is None or not self.kb.step_ready():  # (a first run: until the walk is compiled)
            return self.forward_per_op(batch, cache, hidden)
        streams, ple = self._streams(batch)
        rows = self.kb.altup_run(self.stack, streams, batch, cache, ple)
        return self._out(list(rows), hidden)

    def _streams(self, batch):
        # the embedded tokens as the n streams (n, T, dim), and every layer's per-layer inputs
        kb, cfg = self.kb, self.cfg
        x0 = self.embed(batch.token_ids)
        ple = per_layer.inputs(kb, cfg, self.ple, batch.token_ids, x0)
        return np.stack([x0] + _rescaled(x0, [kb.matmul(w, x0) for w in self.altup_proj])), ple

    def _out(self, streams, hidden: bool):
        # the streams (of the rows that get logits) back through altup_unembd_proj and averaged -> logits
        kb = self.kb
        rest = _rescaled(streams[self.active], [kb.matmul(w, s) for w, s in zip(self.altup_unembd, streams[1:])])
        x = np.array(streams[0])
        for r in rest:
            kb.add_(x, r)
        kb.scale_(x, np.float32(1.0) / np.float32(self.n_altup))
        return self.normed(x) if hidden else self.logits(x)

    def _per_op(self, batch, cache, hidden: bool = False) -> np.ndarray:
        """The reference: one backend call per op (this model's forward_per_op)."""
        kb, cfg, spec = self.kb, self.cfg, self.spec
        batch = kb.prepare_batch(batch)
        streams, ple = self._streams(batch)
        for i, lw in enumerate(self.layers):
            c = cfg.at(i)
            pred = kb.altup_predict(streams, self._modalities(lw, streams[self.active]), lw.altup_predict_coef)
            active = pred[self.active]
            h = kb.empty(active.shape)
            kb.rmsnorm(active, lw.attn_norm, cfg.norm_eps, h)
            laurel = kb.matmul(lw.laurel_r, kb.matmul(lw.laurel_l, h))
            kb.rmsnorm(laurel, lw.laurel_norm, cfg.norm_eps, laurel)
            kb.add_(laurel, h)
            y = parts.attention.forward(kb, c, spec, lw, h, parts.Where(i, batch, cache, self.layer_inv_freq(i)))
            kb.rmsnorm(y, lw.post_attn_norm, cfg.norm_eps, y)
            kb.add_(y, active)
            kb.add_(y, laurel)
            kb.scale_(y, np.float32(1.0) / np.float32(np.sqrt(np.float32(2.0))))
            kb.rmsnorm(y, lw.ffn_norm, cfg.norm_eps, h)
            f = self._ffn(lw, h, i)
            kb.rmsnorm(f, lw.post_ffn_norm, cfg.norm_eps, f)
            kb.add_(f, y)
            streams = kb.altup_correct(pred, f, self.active, self._modalities(lw, f), lw.altup_correct_coef)
            first = streams[self.active] * lw.altup_correct_scale
            g = kb.matmul(lw.ple_gate, first)
            kb.gelu_tanh_mul(g, ple[i], g)
            p = kb.matmul(lw.ple_proj, g)
            kb.rmsnorm(p, lw.ple_norm, cfg.norm_eps, p)
            for j in range(1, self.n_altup):  # (llama.cpp: every stream but the first)
                kb.add_(streams[j], p)
        return self._out([kb.take_rows(s, batch.logits_idx) for s in streams], hidden)

    forward_per_op = _per_op

    def _modalities(self, lw, x) -> np.ndarray:
        # the router's tanh of the stream x (T, dim) RMS-normed, times 1/dim: (T, n_altup)
        return self.kb.altup_modalities(x, lw.altup_router_norm, lw.altup_router, self.cfg.norm_eps)

    def _ffn(self, lw, h, layer: int):
        # the GELU-gated FFN; the first SPARSE_LAYERS layers keep what of each gate row lies beyond
        # mean + SPARSE_STD std (the std over dim - 1)
        kb = self.kb
        g, u = kb.matmul_many([lw.w_gate, lw.w_up], h)
        if layer < SPARSE_LAYERS:
            kb.sparsify_(g, SPARSE_STD)
        kb.gelu_tanh_mul(g, u, g)
        return kb.matmul(lw.w_down, g)


def _rescaled(target, xs) -> list:
    # each x (T, dim) times |target| / |x|, per row (llama.cpp's calc_magnitude: the square root of the sum of squares)
    mag = np.sqrt((target * target).sum(axis=1, dtype=np.float32, keepdims=True))
    return [x * mag / np.sqrt((x * x).sum(axis=1, dtype=np.float32, keepdims=True)) for x in xs]
