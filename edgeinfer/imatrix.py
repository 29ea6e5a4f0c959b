"""Collecting an importance matrix (`edgeinfer imatrix`, llama.cpp's llama-imatrix): the model runs over a
calibration text in chunks, and every weight matrix's matmul inputs are summed, squared, per column.

The chunks are llama-imatrix's: the text tokenized as the model's file says (a BOS first where it adds
one), cut into chunks of n_ctx tokens, each chunk's first token replaced by BOS where the model adds one,
each chunk a fresh sequence. Every token of every chunk counts.

The inputs are observed without touching the models: the per-op forward (Model.forward_per_op, the
reference every backend call of which goes through the backend object it holds) runs on a shallow copy
of the model whose backend is `_Observer`, which hands every call to the real backend and, on the way,
gives the float32 input of each matmul (before its int8 quantization) to the Imatrix under the weight's
GGUF tensor name. The names come from the architecture's own table of layer tensors
(models.decoder.layer_tensors), keyed by the identity of each loaded weight. So nothing costs anything
when no imatrix is collected: the model and its backend are the ones every other run uses, unchanged.

What is collected is what llama-imatrix collects: every matrix of the layers (`blk.*`: attention, FFN, the
experts, one matrix each, counting only the tokens routed to it, the router `ffn_gate_inp` and the shared
expert's gate); `output.weight` only with process_output (and only where the file has its own output
matrix; a tied one is the token embedding, which llama.cpp never collects). A fused q/k/v or gate/up
tensor is one entry, its input counted once.
"""

from __future__ import annotations

import copy
import sys
import time

import numpy as np

from .engine.model_runner import Batch
from .models.decoder import layer_tensors, tensor_name
from .quant.imatrix import Imatrix, ImatrixError, column_sums

MIN_CTX = 16  # as perplexity: llama-imatrix skips dense matmuls of fewer than 16 tokens, so shorter chunks
# would collect differently from it


def weight_names(model, tensors, process_output: bool = False) -> dict[int, tuple[str, int, int]]:
    """id(weight object) -> (GGUF tensor name, matrix index, matrices): every loaded matrix of the model's
    layers whose input an imatrix records. tensors: the file's tensor names (has a fused q/k/v?)."""
    out = {}
    for i, lw in enumerate(model.layers):
        has = lambda t, i=i: tensor_name(t, "weight", i) in tensors  # noqa: E731
        for fields, tensor, part, shape, rows in layer_tensors(model.spec, model.cfg, has, i):
            w = getattr(lw, fields[0], None)  # a fused tensor's first part sees its input; the rest unnamed
            if part != "weight" or w is None:
                continue
            name = tensor_name(tensor, part, i)
            if rows == "experts":
                out.update((id(m), (name, e, len(w))) for e, m in enumerate(w))
            else:  # norm vectors are never a matmul's weight: named, never looked up
                out[id(w)] = (name, 0, 1)
    if process_output and "output.weight" in tensors and model.output is not model.tok_embd:
        out[id(model.output)] = ("output.weight", 0, 1)
    return out


class _Observer:
    """A backend that is the real one, but for the calls that multiply by a weight, which it also records
    into `imatrix`: matmul and matmul_many (their float input, before int8 quantization), moe_route (the
    router's input) and moe_shared_add (the shared expert gate's input)."""

    def __init__(self, kb, names: dict, imatrix: Imatrix):
        self._kb, self._names, self._imatrix = kb, names, imatrix
        # the QInput last recorded and its sums: q/k/v and gate/up read one (a QInput's rows are fixed once
        # made; a plain array may be a buffer written again, so it is summed every time)
        self._last = (None, None)

    def __getattr__(self, attr):
        return getattr(self._kb, attr)

    def _record(self, w, x) -> None:
        key = self._names.get(id(w))
        if key is None:
            return
        name, expert, n_mat = key
        if self._last[0] is not x or not hasattr(x, "x"):  # (held, so its id is not reused)
            rows = getattr(x, "x", x)  # a QInput's float32 rows
            self._last = (x, column_sums(np.asarray(rows, np.float32).reshape(-1, rows.shape[-1])))
        self._imatrix.add_sums(name, *self._last[1], expert, n_mat)

    def matmul(self, w, x, out=None):
        self._record(w, x)
        return self._kb.matmul(w, x, out)

    def matmul_many(self, ws, x):
        for w in ws:
            self._record(w, x)
        return self._kb.matmul_many(ws, x)

    def moe_route(self, h, router_t, *args):
        self._record(router_t, h)
        return self._kb.moe_route(h, router_t, *args)

    def moe_shared_add(self, out, s, h, w_gate):
        self._record(w_gate, h)
        return self._kb.moe_shared_add(out, s, h, w_gate)


