"""Small random text + projector (mmproj) pairs for the vision families, written with gguf.GGUFWriter from fixed
seeds: the arch zoo's method for images. llama.cpp's libmtmd (through the pinned llama-cpp-python) gave the
golden data in tests/golden/vision.json on these files (benchmarks/make_vision_golden.py).

Each projector is a SigLIP encoder of 2 layers, dim 64, 4 heads, ffn 128, F16 matrices (as llama.cpp's converter
writes them), LayerNorm eps 1e-6, GELU; the text model beside it has dim 64 (the projector's output width).
"""

from __future__ import annotations

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType as T

try:
    from tiny_models import add_tensor, finish, write_tiny_gemma3, write_tiny_llama
except ImportError:
    from .tiny_models import add_tensor, finish, write_tiny_gemma3, write_tiny_llama

DIM, FFN, HEADS, LAYERS, TEXT_DIM = 64, 128, 4, 2, 64
# SmolVLM's image tokens, control tokens of its vocabulary (the tiles' row/column names up to 4 x 4)
IDEFICS3_SPECIALS = ("<fake_token_around_image>", "<image>", "<global-img>",
                     *(f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)))


def _encoder(w: gguf.GGUFWriter, rng: np.random.Generator, image: int, patch: int, mtype: T, *, dim: int = DIM,
             ffn: int = FFN, heads: int = HEADS, layers: int = LAYERS, text_dim: int = TEXT_DIM) -> None:
    DIM, FFN, HEADS, LAYERS, TEXT_DIM = dim, ffn, heads, layers, text_dim  # noqa: N806 (the zoo's names)
    n = (image // patch) ** 2
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", image)
    w.add_uint32("clip.vision.patch_size", patch)
    w.add_uint32("clip.vision.embedding_length", DIM)
    w.add_uint32("clip.vision.feed_forward_length", FFN)
    w.add_uint32("clip.vision.block_count", LAYERS)
    w.add_uint32("clip.vision.projection_dim", TEXT_DIM)
    w.add_uint32("clip.vision.attention.head_count", HEADS)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.45, 0.4])
    w.add_array("clip.vision.image_std", [0.5, 0.55, 0.6])
    norm = lambda: 1 + 0.1 * rng.standard_normal(DIM)  # noqa: E731
    bias = lambda k, s=0.05: s * rng.standard_normal(k)  # noqa: E731
    mat = lambda r, c, m=1.0: rng.standard_normal((r, c)) * (m / np.sqrt(c))  # noqa: E731
    add_tensor(w, "v.patch_embd.weight", (rng.standard_normal((DIM, 3, patch, patch)) / np.sqrt(3 * patch * patch))
               .astype(np.float16), T.F16)
    add_tensor(w, "v.patch_embd.bias", bias(DIM))
    add_tensor(w, "v.position_embd.weight", 0.3 * rng.standard_normal((n, DIM)))
    for i in range(LAYERS):
        p = f"v.blk.{i}."
        add_tensor(w, p + "ln1.weight", norm())
        add_tensor(w, p + "ln1.bias", bias(DIM))
        for m in ("attn_q", "attn_k", "attn_v", "attn_out"):
            add_tensor(w, p + m + ".weight", mat(DIM, DIM, 1.5 if m in ("attn_q", "attn_k") else 1.0), mtype)
            add_tensor(w, p + m + ".bias", bias(DIM))
        add_tensor(w, p + "ln2.weight", norm())
        add_tensor(w, p + "ln2.bias", bias(DIM))
        add_tensor(w, p + "ffn_up.weight", mat(FFN, DIM), mtype)  # fc1
        add_tensor(w, p + "ffn_up.bias", bias(FFN))
        add_tensor(w, p + "ffn_down.weight", mat(DIM, FFN), mtype)  # fc2
        add_tensor(w, p + "ffn_down.bias", bias(DIM))
    add_tensor(w, "v.post_ln.weight", norm())
    add_tensor(w, "v.post_ln.bias", bias(DIM))


