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
The compiled step does not run it (the per-op path alone), and the CUDA backend not at all."""

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

    def forward(self, batch, cache, hidden: bool = False) -> np.ndarray:
        """Logits (or final hidden states) as decoder.Model.forward's, through the four streams: one backend call
        per op (this model's one forward: it is also its forward_per_op)."""
        kb, cfg, spec = self.kb, self.cfg, self.spec
        batch = kb.prepare_batch(batch)
        x0 = self.embed(batch.token_ids)
        ple = per_layer.inputs(kb, cfg, self.ple, batch.token_ids, x0)
        streams = [x0] + _rescaled(x0, [kb.matmul(w, x0) for w in self.altup_proj])
        ones = np.ones(cfg.dim, np.float32)
        for i, lw in enumerate(self.layers):
            c = cfg.at(i)
            pred = self._predict(lw, streams)
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
            streams = self._correct(lw, pred, f, ones)
            first = streams[self.active] * lw.altup_correct_scale
            g = kb.matmul(lw.ple_gate, first)
            kb.gelu_tanh_mul(g, ple[i], g)
            p = kb.matmul(lw.ple_proj, g)
            kb.rmsnorm(p, lw.ple_norm, cfg.norm_eps, p)
            for j in range(1, self.n_altup):  # (llama.cpp: every stream but the first)
                kb.add_(streams[j], p)
        rest = _rescaled(streams[self.active], [kb.matmul(w, s) for w, s in zip(self.altup_unembd, streams[1:])])
        x = streams[0]
        for r in rest:
            kb.add_(x, r)
        kb.scale_(x, np.float32(1.0) / np.float32(self.n_altup))
        rows = kb.take_rows(x, batch.logits_idx)
        return self.normed(rows) if hidden else self.logits(rows)

    forward_per_op = forward

    def _modalities(self, lw, x) -> np.ndarray:
        # the router's tanh of the stream x (T, dim) RMS-normed, times 1/dim: (T, n_altup)
        r = self.kb.empty(x.shape)
        self.kb.rmsnorm(x, lw.altup_router_norm, self.cfg.norm_eps, r)
        r *= np.float32(1.0) / np.float32(self.cfg.dim)
        return np.tanh(_rows_dot(r, lw.altup_router))

    def _predict(self, lw, streams) -> list:
        # each stream predicted from all of them: pred[n] = stream[n] + sum_k coef[t, n, k] stream[k]
        n = self.n_altup
        coefs = _rows_dot(self._modalities(lw, streams[self.active]), lw.altup_predict_coef).reshape(-1, n, n)
        out = []
        for j in range(n):
            p = np.zeros_like(streams[0])
            for k in range(n):
                p += coefs[:, j, k, None] * streams[k]
            out.append(p + streams[j])
        return out

    def _correct(self, lw, pred, act, ones) -> list:
        # every prediction moved by the innovation (act less the active prediction) times its coefficient + 1
        coefs = _rows_dot(self._modalities(lw, act), lw.altup_correct_coef) + np.float32(1.0)
        innovation = act - pred[self.active]
        return [innovation * coefs[:, j, None] + pred[j] for j in range(self.n_altup)]

    def _ffn(self, lw, h, layer: int):
        # the GELU-gated FFN; the first SPARSE_LAYERS layers keep what of each gate row lies beyond
        # mean + SPARSE_STD std (the std over dim - 1)
        kb = self.kb
        g, u = kb.matmul_many([lw.w_gate, lw.w_up], h)
        if layer < SPARSE_LAYERS:
            mean = g.mean(axis=1, dtype=np.float32, keepdims=True)
            d = g - mean
            std = np.sqrt((d * d).sum(axis=1, dtype=np.float32, keepdims=True) / np.float32(g.shape[1] - 1))
            g = np.maximum(g - (mean + std * SPARSE_STD), np.float32(0.0)).astype(np.float32)
        kb.gelu_tanh_mul(g, u, g)
        return kb.matmul(lw.w_down, g)


def _rescaled(target, xs) -> list:
    # each x (T, dim) times |target| / |x|, per row (llama.cpp's calc_magnitude: the square root of the sum of squares)
    mag = np.sqrt((target * target).sum(axis=1, dtype=np.float32, keepdims=True))
    return [x * mag / np.sqrt((x * x).sum(axis=1, dtype=np.float32, keepdims=True)) for x in xs]


def _rows_dot(x, w) -> np.ndarray:
    # x (T, K) times w (N, K) transposed -> (T, N) float32, each element one sum over K in numpy's order for that
    # length: the same bits whatever T (a BLAS product's blocking depends on the rows, so a batch would not)
    return (x[:, None, :] * w[None, :, :]).sum(axis=2, dtype=np.float32)
