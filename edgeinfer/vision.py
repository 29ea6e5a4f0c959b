"""Images in prompts: a text model with its vision projector (an `mmproj` GGUF), as llama.cpp's libmtmd runs the
pair (tools/mtmd/mtmd.cpp).

A prompt's text holds a marker (`<__media__>`) where each image goes. The text between markers is tokenized as
it is (special tokens parsed), then each image becomes its family's tokens around the rows its projector gives:

    gemma3    <start_of_image> [the image's 256 rows, attending to each other non-causally] <end_of_image>
    idefics3  for each tile, row by row: <fake_token_around_image><row_R_col_C> [its rows], a "\\n" after each
              row of tiles but the last; then "\\n\\n" <fake_token_around_image> <global-img> [the overview's rows]
              <fake_token_around_image>

The rows go into the engine as a MediaPrompt: token ids (placeholders where the rows are) and the rows' spans.
The prefix cache keys the rows by the image's digest (its pixels), so the same image in a follow-up turn is not
computed again; encoded images are kept (IMAGE_CACHE of them, least recently used out) so it is not encoded again.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict

import numpy as np

from . import images as imgs
from .engine.sequence import MediaSpan
from .errors import EdgeInferError
from .models.clip import VisionEncoder
from .models.common import ModelLoadError

MARKER = "<__media__>"  # libmtmd's default media marker
IMAGE_CACHE = 16  # encoded images kept
MAX_IMAGES = 16  # images in one prompt


class NoVisionError(EdgeInferError, ValueError):
    """An image given to a model loaded without a projector."""


class MediaPrompt(list):
    """A prompt's token ids (a list, as every prompt is) with `media`: the spans of rows given as embeddings."""

    def __init__(self, ids, media=()):
        super().__init__(ids)
        self.media = tuple(media)


class Vision:
    """A projector loaded beside a text model: encodes images and builds prompts holding them."""

    def __init__(self, path, kb, tokenizer, text_dim: int):
        if getattr(kb, "NAME", "cpu") != "cpu":
            raise ModelLoadError(f"images on the {kb.NAME} backend are not there yet: use --device cpu")
        self.encoder = VisionEncoder(path, kb)
        self.cfg = cfg = self.encoder.cfg
        if cfg.text_dim != text_dim:
            raise ModelLoadError(f"projector {path}: its rows are {cfg.text_dim} wide but the text model's embeddings "
                                 f"are {text_dim}: it is not this model's projector")
        self.tokenizer = tokenizer
        self._cache: OrderedDict[str, list] = OrderedDict()
        self._lock = threading.Lock()
        self._pieces: dict[str, int] = {}
        # the projector's identity in every image's digest: another projector's rows never hit the prefix cache
        st = os.stat(path)
        with open(path, "rb") as f:
            self.identity = hashlib.sha256(f.read(1 << 20) + f"{st.st_size}".encode()).hexdigest()[:16]
        self.compute = None  # runs the encoder (the server's compute thread: engine.loop.exclusive), else inline
        soft = tokenizer.encode("<image_soft_token>" if cfg.projector == "gemma3" else "<image>", add_bos=False,
                                parse_special=True)
        self.placeholder = soft[0] if len(soft) == 1 else 0  # the rows' token ids (their embeddings are replaced)
        self.encoded = 0  # images encoded (not found in the cache)
        if cfg.projector == "idefics3":  # the tokens its images need, found now: a vocabulary without one fails here
            for piece in ("\n", "\n\n", "<fake_token_around_image>", "<global-img>"):
                self._lookup(piece)
        self.fetch_urls = False  # http(s) image URLs fetched (the server's --allow-image-urls), else refused

    @property
    def family(self) -> str:
        return self.cfg.projector

    def _lookup(self, piece: str, default: int | None = None) -> int:
        """libmtmd's lookup_token: the first id whose text (special tokens as written) is piece."""
        if not self._pieces:
            tok, pieces = self.tokenizer, {}
            for tid in range(tok.vocab_size - 1, -1, -1):  # from the end: the first id wins
                try:
                    pieces[tok.token_bytes(tid, special=True).decode("utf-8")] = tid
                except UnicodeDecodeError:
                    continue
            self._pieces = pieces  # whole, at once (another thread may be reading)
        tid = self._pieces.get(piece, default)
        if tid is None:
            raise ModelLoadError(f"the text model's vocabulary has no token {piece!r}, which {self.family}'s images "
                                 "need: is this the projector's own model?")
        return tid

    def encode(self, image: imgs.Image) -> tuple[list[np.ndarray], tuple]:
        """An image's rows, one (n, text_dim) array per encoder input (its tiles, then the overview), and its tile
        grid (rows, columns; idefics3), cached by digest."""
        with self._lock:
            got = self._cache.get(image.digest)
            if got is not None:
                self._cache.move_to_end(image.digest)
                return got
            prep = imgs.prepare(image, self.cfg)
            run = self.compute or (lambda f, *a: f(*a))
            got = [run(self.encoder.encode, x) for x in prep.inputs], prep.grid
            self.encoded += 1
            self._cache[image.digest] = got
            while len(self._cache) > IMAGE_CACHE:
                self._cache.popitem(last=False)
            return got

    def prompt(self, text: str, images: list, parse_special: bool = True, add_bos: bool | None = None) -> MediaPrompt:
        """The token ids and media spans of text with one MARKER per image (imgs.Image, bytes, or a path)."""
        pieces = text.split(MARKER)
        if len(pieces) - 1 != len(images):
            raise ValueError(f"the prompt has {len(pieces) - 1} image markers ({MARKER}) for {len(images)} images")
        if len(images) > MAX_IMAGES:
            raise ValueError(f"the prompt has {len(images)} images: at most {MAX_IMAGES}")
        tok = self.tokenizer
        ids: list[int] = []
        if add_bos is None:
            add_bos = bool(getattr(tok, "add_bos", False))
        if add_bos and tok.bos_id is not None:
            ids.append(tok.bos_id)
        media: list[MediaSpan] = []
        for i, piece in enumerate(pieces):
            ids += tok.encode(piece, add_bos=False, parse_special=parse_special)
            if i == 0 and len(ids) >= 2 and ids[0] == ids[1] == tok.bos_id:
                del ids[0]  # a template's BOS text after the one added (as LLM.render_chat)
            if i < len(images):
                self._add_image(ids, media, as_image(images[i]))
        return MediaPrompt(ids, media)

    def _add_image(self, ids: list, media: list, image: imgs.Image) -> None:
        rows, (gy, gx) = self.encode(image)
        tok = self.tokenizer

        def put(block: np.ndarray, non_causal: bool = False) -> None:
            digest = f"{self.identity}/{image.digest}/{len(media)}"
            media.append(MediaSpan(len(ids), block, digest, non_causal))
            ids.extend([self.placeholder] * len(block))

        if self.family == "gemma3":
            ids += tok.encode("<start_of_image>", add_bos=False, parse_special=True)
            put(rows[0], non_causal=True)
            ids += tok.encode("<end_of_image>", add_bos=False, parse_special=True)
            return
        for y in range(gy):
            for x in range(gx):
                ids += tok.encode(f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>", add_bos=False,
                                  parse_special=True)
                put(rows[y * gx + x])
            if y != gy - 1:
                ids.append(self._lookup("\n"))
        ids += [self._lookup("\n\n"), self._lookup("<fake_token_around_image>"), self._lookup("<global-img>")]
        put(rows[-1])
        ids.append(self._lookup("<fake_token_around_image>"))


