"""LoRA adapters: llama.cpp's GGUF adapter files, read strictly and set beside a decoder's matrices.

A file (convert_lora_to_gguf.py's) has `general.type` "adapter", `adapter.type` "lora", the base model's
`general.architecture`, an optional `adapter.lora.alpha`, and for each adapted tensor NAME a pair `NAME.lora_a`
(rank x n_in) and `NAME.lora_b` (n_out x rank); the token embeddings' pair has A and B swapped (A (vocab, rank), B
(dim, rank)), as llama.cpp's build_inp_embd reads them; norm vectors some converters add are skipped, as llama.cpp
skips them. Each adapted matrix then computes W x + scale * (alpha / rank) * B (A x) (the scale alone without an
alpha), the low-rank product beside the quantized matmul (kernels/cpu/lora.py), never merged into it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import Keys
from gguf.quants import dequantize

from ..gguf_file import GGUFError, GGUFFile
from .common import ModelLoadError
from .decoder import layer_tensors, tensor_name

_SKIPPED = "_norm.weight"  # llama.cpp: "TODO: add support for norm vector"


@dataclasses.dataclass
class Adapter:
    """One adapter file: its pairs by base tensor name, A (rank, n_in) and B (n_out, rank) float32 (the token
    embeddings' A (vocab, rank), B (dim, rank))."""

    path: Path
    alpha: float
    pairs: dict  # emptied once a LoraSet has taken them
    digest: str  # of the file's bytes: what the prefix caches key by

    @property
    def name(self) -> str:
        return self.path.name


def read(path, arch: str) -> Adapter:
    """The adapter at path for a model of architecture arch; ModelLoadError naming what does not fit."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"no adapter file {str(path)!r}")
    try:
        gf = GGUFFile(path)
    except (GGUFError, OSError) as e:
        raise ModelLoadError(f"{path.name}: not a readable GGUF adapter: {e}") from None
    with gf:
        kind = gf.get(Keys.General.TYPE)
        if kind != "adapter":
            raise ModelLoadError(f"{path.name} is not an adapter (general.type {kind!r}, expected 'adapter')")
        if gf.get(Keys.Adapter.TYPE) != "lora":
            raise ModelLoadError(f"{path.name}: adapter.type is {gf.get(Keys.Adapter.TYPE)!r}; only 'lora' adapters "
                                 "are supported")
        if gf.get(Keys.General.ARCHITECTURE) != arch:
            raise ModelLoadError(f"{path.name} is an adapter for {gf.get(Keys.General.ARCHITECTURE)!r} models, not for "
                                 f"this {arch!r} model")
        if gf.get(Keys.Adapter.ALORA_INVOCATION_TOKENS) is not None:
            raise ModelLoadError(f"{path.name} is an activated LoRA (adapter.alora.invocation_tokens): not supported "
                                 "yet")
        alpha = gf.get(Keys.Adapter.LORA_ALPHA, 0.0)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not np.isfinite(alpha):
            raise ModelLoadError(f"{path.name}: adapter.lora.alpha is {alpha!r}, not a number")
        halves: dict[str, dict] = {}
        for name, info in gf.tensors.items():
            if name.endswith(_SKIPPED):
                continue
            base, dot, part = name.rpartition(".")
            if part not in ("lora_a", "lora_b") or not base:
                raise ModelLoadError(f"{path.name}: tensor {name!r} is neither a .lora_a nor a .lora_b")
            if len(info.shape) != 2:
                raise ModelLoadError(f"{path.name}: tensor {name!r} has {len(info.shape)} dimensions, not 2")
            halves.setdefault(base, {})[part] = _floats(gf, name)
        pairs = {}
        for base, ab in halves.items():
            if len(ab) != 2:
                missing = "lora_b" if "lora_a" in ab else "lora_a"
                raise ModelLoadError(f"{path.name}: {base!r} has no {base}.{missing}: half a LoRA pair")
            pairs[base] = (ab["lora_a"], ab["lora_b"])
        if not pairs:
            raise ModelLoadError(f"{path.name} adapts no tensor")
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return Adapter(path, float(alpha), pairs, h.hexdigest())


def _floats(gf: GGUFFile, name: str) -> np.ndarray:
    # a tensor as float32 (numpy order), whatever its type: gguf's own dequantize for the quantized ones
    info = gf.tensors[name]
    if info.ggml_type in (T.F32, T.F16):
        return np.array(gf.tensor(name), np.float32)
    try:
        return np.ascontiguousarray(dequantize(gf.tensor_bytes(name), info.ggml_type), np.float32).reshape(
            tuple(reversed(info.shape)))
    except (NotImplementedError, ValueError) as e:
        raise ModelLoadError(f"tensor {name!r} has type {info.ggml_type.name}, which cannot be read ({e})") from None


class LoraSet:
    """A model's adapters, set beside its matrices: `layers` the model's LayerWeights with each adapted matrix an
    Adapted (the per-op forward runs these), `output` the adapted output matrix or None, `embd` the token
    embeddings' pairs [(adapter index, A (vocab, R), B transposed (R, dim), alpha, rank)], `rows` the scales of
    the rows now computing, `scales` each adapter's default scale (LLM(lora=...)); `part` every adapted matrix's
    pairs packed for the kernels (kernels/cpu/lora.py), `step` the same for the model's compiled step, or None where
    the step does not run an adapted matrix (rows with adapters at work then run per op)."""

    def __init__(self, model, gf: GGUFFile, adapters: list[Adapter], scales: list[float], names: list):
        kb, cfg, spec = model.kb, model.cfg, model.spec
        self.adapters, self.scales = adapters, np.asarray(scales, np.float32)
        self.names = list(names)  # what requests call them (serve's NAME=FILE)
        self.rows = kb.Rows(self.scales)
        kb.lora_warm_up()
        # the disk prompt cache's key: which adapters (a sequence's scales are in its own block ids: hash_ids)
        self.key = [a.digest for a in adapters]
        targets = {}  # base tensor name -> (layer, fields, shape, rows)
        for i in range(cfg.n_layer):
            has = lambda t, part="weight", i=i: tensor_name(t, part, i) in gf.tensors  # noqa: E731
            for fields, tensor, part, shape, rows in layer_tensors(spec, cfg.at(i), has, i):
                targets[tensor_name(tensor, part, i)] = (i, fields, shape, rows)
        per_layer = [dict() for _ in range(cfg.n_layer)]  # field -> [pairs]
        self.embd, out_pairs = [], []
        for j, ad in enumerate(adapters):
            for name, (a, b) in ad.pairs.items():
                rank = a.shape[1] if name == "token_embd.weight" else a.shape[0]
                if name == "token_embd.weight":
                    if model.output is model.tok_embd:
                        raise ModelLoadError(f"{ad.name}: an adapter on token_embd.weight, which this model's output "
                                             "also reads (tied embeddings): not supported")
                    _check(ad, name, b.shape == (cfg.dim, rank) and a.shape[0] == cfg.vocab_size,
                           f"A {list(a.shape)} and B {list(b.shape)} for embeddings ({cfg.vocab_size}, {cfg.dim})")
                    self.embd.append((j, np.ascontiguousarray(a), np.ascontiguousarray(b.T), ad.alpha, rank))
                    continue
                if name == "output.weight" and "output.weight" in gf.tensors:
                    shape, where = (cfg.vocab_size, cfg.dim), None
                elif name in targets:
                    i, fields, shape, rows = targets[name]
                    if rows is not None and not isinstance(rows, tuple):
                        raise ModelLoadError(f"{ad.name}: adapters on {name!r} ({rows} tensors) are not supported yet")
                    if len(shape) != 2:
                        raise ModelLoadError(f"{ad.name}: {name!r} is a vector: not a matrix an adapter can adapt")
                    where = (i, fields, rows)
                else:
                    raise ModelLoadError(f"{ad.name}: {name!r} is not a matrix of this model (an adapter for another "
                                         "base model?)")
                _check(ad, name, a.shape == (rank, shape[1]) and b.shape == (shape[0], rank),
                       f"A {list(a.shape)} and B {list(b.shape)} for a matrix {list(shape)} (expected A "
                       f"[rank, {shape[1]}], B [{shape[0]}, rank])")
                at = np.ascontiguousarray(a.T)
                if where is None:
                    out_pairs.append((j, at, np.ascontiguousarray(b.T), ad.alpha, rank))
                    continue
                i, fields, rows = where
                splits = np.cumsum((0, *rows)) if rows else (0, shape[0])
                for f, r0, r1 in zip(fields, splits[:-1], splits[1:]):
                    per_layer[i].setdefault(f, []).append((j, at, np.ascontiguousarray(b[r0:r1].T), ad.alpha, rank))
            ad.pairs = {}  # its tensors are copied above, transposed: not held twice while the rest are read and packed
        # every adapted matrix packed once, by an id (kernels/cpu/lora.py): the layers' by (layer, field), the output's
        matrices, self.where = [], {}
        for i, got in enumerate(per_layer):
            for f, p in got.items():
                self.where[(i, f)] = len(matrices)
                matrices.append(p)
        if out_pairs:
            matrices.append(out_pairs)
        self.part = kb.lora_pack(matrices)
        self.layers = [dataclasses.replace(lw, **{f: kb.Adapted(getattr(lw, f), self.where[(i, f)], self) for f in got})
                       for i, (lw, got) in enumerate(zip(model.layers, per_layer))]
        self.output = kb.Adapted(model.output, len(matrices) - 1, self) if out_pairs else None
        # the same for the compiled step, where it runs every adapted matrix (else rows with adapters run per op)
        stack = getattr(model, "stack", None)
        self.step = None if stack is None else stack.lora_part(self.part, self.where)

    def scales_for(self, chosen) -> np.ndarray:
        """Each adapter's scale for a request choosing `chosen` ((index or name, scale) pairs; an adapter left out at
        0), or None: the set's own scales (a copy: a later change of them leaves running requests as they were)."""
        if chosen is None:
            return self.scales.copy()
        out = np.zeros(len(self.adapters), np.float32)
        for key, scale in chosen:
            j = self.names.index(key) if isinstance(key, str) and key in self.names else key
            if not isinstance(j, int) or not 0 <= j < len(out):
                raise ValueError(f"lora: no adapter {key!r} (loaded: " + ", ".join(
                    f"{i} {n!r}" for i, n in enumerate(self.names)) + ")")
            out[j] = scale
        return out

    def set_rows(self, scales: np.ndarray | None = None) -> None:
        """The scales of the rows about to compute: `scales` (rows, adapters), or None: every row at the set's own
        scales as they are now (a change of them during a forward does not reach it)."""
        self.rows.scales = None if scales is None else np.ascontiguousarray(scales, np.float32)
        if scales is None:
            self.rows.uniform = self.scales.copy()

    def add_embeddings(self, kb, x, token_ids) -> None:
        """x (T, dim) += the token embeddings' adapters, before any embedding scale (as llama.cpp)."""
        ids = np.ascontiguousarray(kb.to_host(token_ids), np.int64)
        for j, a, bt, alpha, rank in self.embd:
            s = self.rows.column(j, len(ids), alpha, rank)
            if s.any():
                kb.lora_embed_add(ids, a, bt, s, x)