def write_gemma3_mmproj(path, *, mtype: T = T.F16, seed: int = 31) -> None:
    """Gemma 3's projector: image 64, patch 8 (8 x 8 patches), pooled 2 x 2 (projector.scale_factor 2, as
    llama.cpp's tiny test model) to 16 rows, RMS norm, the input projection to the text width."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", "gemma3")
    w.add_uint32("clip.vision.projector.scale_factor", 2)
    _encoder(w, rng, 64, 8, mtype)
    add_tensor(w, "mm.soft_emb_norm.weight", 1 + 0.1 * rng.standard_normal(DIM))
    # stored transposed: (vision dim, text dim) in numpy order
    add_tensor(w, "mm.input_projection.weight", rng.standard_normal((DIM, TEXT_DIM)) / np.sqrt(DIM), T.F16)
    finish(w)


def write_idefics3_mmproj(path, *, mtype: T = T.F16, seed: int = 32) -> None:
    """SmolVLM's projector: image 64, patch 8 (8 x 8 patches), pixel shuffle by 2 to 16 rows of 256, the fc to the
    text width; images resized to a longest side of 128 and tiled by 64 (preproc_image_size 128)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", "idefics3")
    w.add_uint32("clip.vision.projector.scale_factor", 2)
    w.add_uint32("clip.vision.preproc_image_size", 128)
    _encoder(w, rng, 64, 8, mtype)
    add_tensor(w, "mm.model.fc.weight", rng.standard_normal((TEXT_DIM, 4 * DIM)) / np.sqrt(4 * DIM), T.F16)
    finish(w)


def write_gemma3_text(path) -> None:
    write_tiny_gemma3(path, dim=TEXT_DIM, seed=33)


def write_idefics3_text(path) -> None:
    # "\n\n" as one token: libmtmd looks it up before the overview (SmolVLM's vocabulary has it)
    write_tiny_llama(path, dim=TEXT_DIM, seed=34, extra_specials=IDEFICS3_SPECIALS + ("\n\n",))


def write_smolvlm_bench_mmproj(path) -> None:
    """For benchmarks only: SmolVLM-256M's projector shape (SigLIP base: image 512, patch 16, 12 layers of 768, 12
    heads, ffn 3072; pixel shuffle 4 to 64 rows of the text model's 576), F16 as released."""
    rng = np.random.default_rng(41)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", "idefics3")
    w.add_uint32("clip.vision.projector.scale_factor", 4)
    w.add_uint32("clip.vision.preproc_image_size", 2048)
    _encoder(w, rng, 512, 16, T.F16, dim=768, ffn=3072, heads=12, layers=12, text_dim=576)
    add_tensor(w, "mm.model.fc.weight", rng.standard_normal((576, 16 * 768)) / np.sqrt(16 * 768), T.F16)
    finish(w)


def write_gemma3_bench_mmproj(path) -> None:
    """For benchmarks only: Gemma 3 4B's projector shape (SigLIP so400m: image 896, patch 14, 27 layers of 1152,
    16 heads, ffn 4304; pooled 4 x 4 to 256 rows of the text model's 2560), F16 as released."""
    rng = np.random.default_rng(42)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", "gemma3")
    _encoder(w, rng, 896, 14, T.F16, dim=1152, ffn=4304, heads=16, layers=27, text_dim=2560)
    add_tensor(w, "mm.soft_emb_norm.weight", 1 + 0.1 * rng.standard_normal(1152))
    add_tensor(w, "mm.input_projection.weight", rng.standard_normal((1152, 2560)) / np.sqrt(1152), T.F16)
    finish(w)


PAIRS = {
    "gemma3": (write_gemma3_text, write_gemma3_mmproj),
    "idefics3": (write_idefics3_text, write_idefics3_mmproj),
}


def write_pair(family: str, folder) -> tuple[str, str]:
    """Write a family's text model and projector into folder; returns their paths."""
    text, mmproj = PAIRS[family]
    t, m = f"{folder}/{family}-text.gguf", f"{folder}/{family}-mmproj.gguf"
    text(t)
    mmproj(m)
    return t, m


def test_image(h: int, w: int, seed: int = 7) -> np.ndarray:
    """A deterministic RGB image (h, w, 3) uint8: smooth gradients plus noise, so resampling matters."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255.0 / max(w - 1, 1), yy * 255.0 / max(h - 1, 1), (xx + yy) * 127.0 / max(h + w - 2, 1)], -1)
    return np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)


test_image.__test__ = False  # not a pytest test
