"""Vision projectors (mmproj): the loader, the preprocessing and the encoder against llama.cpp's libmtmd on the
random text + projector pairs of tests/vision_zoo.py (golden data: tests/golden/vision.json, made by
benchmarks/make_vision_golden.py)."""

import hashlib
import io
import json
import tempfile

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

import vision_zoo
from conftest import golden_path
from edgeinfer import images
from edgeinfer.kernels import get_backend
from edgeinfer.models.clip import VisionEncoder, config_from_gguf, pixel_shuffle
from edgeinfer.models.common import ModelLoadError
from edgeinfer.gguf_file import GGUFFile

REF = json.load(open(golden_path("vision.json")))
KB = get_backend("cpu")
# llama.cpp rounds the patches (its im2col), the activations of F16 matrices and the attention's K and V (flash
# attention) to halves: its rows differ from float32 ones by about 6e-4 of their largest value
TOL = 3e-3


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision")
    return {f: vision_zoo.write_pair(f, d) for f in vision_zoo.PAIRS}


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("family", sorted(vision_zoo.PAIRS))
def test_encoder_matches_libmtmd(pairs, family):
    text, proj = pairs[family]
    ref = REF["families"][family]
    assert (sha256(text), sha256(proj)) == (ref["text_sha256"], ref["mmproj_sha256"]), "the zoo files changed"
    enc = VisionEncoder(proj, KB)
    for case in ref["cases"]:
        w, h = case["size"]
        prep = images.prepare(images.from_rgb(vision_zoo.test_image(h, w)), enc.cfg)
        want = [np.array(c["image"], np.float32) for c in case["chunks"] if "image" in c]
        assert len(prep.inputs) == len(want), (w, h)
        for i, (x, r) in enumerate(zip(prep.inputs, want)):
            got = enc.encode(x)
            assert got.shape == r.shape == (enc.cfg.tokens_per_image, enc.cfg.text_dim)
            err = float(np.abs(got - r).max() / np.abs(r).max())
            assert err < TOL, (family, (w, h), i, err)
        # libmtmd decodes Gemma 3's image rows non-causally, SmolVLM's causally, one position a row
        for c in case["chunks"]:
            if "image" in c:
                assert c["non_causal"] == (family == "gemma3") and c["n_pos"] == len(c["image"])


@pytest.mark.parametrize("family", sorted(vision_zoo.PAIRS))
def test_preprocessing_is_libmtmds_byte_for_byte(family):
    # noise images of several sizes: each encoder input libmtmd built (recovered through an identity projector, see
    # make_vision_golden.py) has the bytes ours has, in the same order
    cfg = _cfg(family)
    for case in REF["families"][family]["pixels"]:
        w, h = case["size"]
        rgb = np.random.default_rng(w * 1000 + h).integers(0, 256, (h, w, 3), dtype=np.uint8)
        got = [hashlib.sha256(_unnormalized(x, cfg).tobytes()).hexdigest()
               for x in images.prepare(images.from_rgb(rgb), cfg).inputs]
        assert got == case["inputs"], (family, (w, h))


def test_older_smolvlm_files_preprocess_as_libmtmd():
    # an idefics3 projector without preproc_image_size (older SmolVLM files): libmtmd's other path (whole tiles by
    # rounding, a bicubic letterbox, the overview from the whole image), byte for byte
    import dataclasses

    cfg = dataclasses.replace(_cfg("idefics3"), longest_edge=0)
    for case in REF["families"]["idefics3"]["pixels_fallback"]:
        w, h = case["size"]
        rgb = np.random.default_rng(w * 1000 + h).integers(0, 256, (h, w, 3), dtype=np.uint8)
        prep = images.prepare(images.from_rgb(rgb), cfg)
        got = [hashlib.sha256(_unnormalized(x, cfg).tobytes()).hexdigest() for x in prep.inputs]
        assert got == case["inputs"], (w, h)
        assert len(got) == prep.grid[0] * prep.grid[1] + 1


def _unnormalized(x, cfg):
    # the bytes an encoder input was normalised from
    img = x.transpose(1, 2, 0).astype(np.float64) * np.array(cfg.std) + np.array(cfg.mean)
    return np.rint(img * 255.0).astype(np.uint8)


