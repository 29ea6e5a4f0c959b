"""Vision projector files (`mmproj`, general.architecture "clip"): the image encoder that turns an image into
rows of the text model's embedding space, as llama.cpp's libmtmd runs it (tools/mtmd: clip.cpp's loader,
models/siglip.cpp's graph).

Two projector families, both a SigLIP vision transformer:

    patches = conv2d(image, patch_embd, stride p) + patch bias + position embeddings     (n_patches, d)
    each layer: x += attn(layernorm1(x)) (q, k, v, out with biases, every patch attends to every patch)
                x += fc2(act(fc1(layernorm2(x))))
    x = post_layernorm(x)
    gemma3:   average pool n_merge x n_merge patches, RMS norm times mm.soft_emb_norm, times mm.input_projection
    idefics3: pixel shuffle (each n_merge x n_merge block of patches into one row of n_merge^2 d), times
              mm.model.fc (SmolVLM)

The input is the preprocessed image (edgeinfer/images.py), float32 (3, H, W), already normalised. Encoders need
no cache: an image is computed whole. F16 and F32 matrices multiply through BLAS (`kb.dense`), quantized ones
through the int8 kernels (`kb.matmul`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gguf_file import GGUFError, GGUFFile
from .common import ModelLoadError, WeightLoader

FAMILIES = ("gemma3", "idefics3")
ACTS = ("gelu", "silu", "gelu_quick")  # clip.use_gelu, clip.use_silu, neither (llama.cpp's default)


@dataclass(frozen=True)
class VisionConfig:
    projector: str  # one of FAMILIES
    image_size: int  # the encoder's native side (pixels); images are resized or tiled to it
    patch_size: int
    dim: int
    ffn_dim: int
    n_layer: int
    n_head: int
    eps: float
    mean: tuple  # per channel, on [0, 1] values
    std: tuple
    n_merge: int  # gemma3: the pooling kernel; idefics3: the pixel shuffle's scale factor
    act: str  # one of ACTS
    text_dim: int  # the rows' width: the text model's embedding length
    longest_edge: int  # idefics3: the longest side an image is resized to before tiling (preproc_image_size; 0: none)

    @property
    def side_patches(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_image(self) -> int:
        """Rows of one encoded image (or tile) of the native size."""
        side = -(-self.side_patches // self.n_merge) if self.projector == "idefics3" else \
            self.side_patches // self.n_merge
        return side * side


def _key(gf: GGUFFile, key: str, default=None, *, required: bool = False):
    if key not in gf.metadata:
        if required:
            raise ModelLoadError(f"projector file: missing metadata key {key!r}")
        return default
    return gf.metadata[key]


def _positive(gf: GGUFFile, key: str, default=None) -> int:
    v = _key(gf, key, default, required=default is None)
    if isinstance(v, (list, np.ndarray)) or int(v) <= 0:
        raise ModelLoadError(f"projector file: metadata key {key!r} must be a positive integer, not {v!r}")
    return int(v)


def _triple(gf: GGUFFile, key: str) -> tuple:
    v = _key(gf, key, required=True)
    vals = [float(x) for x in np.asarray(v).ravel()]
    if len(vals) != 3:
        raise ModelLoadError(f"projector file: metadata key {key!r} must hold 3 values (R, G, B), not {len(vals)}")
    return tuple(vals)


def config_from_gguf(gf: GGUFFile) -> VisionConfig:
    """The vision encoder's configuration from an mmproj file's `clip.*` keys; a one-line error naming the key
    for a file that is not a vision projector of a supported family."""
    arch = gf.metadata.get("general.architecture")
    if arch != "clip":
        raise ModelLoadError(f"not a projector file: general.architecture is {arch!r}, expected 'clip' "
                             "(an mmproj GGUF made by llama.cpp's converter)")
    if not _key(gf, "clip.has_vision_encoder", False):
        raise ModelLoadError("projector file: it has no vision encoder (clip.has_vision_encoder is not true)")
    proj = _key(gf, "clip.projector_type", None) or _key(gf, "clip.vision.projector_type", None)  # libmtmd's order
    if proj is None:
        raise ModelLoadError("projector file: missing metadata key 'clip.projector_type'")
    if proj not in FAMILIES:
        raise ModelLoadError(f"projector type {proj!r} is not supported (supported: {', '.join(FAMILIES)})")
    gelu, silu = bool(_key(gf, "clip.use_gelu", False)), bool(_key(gf, "clip.use_silu", False))
    if gelu and silu:
        raise ModelLoadError("projector file: both clip.use_gelu and clip.use_silu are true")
    image_size = _positive(gf, "clip.vision.image_size")
    patch = _positive(gf, "clip.vision.patch_size")
    if image_size % patch:
        raise ModelLoadError(f"projector file: image size {image_size} is not a multiple of the patch size {patch}")
    dim = _positive(gf, "clip.vision.embedding_length")
    n_head = _positive(gf, "clip.vision.attention.head_count")
    if dim % n_head:
        raise ModelLoadError(f"projector file: embedding length {dim} is not a multiple of the {n_head} heads")
    # gemma3's pooling defaults to 4 (every released model); idefics3's converter always writes its factor
    n_merge = _positive(gf, "clip.vision.projector.scale_factor", 4 if proj == "gemma3" else None)
    if proj == "gemma3" and (image_size // patch) % n_merge:
        raise ModelLoadError(f"projector file: {image_size // patch} patches a side do not pool by {n_merge}")
    text_dim = _text_dim(gf, proj)
    return VisionConfig(
        projector=proj, image_size=image_size, patch_size=patch, dim=dim,
        ffn_dim=_positive(gf, "clip.vision.feed_forward_length"),
        n_layer=_positive(gf, "clip.vision.block_count"), n_head=n_head,
        eps=float(_key(gf, "clip.vision.attention.layer_norm_epsilon", required=True)),
        mean=_triple(gf, "clip.vision.image_mean"), std=_triple(gf, "clip.vision.image_std"),
        n_merge=n_merge, act="gelu" if gelu else "silu" if silu else "gelu_quick", text_dim=text_dim,
        longest_edge=_longest_edge(gf) if proj == "idefics3" else image_size,
    )


def memory_bytes(path) -> dict:
    """What a projector holds once loaded, from its file alone: its weights as stored (F16 stays F16; the patch
    embedding and position embeddings become float32) and the buffers of encoding one image (the activations of
    its patches through a layer, the widest F16 matrix widened for its GEMM), in bytes."""
    with GGUFFile(path) as gf:
        cfg = config_from_gguf(gf)
        weights, widest = 0, 0
        for name, t in gf.tensors.items():
            n = int(np.prod(t.shape))
            weights += n * 4 if name in ("v.patch_embd.weight", "v.position_embd.weight") else int(t.n_bytes)
            if t.ggml_type.name == "F16" and len(t.shape) == 2:
                widest = max(widest, n * 4)
    tokens = cfg.side_patches ** 2
    act = tokens * (4 * cfg.dim + 2 * cfg.ffn_dim) * 4  # x, its norm, q, k, v and the FFN's hidden rows
    return {"weights": weights, "buffers": act + widest}


def _longest_edge(gf: GGUFFile) -> int:
    # idefics3's preproc_image_size; without it (older files) 0: libmtmd's other preprocessing (images.py)
    key = "clip.vision.preproc_image_size"
    return _positive(gf, key) if key in gf.metadata else 0


def _text_dim(gf: GGUFFile, proj: str) -> int:
    name = "mm.input_projection.weight" if proj == "gemma3" else "mm.model.fc.weight"
    t = gf.tensors.get(name)
    if t is None or len(t.shape) != 2:
        raise ModelLoadError(f"projector file: missing 2-D tensor {name!r}")
    return int(t.shape[0] if proj == "gemma3" else t.shape[1])  # gemma3's is stored transposed


@dataclass
class VisionLayer:
    ln1: tuple  # (weight, bias)
    q: tuple  # (matrix (d, d), bias)
    k: tuple
    v: tuple
    o: tuple
    ln2: tuple
    up: tuple  # (matrix (ffn, d), bias): fc1
    down: tuple  # (matrix (d, ffn), bias): fc2


class VisionEncoder:
    """An mmproj file's encoder and projector; `encode` turns preprocessed images into text-embedding rows."""

    def __init__(self, path, kb):
        try:
            gf = GGUFFile(path)
        except GGUFError as e:
            raise ModelLoadError(f"projector file {path}: {e}") from None
        with gf:
            self.cfg = cfg = config_from_gguf(gf)
            self.kb = kb
            self._load(gf, cfg)

    def _load(self, gf: GGUFFile, cfg: VisionConfig) -> None:
        ld = WeightLoader(gf, self.kb, layouts=False)
        d, p = cfg.dim, cfg.patch_size
        n_patches = cfg.side_patches ** 2

        def vec(name, n, required=True):
            if not required and not ld.has(name):
                return None
            return ld.vector(name, n)

        def mat(name, rows, cols):
            info = gf.tensors.get(name)
            if info is None:
                raise ModelLoadError(f"projector file: missing tensor {name!r}")
            if tuple(info.shape) != (cols, rows):
                raise ModelLoadError(f"projector file: tensor {name!r} has shape {list(info.shape)}, "
                                     f"expected {[cols, rows]}")
            if info.ggml_type.name in ("F16", "F32"):
                return ld.float_matrix(name, rows, cols)
            return ld.matrix(name, rows, cols)

        def norm(prefix, n):
            return vec(prefix + ".weight", n), vec(prefix + ".bias", n)

        def linear(prefix, rows, cols):
            return mat(prefix + ".weight", rows, cols), vec(prefix + ".bias", rows, required=False)

        pe = gf.tensors.get("v.patch_embd.weight")
        if pe is None:
            raise ModelLoadError("projector file: missing tensor 'v.patch_embd.weight'")
        if tuple(pe.shape) != (p, p, 3, d) or pe.ggml_type.name not in ("F16", "F32"):
            raise ModelLoadError(f"projector file: tensor 'v.patch_embd.weight' has shape {list(pe.shape)} and type "
                                 f"{pe.ggml_type.name}, expected {[p, p, 3, d]}, F16 or F32")
        self.patch_w = np.array(gf.tensor("v.patch_embd.weight"), np.float32).reshape(d, 3 * p * p)
        self.patch_b = vec("v.patch_embd.bias", d, required=False)
        self.pos = mat("v.position_embd.weight", n_patches, d)
        if not isinstance(self.pos, np.ndarray):
            raise ModelLoadError("projector file: tensor 'v.position_embd.weight' must be F16 or F32")
        self.pos = np.asarray(self.pos, np.float32)
        self.pre_ln = norm("v.pre_ln", d) if ld.has("v.pre_ln.weight") else None
        self.post_ln = norm("v.post_ln", d) if ld.has("v.post_ln.weight") else None
        self.layers = []
        for i in range(cfg.n_layer):
            b = f"v.blk.{i}."
            up, down = b + "ffn_up", b + "ffn_down"
            info = gf.tensors.get(down + ".weight")
            if info is not None and int(info.shape[0]) == d:  # older converters named fc1 ffn_down (llama.cpp swaps)
                up, down = down, up
            self.layers.append(VisionLayer(
                ln1=norm(b + "ln1", d), q=linear(b + "attn_q", d, d), k=linear(b + "attn_k", d, d),
                v=linear(b + "attn_v", d, d), o=linear(b + "attn_out", d, d), ln2=norm(b + "ln2", d),
                up=linear(up, cfg.ffn_dim, d), down=linear(down, d, cfg.ffn_dim)))
        if cfg.projector == "gemma3":
            self.soft_norm = vec("mm.soft_emb_norm.weight", d)
            w = mat("mm.input_projection.weight", d, cfg.text_dim)  # stored (d, text) in numpy order
            if not isinstance(w, np.ndarray):
                raise ModelLoadError("projector file: tensor 'mm.input_projection.weight' must be F16 or F32")
            self.proj = np.ascontiguousarray(np.asarray(w).T)
        else:
            self.proj = mat("mm.model.fc.weight", cfg.text_dim, d * cfg.n_merge ** 2)

    # ---------------------------------------------------------------------------------------------- compute

    def _mm(self, w, x: np.ndarray, b=None) -> np.ndarray:
        y = self.kb.dense(w, x) if isinstance(w, np.ndarray) else self.kb.matmul(w, np.ascontiguousarray(x))
        if b is not None:
            y += b
        return y

    def encode(self, image: np.ndarray) -> np.ndarray:
        """One preprocessed image, float32 (3, H, W) with H and W multiples of the patch size (the native size
        for gemma3) -> its rows in the text model's embedding space, (n, text_dim) float32."""
        cfg, kb = self.cfg, self.kb
        p = cfg.patch_size
        c, h, w = image.shape
        if c != 3 or h % p or w % p:
            raise ValueError(f"an image of shape {image.shape}: expected (3, H, W) with H, W multiples of {p}")
        ny, nx = h // p, w // p
        if ny * nx != self.pos.shape[0]:
            raise ValueError(f"an image of {nx}x{ny} patches: this encoder's position embeddings hold "
                             f"{self.pos.shape[0]}")
        patches = image.reshape(3, ny, p, nx, p).transpose(1, 3, 0, 2, 4).reshape(ny * nx, 3 * p * p)
        x = np.ascontiguousarray(patches, np.float32) @ self.patch_w.T
        if self.patch_b is not None:
            x += self.patch_b
        x += self.pos
        if self.pre_ln is not None:
            x = kb.layernorm(x, *self.pre_ln, cfg.eps)
        hd = cfg.dim // cfg.n_head
        scale = np.float32(1.0 / np.sqrt(hd))
        starts = np.array([0, x.shape[0]], np.int64)
        for lw in self.layers:
            hcur = kb.layernorm(x, *lw.ln1, cfg.eps)
            q = self._mm(lw.q[0], hcur, lw.q[1]).reshape(-1, cfg.n_head, hd)
            k = self._mm(lw.k[0], hcur, lw.k[1]).reshape(-1, cfg.n_head, hd)
            v = self._mm(lw.v[0], hcur, lw.v[1]).reshape(-1, cfg.n_head, hd)
            att = kb.encoder_attention(q, k, v, starts, scale).reshape(-1, cfg.dim)
            x = x + self._mm(lw.o[0], att, lw.o[1])
            hcur = kb.layernorm(x, *lw.ln2, cfg.eps)
            f = self._mm(lw.up[0], hcur, lw.up[1])
            if cfg.act == "gelu":
                kb.gelu_(f, kb.GELU_F16)
            elif cfg.act == "silu":
                kb.silu(f)
            else:
                f = _gelu_quick(f)
            x = x + self._mm(lw.down[0], f, lw.down[1])
        if self.post_ln is not None:
            x = kb.layernorm(x, *self.post_ln, cfg.eps)
        if cfg.projector == "gemma3":
            return self._gemma3(x, ny, nx)
        return self._mm(self.proj, pixel_shuffle(x, ny, nx, cfg.n_merge))

    def _gemma3(self, x: np.ndarray, ny: int, nx: int) -> np.ndarray:
        k, d = self.cfg.n_merge, self.cfg.dim
        pooled = x.reshape(ny // k, k, nx // k, k, d).mean(axis=(1, 3), dtype=np.float32).reshape(-1, d)
        ms = np.mean(pooled * pooled, axis=-1, keepdims=True, dtype=np.float32)
        pooled = pooled / np.sqrt(ms + np.float32(self.cfg.eps)) * self.soft_norm
        return self.kb.dense(self.proj, np.ascontiguousarray(pooled, np.float32))


def pixel_shuffle(x: np.ndarray, ny: int, nx: int, s: int) -> np.ndarray:
    """Idefics3's pixel shuffle (llama.cpp's build_patch_merge_permute): patches (ny*nx, d) in rows of the image,
    zero-padded to multiples of s, each s x s block into one row of s*s*d, ordered (row in block, column in
    block, channel) -> (ny/s * nx/s, s*s*d)."""
    d = x.shape[1]
    grid = x.reshape(ny, nx, d)
    py, px = -(-ny // s) * s, -(-nx // s) * s
    if (py, px) != (ny, nx):
        grid = np.pad(grid, ((0, py - ny), (0, px - nx), (0, 0)))
    return np.ascontiguousarray(grid.reshape(py // s, s, px // s, s, d).transpose(0, 2, 1, 3, 4).reshape(-1, s * s * d))


def _gelu_quick(x: np.ndarray) -> np.ndarray:
    """Quick GELU, x * sigmoid(1.702 x), as ggml's CPU backend computes it: looked up in a table of half floats
    (the input rounded to a half, the result stored as one)."""
    h = x.astype(np.float16).astype(np.float32)
    y = h * (np.float32(1) / (np.float32(1) + np.exp(np.float32(-1.702) * h)))
    return y.astype(np.float16).astype(np.float32)
