"""Images in: decoding (PNG, JPEG, WebP, GIF's first frame, BMP, via Pillow) and each vision family's
preprocessing as llama.cpp's libmtmd does it (tools/mtmd/mtmd-image.cpp), so an image gives the encoder the same
pixels there and here (for the lossless formats: JPEG decoders differ in their last bits, Pillow's from
stb_image's).

libmtmd's resampler is a port of Pillow's 8-bit `ImagingResample` (bilinear, bicubic, Lanczos; antialiased when
shrinking; fixed-point weights, a horizontal pass, then a vertical one, each rounded to bytes): `resize` is that
port in numpy (Pillow's own `resize` sometimes takes the vertical pass first, so its bytes can differ). Then each
value is scaled to [0, 1] and normalised by the projector's mean and std per channel.

    gemma3    the image letterboxed into the encoder's square (scaled so its long side fits, the short side
              centred between black bars), bilinear: one input
    idefics3  (SmolVLM) scaled so its long side is the projector's longest edge (Lanczos), then to whole tiles of
              the encoder's size (Lanczos), cut into tiles row by row; an overview of the whole image at the
              tile size (Lanczos, from the tiled image) comes after the tiles
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
from dataclasses import dataclass

import numpy as np

from .errors import EdgeInferError

MAX_IMAGE_BYTES = 32 << 20  # a request's image, encoded
MAX_PIXELS = 50_000_000  # a decoded image (a 48 MP phone photo fits; resampling holds it as int32 twice)
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # what Pillow may open (not its TIFF, PSD, EPS, ... plugins)


class ImageError(EdgeInferError, ValueError):
    """An image that cannot be read or used: not an image, a format Pillow cannot decode, too large, empty."""


@dataclass(frozen=True)
class Image:
    """A decoded image: RGB bytes (H, W, 3) uint8, and a digest of its pixels (the prompt cache's key for it)."""

    rgb: np.ndarray
    digest: str

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return int(self.rgb.shape[1]), int(self.rgb.shape[0])


def from_rgb(rgb: np.ndarray) -> Image:
    """An image from RGB bytes (H, W, 3) uint8."""
    rgb = np.ascontiguousarray(rgb)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.shape[0] < 1 or rgb.shape[1] < 1:
        raise ImageError(f"an RGB image must be uint8 of shape (height, width, 3), not {rgb.dtype} {rgb.shape}")
    if rgb.shape[0] * rgb.shape[1] > MAX_PIXELS:
        raise ImageError(f"image of {rgb.shape[1]}x{rgb.shape[0]} pixels: at most {MAX_PIXELS} pixels")
    h = hashlib.sha256(f"{rgb.shape[1]}x{rgb.shape[0]}:".encode())
    h.update(rgb.data)
    return Image(rgb, h.hexdigest())


def decode(data: bytes) -> Image:
    """An encoded image (PNG, JPEG, WebP, GIF, BMP, ...) -> Image; ImageError names what is wrong."""
    try:
        from PIL import Image as PILImage
        from PIL import UnidentifiedImageError
    except ImportError:  # pragma: no cover - Pillow is a dependency
        raise ImageError("reading images needs Pillow: pip install pillow") from None
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"the image is {len(data)} bytes: at most {MAX_IMAGE_BYTES}")
    try:
        with PILImage.open(io.BytesIO(data), formats=FORMATS) as im:
            if im.width * im.height > MAX_PIXELS:
                raise ImageError(f"image of {im.width}x{im.height} pixels: at most {MAX_PIXELS} pixels")
            im.seek(0)
            rgb = _to_rgb(im)
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError("not an image this reads (PNG, JPEG, WebP, GIF or BMP)") from None
    except PILImage.DecompressionBombError as e:
        raise ImageError(f"the image is too large: {e}") from None
    except Exception as e:  # a damaged file: Pillow's decoders raise many kinds
        raise ImageError(f"the image could not be decoded: {type(e).__name__}: {e}") from None
    return from_rgb(rgb)