def as_image(x) -> imgs.Image:
    """An imgs.Image from an Image, encoded bytes, a data: URL, or a file path."""
    if isinstance(x, imgs.Image):
        return x
    if isinstance(x, (bytes, bytearray)):
        return imgs.decode(bytes(x))
    if isinstance(x, str) and x.startswith("data:"):
        return imgs.decode_data_url(x)
    if isinstance(x, np.ndarray):
        return imgs.from_rgb(x)
    return imgs.load(x)


def split_images(messages, fetch_urls: bool = False, local_files: bool = True) -> tuple[list, list]:
    """Chat messages with image parts ({"type": "image_url", "image_url": {"url": "data:..."}} as OpenAI's: a
    data: URL only, as a request sends it; or, from Python, {"type": "image", "image": bytes, a path or an Image})
    -> the messages with each image part replaced by MARKER in its text, and the images in order. Messages without
    images come back as they are. fetch_urls: http(s) image URLs are fetched (else refused); local_files: image
    parts may name files (never for a request's messages)."""
    out, found = [], []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") in ("image_url", "image")
                                                    for p in content):
            out.append(m)
            continue
        text = []
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text" and isinstance(p.get("text"), str):
                text.append(p["text"])
            elif kind == "image_url":
                url = p.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str):
                    raise ValueError(f"messages[{i}].content[{j}].image_url must hold a url")
                if url.startswith(("http://", "https://")):
                    if not fetch_urls:
                        raise imgs.ImageError("http(s) image URLs are not fetched (the server's --allow-image-urls "
                                              "turns that on): send the image as a data: URL")
                    found.append(imgs.fetch_url(url))
                else:
                    found.append(imgs.decode_data_url(url))  # never a path: these come from requests
                text.append(MARKER)
            elif kind == "image":
                if not local_files:
                    raise ValueError(f"messages[{i}].content[{j}]: images come as image_url parts (data: URLs)")
                found.append(as_image(p.get("image")))
                text.append(MARKER)
            else:
                raise ValueError(f"messages[{i}].content[{j}] must be a text, image_url or image part")
        out.append({**m, "content": "".join(text)})
    return out, found