def test_resize_is_pillows_arithmetic():
    # where Pillow takes the horizontal pass first (a width change alone), its bytes are ours
    from PIL import Image

    rgb = np.random.default_rng(3).integers(0, 256, (19, 57, 3), dtype=np.uint8)
    for algo, method in (("bilinear", Image.Resampling.BILINEAR), ("bicubic", Image.Resampling.BICUBIC),
                         ("lanczos", Image.Resampling.LANCZOS)):
        for width in (5, 31, 100):
            want = np.asarray(Image.fromarray(rgb).resize((width, 19), method, reducing_gap=None))
            np.testing.assert_array_equal(images.resize(rgb, width, 19, algo), want)


def test_idefics3_tiles_as_libmtmd():
    # the tile grid follows the aspect ratio at the longest edge (128 here, tiles of 64): the golden cases' text
    # chunks name each tile's row and column, so the count of image chunks is gy * gx + 1
    ref = REF["families"]["idefics3"]
    cfg = _cfg("idefics3")
    for case in ref["cases"]:
        w, h = case["size"]
        prep = images.prepare(images.from_rgb(vision_zoo.test_image(h, w)), cfg)
        gy, gx = prep.grid
        assert sum("image" in c for c in case["chunks"]) == gy * gx + 1
    assert images.prepare(images.from_rgb(vision_zoo.test_image(30, 128)), cfg).grid == (1, 2)  # wide: one row
    assert images.prepare(images.from_rgb(vision_zoo.test_image(128, 20)), cfg).grid == (2, 1)  # tall: one column


def _cfg(family):
    with GGUFFile(_write_mmproj(family)) as gf:
        return config_from_gguf(gf)


_TMP = {}


def _write_mmproj(family, **kw):
    import tempfile

    key = (family, tuple(sorted(kw.items())))
    if key not in _TMP:
        path = tempfile.mkstemp(suffix=".gguf")[1]
        {"gemma3": vision_zoo.write_gemma3_mmproj, "idefics3": vision_zoo.write_idefics3_mmproj}[family](path, **kw)
        _TMP[key] = path
    return _TMP[key]


def test_gemma3_letterbox():
    # a wide image is scaled to the square's width, centred between black bars (normalised: (0 - mean) / std)
    cfg = _cfg("gemma3")
    x = images.prepare(images.from_rgb(np.full((32, 64, 3), 200, np.uint8)), cfg).inputs[0]
    assert x.shape == (3, 64, 64)
    bar = (np.float32(0) - np.float32(cfg.mean[0])) / np.float32(cfg.std[0])
    assert np.all(x[0, :16] == bar) and np.all(x[0, 48:] == bar)
    np.testing.assert_allclose(x[0, 16:48], (200 / 255 - cfg.mean[0]) / cfg.std[0], rtol=1e-6)


def test_quantized_projector_runs_on_the_int8_kernels(tmp_path):
    # Q8_0 matrices (as `quantize-model` or a -Q8_0 mmproj file gives them) go through kb.matmul: close to F16's
    f16 = VisionEncoder(_write_mmproj("idefics3"), KB)
    q8 = VisionEncoder(_write_mmproj("idefics3", mtype=T.Q8_0), KB)
    assert not isinstance(q8.layers[0].q[0], np.ndarray)
    x = images.prepare(images.from_rgb(vision_zoo.test_image(64, 64)), f16.cfg).inputs[0]
    a, b = f16.encode(x), q8.encode(x)
    assert float(np.abs(a - b).max() / np.abs(a).max()) < 0.05