def check_file(ad: Adapter, gf: GGUFFile) -> None:
    """llama.cpp's checks of an adapter against a model file's tensors, before any model loads (the server's
    command line): each adapted tensor is in the file, with the shapes its pair needs."""
    for name, (a, b) in ad.pairs.items():
        info = gf.tensors.get(name)
        if info is None or len(info.shape) != 2:
            raise ModelLoadError(f"{ad.name}: {name!r} is not a matrix of this model (an adapter for another base "
                                 "model?)")
        n_in, n_out = info.shape
        if name == "token_embd.weight":
            n_in, n_out = a.shape[0], b.shape[0]  # (vocab, rank), (dim, rank)
            ok = (n_out, n_in) == tuple(info.shape) and a.shape[1] == b.shape[1]
        else:
            ok = a.shape[1] == n_in and b.shape[0] == n_out and a.shape[0] == b.shape[1]
        _check(ad, name, ok, f"A {list(a.shape)} and B {list(b.shape)} for a matrix {[n_out, n_in]}")


def _check(ad: Adapter, name: str, ok: bool, what: str) -> None:
    if not ok:
        raise ModelLoadError(f"{ad.name}: {name!r} does not fit the model: {what}")


def attach(model, gf: GGUFFile, loras: list) -> LoraSet:
    """Read each of loras (a path, (path, scale) or (path, scale, name); the name requests call it by, by default
    the file's stem) for model (loaded from gf) and set them beside its matrices as model.lora; ModelLoadError for
    an adapter that does not fit or a model that cannot take one."""
    kb = model.kb
    if not hasattr(kb, "Adapted"):
        raise ModelLoadError(f"LoRA adapters are not on the {kb.NAME} backend yet (use the CPU)")
    if getattr(model, "is_encoder", False) or not hasattr(model, "forward_per_op"):
        raise ModelLoadError(f"{model.cfg.arch} models take no LoRA adapters here (decoders do)")
    if model.spec.altup:
        raise ModelLoadError(f"{model.cfg.arch}'s AltUp streams take no LoRA adapters yet")
    adapters, scales, names = [], [], []
    for item in loras:
        path, scale, name = (item, 1.0, None) if isinstance(item, (str, Path)) else (*item, None)[:3]
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not np.isfinite(scale):
            raise ModelLoadError(f"the scale of adapter {str(path)!r} is {scale!r}, not a number")
        adapters.append(read(path, model.cfg.arch))
        scales.append(float(scale))
        names.append(str(name) if name else Path(path).stem)
    if len(set(names)) != len(names):
        raise ModelLoadError(f"two adapters are called {next(n for n in names if names.count(n) > 1)!r}: name them")
    model.lora = LoraSet(model, gf, adapters, scales, names)
    return model.lora
