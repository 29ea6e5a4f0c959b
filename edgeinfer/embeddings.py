"""The Python API's embeddings: `LLM.embed` and the token ids it computes (a mixin of llm.LLM, which holds the
model, tokenizer and engine these methods read)."""

from __future__ import annotations

import numpy as np

from .engine.llm_engine import PromptTooLongError


class Embeddings:
    """LLM's embedding methods (self: an llm.LLM)."""

    @property
    def embed_context(self) -> int:
        """The most tokens one text may have for embed()."""
        return self.config.context_length if self.is_encoder else self.engine.max_context

    def embed(self, texts, *, normalize: bool = True, truncate: bool = False, pooling: str | None = None,
              dimensions: int | None = None, batch_tokens: int = 8192) -> np.ndarray:
        """One vector per text: a float32 array (len(texts), dim), or (dim,) for a single str.

        texts: a str, a list of str, or a list of token-id lists. An encoder (nomic-bert) gives its pooled
        output (mean pooling, as the model's file says); a generative model gives its final hidden state
        after the output norm, mean-pooled over the tokens or the last token's (pooling="last"), as
        llama.cpp's --embedding does. normalize: unit length (L2). dimensions: keep the first n values
        (Matryoshka models such as nomic-embed-text-v1.5 are trained for it), renormalised. A text longer
        than the context is an error unless truncate, which keeps its first tokens (and the closing [SEP]).
        Texts are computed together, up to batch_tokens tokens per pass. nomic-embed expects a task
        prefix that the caller adds: "search_query: ..." for queries, "search_document: ..." for passages."""
        single = isinstance(texts, str)
        out = self.embed_ids(self.embed_tokens([texts] if single else texts, truncate), normalize=normalize,
                             pooling=pooling, dimensions=dimensions, batch_tokens=batch_tokens)
        return out[0] if single else out

    def embed_ids(self, seqs: list[list[int]], *, normalize: bool = True, pooling: str | None = None,
                  dimensions: int | None = None, batch_tokens: int = 8192) -> np.ndarray:
        """embed() of texts already through embed_tokens: (len(seqs), dim) float32."""
        if pooling is None:
            pooling = getattr(self.model, "pooling", "mean")
        if pooling not in ("mean", "cls", "last"):
            raise ValueError(f"pooling must be 'mean', 'cls' or 'last', got {pooling!r}")
        dim = self.config.dim
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or not 1 <= dimensions <= dim):
            raise ValueError(f"dimensions must be an integer in [1, {dim}], got {dimensions!r}")
        out = np.empty((len(seqs), dim), np.float32)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # like lengths together
        i = 0
        while i < len(order):
            group, n = [], 0
            while i < len(order) and (not group or n + len(seqs[order[i]]) <= batch_tokens):
                group.append(order[i])
                n += len(seqs[order[i]])
                i += 1
            states = self.model.encode([seqs[j] for j in group]) if self.is_encoder else \
                [self._decoder_states(seqs[j], pooling) for j in group]
            for j, h in zip(group, states):
                out[j] = h.mean(axis=0) if pooling == "mean" else (h[0] if pooling == "cls" else h[-1])
        if dimensions is not None:
            out = np.ascontiguousarray(out[:, :dimensions])
        if normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.float32(1e-12))
        return out

    def embed_tokens(self, texts, truncate: bool = False) -> list[list[int]]:
        """The token ids embed() computes for each text (with the model's special tokens), checked against
        the context (or truncated to it)."""
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
            raise ValueError("texts must be a non-empty list of strings or of token-id lists")
        tok, n_ctx = self.tokenizer, self.embed_context
        seqs = []
        for i, t in enumerate(texts):
            if isinstance(t, str):
                ids = tok.encode(t, add_bos=None)
            elif isinstance(t, (list, tuple)) and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                                                     for x in t):
                ids = [int(x) for x in t]
                bad = [x for x in ids if not 0 <= x < tok.vocab_size]
                if bad:
                    raise ValueError(f"text {i}: token id {bad[0]} is outside the vocabulary of {tok.vocab_size}")
            else:
                raise ValueError(f"text {i} must be a string or a list of token ids, got {type(t).__name__}")
            if not ids:
                raise ValueError(f"text {i} is empty: give at least one token")
            if len(ids) > n_ctx:
                if not truncate:
                    raise PromptTooLongError(f"text {i} has {len(ids)} tokens but the context holds {n_ctx}: "
                                             "shorten it, or truncate")
                sep = getattr(tok, "sep_id", None)
                ids = ids[: n_ctx - 1] + [ids[-1]] if sep is not None and ids[-1] == sep else ids[:n_ctx]
            seqs.append(ids)
        return seqs

    def _decoder_states(self, ids: list[int], pooling: str) -> np.ndarray:
        # a generative model's final hidden states, (n, dim) (only the last row for pooling "last"),
        # through a KV cache of its own so the engine's is untouched
        n = len(ids)
        return self.engine.scratch(n).prefix(ids, [n - 1] if pooling == "last" else np.arange(n), hidden=True)