def test_pixel_shuffle_is_the_definition():
    # pixel (y2*s + i, x2*s + j) channel c -> row y2*(P/s) + x2, column (i*s + j)*C + c; odd grids padded with zeros
    rng = np.random.default_rng(0)
    for ny, nx, s in ((4, 4, 2), (6, 3, 3), (5, 7, 2)):
        c = 3
        x = rng.standard_normal((ny * nx, c)).astype(np.float32)
        got = pixel_shuffle(x, ny, nx, s)
        py, px = -(-ny // s), -(-nx // s)
        want = np.zeros((py * px, s * s * c), np.float32)
        for y in range(ny):
            for xx in range(nx):
                col = ((y % s) * s + xx % s) * c
                want[(y // s) * px + xx // s, col:col + c] = x[y * nx + xx]
        np.testing.assert_array_equal(got, want)


def test_encoder_rejects_a_wrong_image_shape():
    enc = VisionEncoder(_write_mmproj("gemma3"), KB)
    with pytest.raises(ValueError, match="expected \\(3, H, W\\)"):
        enc.encode(np.zeros((3, 60, 64), np.float32))
    with pytest.raises(ValueError, match="position embeddings"):
        enc.encode(np.zeros((3, 128, 64), np.float32))


# ------------------------------------------------------------------------------------------- broken files

def _rewrite(src, dst, *, drop_keys=(), set_keys=None, drop_tensors=(), reshape=None):
    """A copy of the projector src with keys dropped or changed and tensors dropped or replaced."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), "clip")
    set_keys = dict(set_keys or {})
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture",) or name in drop_keys or name in set_keys:
            continue
        t = field.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(name, [float(field.parts[i][0]) for i in field.data])
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode())
        else:
            w.add_key_value(name, field.parts[field.data[0]][0], t)
    for name, (value, vtype) in set_keys.items():
        w.add_key_value(name, value, vtype)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        data = np.array(t.data)
        if reshape and t.name in reshape:
            data = np.zeros(reshape[t.name], data.dtype)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type if t.tensor_type not in (T.F32, T.F16) else None)
    vision_zoo.finish(w)
    return str(dst)


@pytest.mark.parametrize("change, message", [
    (dict(set_keys={"clip.projector_type": ("llava", gguf.GGUFValueType.STRING)}), "projector type 'llava' is not"),
    (dict(drop_keys=("clip.vision.image_size",)), "missing metadata key 'clip.vision.image_size'"),
    (dict(drop_keys=("clip.vision.projector.scale_factor",)), "'clip.vision.projector.scale_factor'"),
    (dict(set_keys={"clip.vision.patch_size": (7, gguf.GGUFValueType.UINT32)}), "not a multiple of the patch size"),
    (dict(set_keys={"clip.use_silu": (True, gguf.GGUFValueType.BOOL)}), "both clip.use_gelu and clip.use_silu"),
    (dict(set_keys={"clip.has_vision_encoder": (False, gguf.GGUFValueType.BOOL)}), "no vision encoder"),
    (dict(drop_tensors=("v.blk.1.attn_out.weight",)), "missing tensor 'v.blk.1.attn_out.weight'"),
    (dict(drop_tensors=("mm.model.fc.weight",)), "missing 2-D tensor 'mm.model.fc.weight'"),
    (dict(reshape={"v.blk.0.attn_q.weight": (64, 32)}), "'v.blk.0.attn_q.weight' has shape"),
    (dict(reshape={"v.position_embd.weight": (10, 64)}), "'v.position_embd.weight' has shape"),
])
def test_broken_projector_is_a_one_line_error(tmp_path, change, message):
    path = _rewrite(_write_mmproj("idefics3"), tmp_path / "broken.gguf", **change)
    with pytest.raises(ModelLoadError, match=message) as e:
        VisionEncoder(path, KB)
    assert "\n" not in str(e.value)


def test_a_text_model_is_not_a_projector(pairs, tmp_path):
    with pytest.raises(ModelLoadError, match="not a projector file: general.architecture is 'llama'"):
        VisionEncoder(pairs["idefics3"][0], KB)
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(ModelLoadError, match="projector file"):
        VisionEncoder(str(bad), KB)


# ------------------------------------------------------------------------------------------------ images

def _encoded(rgb, fmt, **kw):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, fmt, **kw)
    return buf.getvalue()


def test_decode_formats():
    rgb = vision_zoo.test_image(20, 30)
    for fmt in ("PNG", "BMP", "WEBP"):
        kw = {"lossless": True} if fmt == "WEBP" else {}
        im = images.decode(_encoded(rgb, fmt, **kw))
        assert im.size == (30, 20)
        np.testing.assert_array_equal(im.rgb, rgb)
    smooth = np.broadcast_to(np.linspace(0, 250, 30).astype(np.uint8)[None, :, None], (20, 30, 3)).copy()
    jpg = images.decode(_encoded(smooth, "JPEG", quality=95))  # lossy: near the pixels
    assert jpg.size == (30, 20) and np.abs(jpg.rgb.astype(int) - smooth).max() < 8
    # the same pixels give the same digest, whatever the container; other pixels another
    assert images.decode(_encoded(rgb, "PNG")).digest == images.from_rgb(rgb).digest
    assert images.from_rgb(rgb[::-1]).digest != images.from_rgb(rgb).digest


def test_decode_transparent_and_grey():
    from PIL import Image

    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 255
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, "PNG")
    assert images.decode(buf.getvalue()).rgb[0, 0].tolist() == [255, 0, 0]
    buf = io.BytesIO()
    Image.fromarray(np.full((3, 3), 77, np.uint8), "L").save(buf, "PNG")
    assert images.decode(buf.getvalue()).rgb[1, 1].tolist() == [77, 77, 77]


@pytest.mark.parametrize("data, message", [
    (b"", "empty"),
    (b"definitely not an image", "not an image this reads"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "could not be decoded|not an image"),
])
def test_decode_errors(data, message):
    with pytest.raises(images.ImageError, match=message):
        images.decode(data)


def test_data_urls_and_base64():
    png = _encoded(vision_zoo.test_image(8, 8), "PNG")
    import base64

    b64 = base64.b64encode(png).decode()
    assert images.decode_data_url("data:image/png;base64," + b64).size == (8, 8)
    assert images.decode_base64(b64).size == (8, 8)
    for bad, message in (("http://example.com/a.png", "must be a data: URL"),
                         ("data:image/png," + b64, "must be base64"),
                         ("data:text/plain;base64," + b64, "is not an image"),
                         ("data:image/png;base64,@@@", "not valid base64")):
        with pytest.raises(images.ImageError, match=message):
            images.decode_data_url(bad)


def test_image_limits(tmp_path, monkeypatch):
    with pytest.raises(images.ImageError, match="uint8 of shape"):
        images.from_rgb(np.zeros((4, 4), np.uint8))
    monkeypatch.setattr(images, "MAX_PIXELS", 100)
    with pytest.raises(images.ImageError, match="at most 100 pixels"):
        images.decode(_encoded(vision_zoo.test_image(20, 20), "PNG"))
    with pytest.raises(images.ImageError, match="cannot read image"):
        images.load(tmp_path / "missing.png")


# ------------------------------------------------------------------------------------------- the engine

LP_TOL = 0.6  # the golden tests' tolerance on log-probabilities


@pytest.fixture(scope="module")
def llms(pairs):
    from edgeinfer import LLM

    return {f: LLM(t, mmproj=m, progress=False) for f, (t, m) in pairs.items()}


def _image(case):
    w, h = case["size"]
    return images.from_rgb(vision_zoo.test_image(h, w))


def _last_logprobs(llm, prompt):
    from edgeinfer import SamplingParams

    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1, logprobs=20))[0]
    return out.logprobs[0]["top"]


def _lp_error(top, case):
    lse = case["last"]["lse"]
    ref = {i: v - lse for i, v in zip(case["last"]["ids"], case["last"]["logits"])}
    common = [abs(lp - ref[i]) for i, lp in top if i in ref]
    assert len(common) >= 15
    return max(common)


@pytest.mark.parametrize("family", sorted(vision_zoo.PAIRS))
def test_prompt_matches_libmtmd(llms, family):
    # "A<__media__>B": the same token ids around the images' rows as mtmd_tokenize, and after the whole prompt the
    # same next-token log-probabilities as llama.cpp (mtmd_helper_eval_chunks) within the golden tolerance
    llm = llms[family]
    for case in REF["families"][family]["cases"]:
        p = llm.vision.prompt("A<__media__>B", [_image(case)])
        want = []
        for c in case["chunks"]:
            want += c["text"] if "text" in c else [None] * len(c["image"])
        got = list(p)
        for m in p.media:
            got[m.start:m.end] = [None] * len(m.rows)
            assert m.non_causal == (family == "gemma3")
        assert got == want, case["size"]
        top = _last_logprobs(llm, p)
        assert top[0][0] == case["last"]["ids"][0]
        assert _lp_error(top, case) < LP_TOL, case["size"]
        # llama.cpp's greedy continuation, token for token up to its first near-tie
        from edgeinfer import SamplingParams

        g = case["greedy"]
        got_ids = llm.generate(p, SamplingParams(temperature=0, max_tokens=len(g["output_ids"]), ignore_eos=True))[0]
        n = next((i for i, m in enumerate(g["top1_top2_margins"]) if m < 0.25), len(g["output_ids"]))
        assert got_ids.token_ids[:n] == g["output_ids"][:n], case["size"]


def test_gemma3_images_attend_non_causally(llms):
    # the same rows attended causally miss llama.cpp's log-probabilities by more than the tolerance
    import dataclasses

    from edgeinfer.vision import MediaPrompt

    llm, case = llms["gemma3"], REF["families"]["gemma3"]["cases"][0]
    p = llm.vision.prompt("A<__media__>B", [_image(case)])
    causal = MediaPrompt(list(p), [dataclasses.replace(m, non_causal=False, digest="causal") for m in p.media])
    assert _lp_error(_last_logprobs(llm, causal), case) > LP_TOL


@pytest.mark.parametrize("family", sorted(vision_zoo.PAIRS))
def test_batched_and_chunked_equal_alone(pairs, llms, family):
    # two image prompts in one batch give each one's log-probabilities bit for bit; so does a prefill in chunks of
    # 8 tokens (a non-causal image is never cut: its chunk runs to its end); and a second run of the same prompts,
    # whose blocks come from the prefix cache (hits ending inside an image: its remaining rows computed)
    from edgeinfer import LLM, SamplingParams
    from edgeinfer.config import EngineConfig

    llm = llms[family]
    cases = REF["families"][family]["cases"][:2]
    prompts = [llm.vision.prompt("A<__media__>B", [_image(c)]) for c in cases]
    sp = SamplingParams(temperature=0, max_tokens=3, logprobs=5)
    alone = [llm.generate(p, sp)[0] for p in prompts]
    text, proj = pairs[family]
    fresh = LLM(text, mmproj=proj, progress=False)  # an empty prefix cache: both images computed in one batch
    both = fresh.generate([fresh.vision.prompt("A<__media__>B", [_image(c)]) for c in cases], sp)
    small = LLM(text, mmproj=proj, progress=False, engine_config=EngineConfig(max_num_batched_tokens=8))
    chunked = [small.generate(small.vision.prompt("A<__media__>B", [_image(c)]), sp)[0] for c in cases]
    cached = fresh.generate([fresh.vision.prompt("A<__media__>B", [_image(c)]) for c in cases], sp)
    assert fresh.stats()["prefix_cache_hits"] > 0
    for a, b, c, d in zip(alone, both, chunked, cached):
        assert a.token_ids == b.token_ids == c.token_ids == d.token_ids
        assert a.logprobs == b.logprobs == c.logprobs == d.logprobs


def test_follow_up_turn_reuses_the_image(llms):
    # the same image again: not encoded again, and its rows come from the prefix cache; another image: computed
    from edgeinfer import SamplingParams

    llm = llms["idefics3"]
    cases = REF["families"]["idefics3"]["cases"]
    sp = SamplingParams(temperature=0, max_tokens=2)
    first = llm.vision.prompt("Look: <__media__> and say", [_image(cases[2])])
    llm.generate(first, sp)
    encoded = llm.vision.encoded
    again = llm.vision.prompt("Look: <__media__> and say more", [_image(cases[2])])
    with llm.engine.run() as run:
        run.submit(again, sp)
        outs = list(run)
    assert llm.vision.encoded == encoded
    assert outs[0].num_cached_tokens >= again.media[-1].end // 16 * 16 - 16
    fresh = images.from_rgb(vision_zoo.test_image(77, 66, seed=99))  # an image no other test encodes
    other = llm.vision.prompt("Look: <__media__> and say more", [fresh])
    with llm.engine.run() as run:
        run.submit(other, sp)
        outs = list(run)
    assert llm.vision.encoded == encoded + 1
    assert outs[0].num_cached_tokens <= other.media[0].start


def test_chat_with_an_image_part(llms):
    import base64

    from edgeinfer import SamplingParams

    llm = llms["idefics3"]
    png = _encoded(vision_zoo.test_image(64, 64), "PNG")
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]
    p = llm.chat_prompt(msgs)
    assert len(p.media) == 5 and p.media[0].start > 0
    comp = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=4))
    assert len(comp.token_ids) == 4
    assert comp.prompt_token_ids == list(p)


def test_image_errors(pairs, llms):
    from edgeinfer import LLM
    from edgeinfer.vision import NoVisionError

    text, proj = pairs["idefics3"]
    plain = LLM(text, progress=False)
    with pytest.raises(NoVisionError, match="loaded without a vision projector"):
        plain.generate("A<__media__>B", images=[vision_zoo.test_image(8, 8)])
    with pytest.raises(ValueError, match="1 image markers .* for 2 images"):
        llms["idefics3"].generate("A<__media__>B", images=[vision_zoo.test_image(8, 8)] * 2)
    with pytest.raises(ValueError, match="17 images: at most 16"):  # refused before any is encoded
        llms["idefics3"].vision.prompt("<__media__>" * 17, [vision_zoo.test_image(8, 8)] * 17)
    with pytest.raises(ModelLoadError, match="rows are 64 wide but the text model's embeddings are 32"):
        d = tempfile.mkdtemp()
        vision_zoo.write_tiny_llama(d + "/narrow.gguf", dim=32)
        LLM(d + "/narrow.gguf", mmproj=proj, progress=False)


def test_inspect_and_memory_estimate_know_projectors(pairs):
    import json as _json

    from click.testing import CliRunner

    from edgeinfer.cli.main import main
    from edgeinfer.config import EngineConfig
    from edgeinfer.models.clip import memory_bytes
    from edgeinfer.server.servable import describe

    text, proj = pairs["idefics3"]
    run = CliRunner().invoke(main, ["inspect", proj, "--json", "--memory"])
    assert run.exit_code == 0, run.output
    info = _json.loads(run.output)
    assert info["projector"] == "idefics3" and info["rows_per_image"] == 16 and info["text_dim"] == 64
    mem = memory_bytes(proj)
    # the weights as held: F16 matrices as stored, the patch and position embeddings as float32
    assert 214_048 - 20_000 < mem["weights"] < 214_048 + 30_000 and mem["buffers"] > 64 * (4 * 64 + 2 * 128) * 4
    cfg = EngineConfig(max_context=256)
    plain, with_proj = describe(text, cfg), describe(text, cfg, mmproj=proj)
    assert with_proj["size"] - plain["size"] == mem["weights"] + mem["buffers"]


@pytest.mark.parametrize("family", sorted(vision_zoo.PAIRS))
def test_preempted_image_prompts_equal_alone(pairs, llms, family):
    # four image prompts in a KV pool that holds two: preempted and computed again (their images' rows too), each
    # ends as it does alone, bit for bit
    from edgeinfer import LLM, SamplingParams
    from edgeinfer.config import EngineConfig

    text, proj = pairs[family]
    cases = REF["families"][family]["cases"][:4]
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)
    alone = [llms[family].generate(llms[family].vision.prompt("A<__media__>B", [_image(c)]), sp)[0] for c in cases]
    prompt_blocks = -(-len(alone[0].prompt_token_ids) // 16)  # two prompts fit, not their answers
    tight = LLM(text, mmproj=proj, progress=False,
                engine_config=EngineConfig(num_kv_blocks=2 * prompt_blocks + 3, block_size=16, max_seqs=8))
    together = tight.generate([tight.vision.prompt("A<__media__>B", [_image(c)]) for c in cases], sp)
    assert tight.stats()["preemptions"] > 0
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


@pytest.mark.parametrize("window", [0, 5, 40])
def test_non_causal_rows_see_what_llama_cpp_masks_in(window):
    # rows of an image in a pass that starts mid-sequence: each sees keys up to the image's last position and, in a
    # sliding-window layer, back to its own window's start (llama.cpp's non-causal mask keeps the window); the rows
    # before the image stay causal. Against a dense numpy attention with that mask.
    from types import SimpleNamespace

    from edgeinfer.models.parts.attention import _non_causal

    rng = np.random.default_rng(window)
    n_ctx, first, H, KVH, D = 30, 10, 4, 2, 16
    kc = rng.standard_normal((n_ctx, KVH, D)).astype(np.float32)  # one block of 30 slots: slot = position
    vc = rng.standard_normal((n_ctx, KVH, D)).astype(np.float32)
    pos = np.arange(first, n_ctx, dtype=np.int64)
    q = rng.standard_normal((len(pos), H, D)).astype(np.float32)
    batch = SimpleNamespace(positions=pos, token_seq=np.zeros(len(pos), np.int64))
    tables = np.zeros((1, 1), np.int32)
    scale = np.float32(0.25)
    out = np.empty((len(pos), H, D), np.float32)
    KB.paged_attention(q, kc, vc, batch.token_seq, pos, tables, n_ctx, scale, window, np.float32(0), out)
    t0, t1 = 6, 16  # positions 16..25: the image
    _non_causal(KB, q, kc, vc, batch, tables, n_ctx, scale, window, np.float32(0), out, t0, t1, {})
    end = pos[t1 - 1]
    for t, p in enumerate(pos):
        hi = end if t0 <= t < t1 else p
        lo = max(0, p - window + 1) if window else 0
        for h in range(H):
            g = h // (H // KVH)
            s = (kc[lo:hi + 1, g] @ q[t, h]) * scale
            a = np.exp(s - s.max())
            want = (a / a.sum()) @ vc[lo:hi + 1, g]
            np.testing.assert_allclose(out[t, h], want, rtol=2e-5, atol=2e-6, err_msg=f"row {t} head {h}")


def test_decompression_bombs_16_bit_and_other_formats():
    import struct
    import zlib

    from PIL import Image

    # a PNG header claiming 20000 x 20000: refused before any pixel is decoded
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(  # noqa: E731
        ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")
    with pytest.raises(images.ImageError, match="at most|too large"):
        images.decode(bomb)
    # 16-bit grey: its high byte, as stb_image (llama.cpp's decoder) reads it
    buf = io.BytesIO()
    Image.fromarray(np.full((2, 3), 30000, np.uint16)).save(buf, "PNG")
    assert images.decode(buf.getvalue()).rgb[0, 0].tolist() == [117, 117, 117]
    # formats past the five are not opened (Pillow's TIFF plugin, here)
    buf = io.BytesIO()
    Image.fromarray(vision_zoo.test_image(4, 4)).save(buf, "TIFF")
    with pytest.raises(images.ImageError, match="not an image this reads"):
        images.decode(buf.getvalue())


def test_requests_never_name_files_and_a_context_with_an_image_is_refused(llms, tmp_path):
    from edgeinfer.openai import ollama_requests as OR
    from edgeinfer.openai import protocol as P
    from edgeinfer.vision import split_images

    png = tmp_path / "x.png"
    png.write_bytes(_encoded(vision_zoo.test_image(8, 8), "PNG"))
    msgs = [{"role": "user", "content": [{"type": "image", "image": str(png)}, {"type": "text", "text": "hi"}]}]
    assert len(split_images(msgs)[1]) == 1  # from Python: a path is fine
    with pytest.raises(ValueError, match="images come as image_url parts"):
        split_images(msgs, local_files=False)
    llm = llms["idefics3"]
    req = OR.parse_generate({"model": "m", "prompt": "more", "context": [5, llm.vision.placeholder, 7]})
    with pytest.raises(P.APIError, match="'context' that held an image cannot be continued"):
        OR._generate_body(llm, req)