def calibration_chunks(llm, text: str, n_ctx: int, chunks: int | None = None) -> list[list[int]]:
    """llama-imatrix's chunks of `text` for this model: tokenized with the model's BOS (if it adds one),
    n_ctx tokens each, the first of each replaced by BOS; at most `chunks` of them."""
    if n_ctx < MIN_CTX:
        raise ValueError(f"--ctx must be >= {MIN_CTX}, got {n_ctx}")
    if chunks is not None and chunks < 1:
        raise ValueError(f"--chunks must be >= 1, got {chunks}")
    tok = llm.tokenizer
    bos = tok.bos_id if tok.add_bos else None
    ids = tok.encode(text, add_bos=bos is not None)
    available = len(ids) // n_ctx
    if available == 0:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one chunk of --ctx {n_ctx}")
    out = []
    for c in range(available if chunks is None else min(chunks, available)):
        chunk = list(ids[c * n_ctx:(c + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        out.append(chunk)
    return out


def collect(llm, text: str, *, n_ctx: int = 512, chunks: int | None = None, process_output: bool = False,
            dataset: str = "", progress: bool = False, into: Imatrix | None = None) -> Imatrix:
    """The importance matrix of llm's model over `text` (see the module's docstring); `dataset` names the
    text in the file (llama.cpp: the path given). into: an Imatrix to add to (from --in-file files)."""
    llm._need_decoder()
    if n_ctx > llm.engine.max_context:
        raise ValueError(f"--ctx {n_ctx} is larger than the context {llm.engine.max_context} (raise --max-context)")
    pieces = calibration_chunks(llm, text, n_ctx, chunks)
    model = llm.model
    names = weight_names(model, llm.gguf.tensors, process_output)
    im = Imatrix(chunk_size=n_ctx)
    observed = copy.copy(model)  # the same weights; only its backend differs
    observed.kb = _Observer(model.kb, names, im)
    runner = llm.engine.scratch(n_ctx)  # after the compile started at load is done
    logits_idx = np.arange(n_ctx) if process_output else np.array([n_ctx - 1])
    from tqdm import tqdm

    bar = tqdm(pieces, desc="imatrix", unit="chunk", disable=not progress, file=sys.stderr)
    t0 = time.perf_counter()
    for c, chunk in enumerate(bar, 1):
        observed.forward_per_op(Batch.prefix(chunk, runner.cache.n_blocks, logits_idx), runner.cache)
        bar.set_postfix(tok_s=f"{c * n_ctx / (time.perf_counter() - t0):.0f}")
    bar.close()
    if into is not None:
        into.merge(im, n_ctx)
        im = into
    if dataset:
        im.datasets.append(dataset)
    im.chunk_size = n_ctx
    return im


def combine(paths, chunk_size: int = 512) -> Imatrix:
    """The files' imatrices added up (llama-imatrix --in-file): their sums and counts, a legacy file's
    values times its chunk count and chunk_size."""
    total = Imatrix(chunk_size=chunk_size)
    for p in paths:
        total.merge(Imatrix.load(p), chunk_size)
    return total


__all__ = ["ImatrixError", "calibration_chunks", "collect", "combine", "weight_names"]