def _to_rgb(im) -> np.ndarray:
    if im.mode.startswith("I;16") or im.mode == "I":  # 16-bit grey: its high byte, as stb_image gives 8 bits
        grey = (np.asarray(im).astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        im = im.convert("RGBA")  # transparency dropped, as stb_image (llama.cpp's decoder) does with 3 channels
    return np.asarray(im.convert("RGB"), np.uint8)


def decode_base64(text: str) -> Image:
    """A base64 image (Ollama's `images`) or a `data:` URL's payload."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image is not valid base64") from None
    return decode(raw)


def decode_data_url(url: str) -> Image:
    """`data:image/png;base64,...` -> Image."""
    if not url.startswith("data:"):
        raise ImageError("an image URL must be a data: URL (data:image/png;base64,...)")
    head, sep, payload = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        raise ImageError("a data: URL image must be base64 (data:image/png;base64,...)")
    mime = head[: -len(";base64")]
    if mime and not mime.startswith("image/"):
        raise ImageError(f"a data: URL of type {mime!r} is not an image")
    return decode_base64(payload)


def fetch_url(url: str, timeout: float = 10.0) -> Image:
    """An http(s) image, at most MAX_IMAGE_BYTES (the server's --allow-image-urls)."""
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        raise ImageError("an image URL must be an http(s) or data: URL")
    req = urllib.request.Request(url, headers={"User-Agent": "edgeinfer", "Accept": "image/*"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (http(s) only, checked above)
            data = r.read(MAX_IMAGE_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise ImageError(f"fetching the image {url[:200]} failed: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ImageError(f"fetching the image {url[:200]} failed: {getattr(e, 'reason', e)}") from None
    return decode(data)


def load(path) -> Image:
    """An image file -> Image."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_IMAGE_BYTES + 1)
    except OSError as e:
        raise ImageError(f"cannot read image {path}: {e.strerror or e}") from None
    return decode(data)


# ------------------------------------------------------------------------------------------- preprocessing

def resize(rgb: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """libmtmd's resize_pillow: RGB bytes to (height, width, 3), Pillow's 8-bit resampling arithmetic in libmtmd's
    order (always the horizontal pass first, each pass rounded to bytes; Pillow itself sometimes starts with the
    vertical one, which rounds differently). The same size: a copy."""
    if (rgb.shape[1], rgb.shape[0]) == (width, height):
        return rgb.copy()
    if not (0 < width <= 65536 and 0 < height <= 65536):
        raise ImageError(f"an image cannot be resized to {width}x{height}")
    out = rgb
    if width != rgb.shape[1]:
        out = _resample(out, 1, width, algo)
    if height != rgb.shape[0]:
        out = _resample(out, 0, height, algo)
    return out


_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}
_PRECISION = 22  # fixed-point bits of the weights: 32 - 8 - 2


def _filter(algo: str, x: float) -> float:
    if algo == "lanczos":
        if -3.0 <= x < 3.0:
            return _sinc(x) * _sinc(x / 3.0)
        return 0.0
    x = abs(x)
    if algo == "bilinear":
        return 1.0 - x if x < 1.0 else 0.0
    a = -0.5  # Pillow's bicubic
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _sinc(v: float) -> float:
    if v == 0.0:
        return 1.0
    pv = v * 3.141592653589793238462643383279502884
    return math.sin(pv) / pv


def _weights(in_size: int, out_size: int, algo: str) -> tuple[np.ndarray, np.ndarray]:
    """Per output pixel: the first input pixel, and the fixed-point weights of ksize input pixels from it (zero
    past the image's edge), as libmtmd's precompute_weights (double arithmetic, sums in order)."""
    scale = filterscale = in_size / out_size
    if filterscale < 1.0:
        filterscale = 1.0
    support = _SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    first = np.zeros(out_size, np.int64)
    w = np.zeros((out_size, ksize), np.float64)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        cnt = min(int(center + support + 0.5), in_size) - xmin
        ww = 0.0
        for x in range(cnt):
            w[xx, x] = _filter(algo, (x + xmin - center + 0.5) * ss)
            ww += w[xx, x]
        if ww != 0.0:
            w[xx, :cnt] /= ww
        first[xx] = xmin
    fixed = (w * float(1 << _PRECISION) + np.where(w < 0, -0.5, 0.5)).astype(np.int32)  # +-0.5, truncated
    return first, fixed


def _resample(img: np.ndarray, axis: int, out_size: int, algo: str) -> np.ndarray:
    """One pass along axis (1: columns, 0: rows) of an (H, W, 3) uint8 image."""
    in_size = img.shape[axis]
    first, k = _weights(in_size, out_size, algo)
    src = img.astype(np.int32)  # int32 sums, as libmtmd's (they fit: weights of 22 bits times bytes)
    shape = list(img.shape)
    shape[axis] = out_size
    acc = np.full(shape, 1 << (_PRECISION - 1), np.int32)
    for j in range(k.shape[1]):
        idx = np.minimum(first + j, in_size - 1)  # past the edge the weight is 0
        taps = k[:, j]
        if axis == 1:
            acc += src[:, idx, :] * taps[None, :, None]
        else:
            acc += src[idx, :, :] * taps[:, None, None]
    return np.clip(acc >> _PRECISION, 0, 255).astype(np.uint8)


def letterbox(rgb: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """libmtmd's resize with PAD_CEIL: scaled (float32 arithmetic) so the whole image fits width x height, centred
    on black."""
    h, w = rgb.shape[:2]
    if (w, h) == (width, height):
        return rgb.copy()
    scale = min(np.float32(width) / np.float32(w), np.float32(height) / np.float32(h))
    nw = min(int(np.ceil(np.float32(w) * scale)), width)
    nh = min(int(np.ceil(np.float32(h) * scale)), height)
    out = np.zeros((height, width, 3), np.uint8)
    y0, x0 = (height - nh) // 2, (width - nw) // 2
    out[y0:y0 + nh, x0:x0 + nw] = resize(rgb, nw, nh, algo)
    return out


def normalize(rgb: np.ndarray, mean, std) -> np.ndarray:
    """RGB bytes (H, W, 3) -> float32 (3, H, W): value / 255, minus the mean, over the std, per channel (float32)."""
    f = rgb.astype(np.float32) / np.float32(255.0)
    f = (f - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(f.transpose(2, 0, 1))


@dataclass(frozen=True)
class Prepared:
    """An image ready for the encoder: its inputs in the order the prompt holds them, and (idefics3) the tile grid
    (rows, columns) the inputs before the overview form."""

    inputs: list  # float32 (3, H, W) arrays
    grid: tuple = (0, 0)


def prepare(image: Image, cfg) -> Prepared:
    """An image preprocessed for a projector of configuration cfg (models.clip.VisionConfig)."""
    rgb, side = image.rgb, cfg.image_size
    if cfg.projector == "gemma3":
        return Prepared([normalize(letterbox(rgb, side, side, "bilinear"), cfg.mean, cfg.std)])
    if cfg.longest_edge <= 0:
        return _idefics3_fallback(rgb, cfg)
    # idefics3: the longest edge to L (even), whole tiles, row-major tiles then the overview
    h0, w0 = rgb.shape[:2]
    L = cfg.longest_edge
    ar = w0 / h0
    if w0 >= h0:
        w1, h1 = L, int(L / ar)
        h1 += h1 % 2
    else:
        w1, h1 = int(L * ar), L
        w1 += w1 % 2
    if w1 < 1 or h1 < 1:
        raise ImageError(f"an image of {w0}x{h0} pixels is too narrow to tile")
    gx, gy = -(-w1 // side), -(-h1 // side)
    r1 = resize(rgb, w1, h1, "lanczos")
    r2 = resize(r1, gx * side, gy * side, "lanczos")
    tiles = [normalize(r2[y * side:(y + 1) * side, x * side:(x + 1) * side], cfg.mean, cfg.std)
             for y in range(gy) for x in range(gx)]
    overview = normalize(resize(r2, side, side, "lanczos"), cfg.mean, cfg.std)
    return Prepared(tiles + [overview], (gy, gx))


def _idefics3_fallback(rgb: np.ndarray, cfg) -> Prepared:
    """libmtmd's preprocessing of an idefics3 projector without preproc_image_size (older SmolVLM files): each side
    rounded to whole tiles (half away from zero, at least one), the image letterboxed into that (bicubic, black
    bars) and cut into tiles row by row; the overview the whole image stretched to a tile (bicubic), last."""
    h0, w0 = rgb.shape[:2]
    side = cfg.image_size

    def whole_tiles(n: int) -> int:
        return max(side, int(math.floor(float(np.float32(n) / np.float32(side)) + 0.5)) * side)

    wb, hb = whole_tiles(w0), whole_tiles(h0)
    refined = letterbox(rgb, wb, hb, "bicubic")
    gx, gy = wb // side, hb // side
    tiles = [normalize(refined[y * side:(y + 1) * side, x * side:(x + 1) * side], cfg.mean, cfg.std)
             for y in range(gy) for x in range(gx)]
    overview = normalize(resize(rgb, side, side, "bicubic"), cfg.mean, cfg.std)
    return Prepared(tiles + [overview], (gy, gx))
