"""Importance matrices: llama.cpp's two file formats (quant/imatrix.py), the collection (edgeinfer/imatrix.py)
checked against a numpy forward pass of its own, and `edgeinfer imatrix`."""

import hashlib
import json
import math
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import golden_path
from gguf.constants import GGMLQuantizationType as T
from tiny_models import write_tiny_llama

import edgeinfer
from edgeinfer import LLM
from edgeinfer.cli.main import main
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.imatrix import calibration_chunks, collect, combine
from edgeinfer.quant.imatrix import Imatrix, ImatrixError

TEXT = ("The quick brown fox jumps over the lazy dog; then the hen sat on the mat and the dog ran in the rain. "
        "In a hole in the ground there lived a hobbit, and on the other side of the hill a cat slept. ") * 12
CTX = 32  # tokens per chunk in the collection tests


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def sample(seed=0) -> Imatrix:
    """A dense entry, an MoE entry (4 experts, the third never reached) and a 1-D one, with in_sum."""
    rng = np.random.default_rng(seed)
    im = Imatrix(datasets=["calib.txt"], chunk_size=64)
    im.accumulate("blk.0.attn_q.weight", rng.standard_normal((128, 32)))
    for e, n in ((0, 50), (1, 30), (3, 48)):
        im.accumulate("blk.0.ffn_gate_exps.weight", rng.standard_normal((n, 32)) * (e + 1), e, 4)
    im.accumulate("blk.0.ffn_gate_inp_shexp.weight", rng.standard_normal((128, 32)))
    return im


def model_shapes():  # ggml order: (cols, rows[, experts])
    return {"blk.0.attn_q.weight": (32, 64), "blk.0.ffn_gate_exps.weight": (32, 96, 4),
            "blk.0.ffn_gate_inp_shexp.weight": (32,), "token_embd.weight": (32, 300)}


# -- the GGUF format --------------------------------------------------------------------------------


def test_gguf_round_trip(tmp_path):
    im = sample()
    p = tmp_path / "im.gguf"
    assert im.save(p) == "gguf"
    back = Imatrix.load(p)
    assert not back.legacy and back.datasets == ["calib.txt"] and back.chunk_size == 64
    assert back.chunk_count == 128 // 64
    assert back.names == im.names
    for name in im.names:
        a, b = im.entries[name], back.entries[name]
        assert b.sums.shape == a.sums.shape and np.allclose(b.sums, a.sums, rtol=1e-6)
        assert np.array_equal(b.counts, a.counts) and np.allclose(b.in_sum, a.in_sum, rtol=1e-5, atol=1e-4)
        want = np.ones_like(a.sums)
        live = a.counts > 0
        want[live] = a.sums[live] / a.counts[live][:, None]
        assert back.importance(name).dtype == np.float32
        np.testing.assert_allclose(back.importance(name), want, rtol=1e-6)
    moe = back.importance("blk.0.ffn_gate_exps.weight")
    assert moe.shape == (4, 32) and np.all(moe[2] == 1.0)  # the expert no token reached: weights of 1
    assert back.importance("blk.9.attn_q.weight") is None  # not in the imatrix: quantized without weights


def test_gguf_file_has_llama_cpp_names_keys_and_shapes(tmp_path):
    p = tmp_path / "im.gguf"
    sample().save(p)
    r = gguf.GGUFReader(p)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert set(fields) == {"general.type", "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"}
    assert fields["general.type"].contents() == "imatrix"
    assert fields["imatrix.datasets"].contents() == ["calib.txt"]
    assert fields["imatrix.chunk_count"].types == [gguf.GGUFValueType.UINT32]
    assert fields["imatrix.chunk_size"].types == [gguf.GGUFValueType.UINT32]
    assert fields["imatrix.chunk_size"].contents() == 64
    tensors = {t.name: t for t in r.tensors}
    assert all(t.tensor_type == T.F32 for t in tensors.values())
    dense, moe = "blk.0.attn_q.weight", "blk.0.ffn_gate_exps.weight"
    # ggml order; ggml drops trailing dimensions of 1, so a dense matrix's tensors are 1-D, as llama.cpp's
    assert list(tensors[f"{dense}.in_sum2"].shape) == [32] and list(tensors[f"{dense}.counts"].shape) == [1]
    assert list(tensors[f"{moe}.in_sum2"].shape) == [32, 4] and list(tensors[f"{moe}.counts"].shape) == [1, 4]
    assert list(tensors[f"{moe}.counts"].data.reshape(-1)) == [50, 30, 0, 48]
    assert f"{dense}.in_sum" in tensors
    # llama.cpp writes each name's tensors in sorted name order
    stems = [t.name.rsplit(".", 1)[0] for t in r.tensors]
    assert stems == sorted(stems, key=lambda s: s)
    with GGUFFile(p) as gf:  # and edgeinfer's strict reader takes it
        assert gf.get("general.type") == "imatrix" and "general.architecture" not in gf.metadata


def write_like_llama_cpp(path, entries, datasets=("wiki.train.raw",), chunks=10, chunk_size=512):
    """An imatrix written with plain gguf.GGUFWriter, 2-D tensors as ggml_new_tensor_2d makes them, no in_sum
    (llama.cpp before in_sum): our reader must take what llama-imatrix wrote."""
    w = gguf.GGUFWriter(str(path), "llama")
    del w.kv_data[0]["general.architecture"]
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", list(datasets))
    w.add_uint32("imatrix.chunk_count", chunks)
    w.add_uint32("imatrix.chunk_size", chunk_size)
    for name, (sums, counts) in entries.items():
        w.add_tensor(f"{name}.in_sum2", np.asarray(sums, np.float32))
        w.add_tensor(f"{name}.counts", np.asarray(counts, np.float32).reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_reads_a_file_written_as_llama_imatrix_does(tmp_path):
    p = tmp_path / "llama.imatrix.gguf"
    sums = np.arange(1, 33, dtype=np.float32).reshape(1, 32) * 512
    moe = np.arange(1, 65, dtype=np.float32).reshape(2, 32)
    write_like_llama_cpp(p, {"blk.0.attn_q.weight": (sums, [512]), "blk.0.ffn_gate_exps.weight": (moe, [4, 0])})
    im = Imatrix.load(p)
    assert im.datasets == ["wiki.train.raw"] and im.chunk_count == 10 and im.chunk_size == 512
    np.testing.assert_array_equal(im.importance("blk.0.attn_q.weight"), np.arange(1, 33, dtype=np.float32)[None])
    imp = im.importance("blk.0.ffn_gate_exps.weight")
    np.testing.assert_array_equal(imp[0], moe[0] / 4)
    assert np.all(imp[1] == 1)
    assert im.entries["blk.0.ffn_gate_exps.weight"].in_sum is None


# -- the legacy format ------------------------------------------------------------------------------


def parse_dat(data: bytes):
    """The .dat layout, read independently: [(name, ncall, values)], trailer chunk count, dataset."""
    (n,), pos, out = struct.unpack_from("<i", data), 4, []
    for _ in range(n):
        (size,) = struct.unpack_from("<i", data, pos)
        name = data[pos + 4:pos + 4 + size].decode()
        pos += 4 + size
        ncall, nval = struct.unpack_from("<ii", data, pos)
        out.append((name, ncall, np.frombuffer(data, "<f4", nval, pos + 8)))
        pos += 8 + 4 * nval
    chunks, size = struct.unpack_from("<ii", data, pos)
    assert pos + 8 + size == len(data)
    return out, chunks, data[pos + 8:].decode()


def test_dat_layout_and_round_trip(tmp_path):
    im = sample()
    p = tmp_path / "im.dat"
    assert im.save(p) == "dat"
    entries, chunks, dataset = parse_dat(p.read_bytes())
    assert [e[0] for e in entries] == im.names and chunks == 2 and dataset == "calib.txt"
    for name, ncall, vals in entries:
        e = im.entries[name]
        assert ncall == math.ceil(e.counts.max() / 64)  # ceiling division, as llama.cpp
        c = np.where(e.counts == 0, 1, e.counts)[:, None]
        want = np.where(e.counts[:, None] == 0, 1.0, e.sums / c) * ncall
        np.testing.assert_allclose(vals, want.reshape(-1), rtol=1e-6)
    back = Imatrix.load(p)
    assert back.legacy and back.datasets == ["calib.txt"] and back.chunk_count == 2
    back.check(model_shapes())  # gives the MoE entry its 4 x 32 shape
    gg = tmp_path / "im.gguf"
    im.save(gg)
    ref = Imatrix.load(gg)
    for name in im.names:
        np.testing.assert_allclose(back.importance(name), ref.importance(name), rtol=1e-6)


def test_handwritten_dat_values_over_ncall(tmp_path):
    vals = np.arange(1, 9, dtype="<f4")  # one "MoE" entry: 2 experts x 4 columns, one shared ncall
    body = struct.pack("<i", 2)
    for name, ncall, v in (("blk.0.ffn_up_exps.weight", 10, vals), ("blk.0.attn_k.weight", 0, vals[:4])):
        body += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, v.size) + v.tobytes()
    p = tmp_path / "old.dat"
    p.write_bytes(body)  # no trailer: very old files end after the entries
    im = Imatrix.load(p)
    assert im.legacy and im.datasets == [] and im.chunk_count == 0
    np.testing.assert_allclose(im.importance("blk.0.ffn_up_exps.weight"), (vals / 10)[None])
    np.testing.assert_array_equal(im.importance("blk.0.attn_k.weight"), vals[:4][None])  # ncall 0: as stored
    im.check({"blk.0.ffn_up_exps.weight": (4, 6, 2), "blk.0.attn_k.weight": (4, 8)})
    np.testing.assert_allclose(im.importance("blk.0.ffn_up_exps.weight"), (vals / 10).reshape(2, 4))


def test_output_format_by_name_or_option(tmp_path):
    im = sample()
    assert im.save(tmp_path / "a.dat") == "dat" and (tmp_path / "a.dat").read_bytes()[:4] != b"GGUF"
    assert im.save(tmp_path / "a.imatrix") == "gguf" and (tmp_path / "a.imatrix").read_bytes()[:4] == b"GGUF"
    assert im.save(tmp_path / "b.dat", "gguf") == "gguf" and (tmp_path / "b.dat").read_bytes()[:4] == b"GGUF"
    assert Imatrix.load(tmp_path / "b.dat").legacy is False  # content decides, not the name
    assert not list(tmp_path.glob(".*partial"))


def test_merge_adds_sums_and_converts_legacy(tmp_path):
    a = sample(1)
    a.save(tmp_path / "a.dat")
    b = sample(2)
    b.save(tmp_path / "b.gguf")
    total = combine([tmp_path / "a.dat", tmp_path / "b.gguf"], chunk_size=64)
    total.check(model_shapes())
    q = "blk.0.attn_q.weight"
    assert total.entries[q].counts[0] == 128 + 128  # the .dat's ncall (2) times the chunk size
    want = (a.entries[q].sums + b.entries[q].sums) / 256
    np.testing.assert_allclose(total.importance(q), want, rtol=1e-5)
    assert total.datasets == ["calib.txt", "calib.txt"]


# -- malformed files ---------------------------------------------------------------------------------


def assert_one_line_error(path, fragment=""):
    with pytest.raises(ImatrixError) as e:
        Imatrix.load(path)
    msg = str(e.value)
    assert "\n" not in msg and fragment in msg, msg
    return msg


def test_malformed_legacy_files(tmp_path):
    p = tmp_path / "x.dat"
    for data, fragment in [
        (b"", "empty"),
        (b"hello world, this is text and not an imatrix at all", "not an imatrix file"),
        (struct.pack("<i", 2 ** 31 - 1) + b"\0" * 64, "declares 2147483647 entries"),
        (struct.pack("<i", 0), "declares 0 entries"),
        (struct.pack("<ii", 1, -5) + b"\0" * 20, "name length of -5"),
        (struct.pack("<ii", 1, 3) + b"abc" + struct.pack("<ii", 1, 2 ** 30) + b"\0" * 16, "truncated"),
        (struct.pack("<ii", 1, 1) + b"a" + struct.pack("<ii", 1, 1) + struct.pack("<f", float("nan")), "NaN"),
        (struct.pack("<ii", 1, 1) + b"a" + struct.pack("<ii", -3, 1) + struct.pack("<f", 1.0), "negative"),
        (struct.pack("<ii", 1, 2) + b"\xff\xfe" + struct.pack("<ii", 1, 1) + struct.pack("<f", 1.0), "UTF-8"),
    ]:
        p.write_bytes(data)
        assert_one_line_error(p, fragment)
    # every cut of a good file fails in one line, but those the trailer may end at (llama.cpp reads it if it is
    # there: the chunk count, then the dataset name)
    sample().save(p)
    good = p.read_bytes()
    entries_end = len(good) - 8 - len("calib.txt")
    for cut in range(len(good)):
        p.write_bytes(good[:cut])
        if cut in (entries_end, entries_end + 4):
            assert Imatrix.load(p).datasets == []
        else:
            assert_one_line_error(p)


def test_malformed_gguf_files(tmp_path, tiny_llama_path):
    p = tmp_path / "x.gguf"
    sample().save(p)
    good = p.read_bytes()
    for cut in (4, 20, 100, len(good) // 2, len(good) - 1):
        (tmp_path / "cut.gguf").write_bytes(good[:cut])
        assert_one_line_error(tmp_path / "cut.gguf")
    assert_one_line_error(tiny_llama_path, "not an imatrix")  # a model, not an imatrix
    q = np.ones((1, 32), np.float32)
    write_like_llama_cpp(p, {"blk.0.attn_q.weight": (q * np.nan, [5])})
    assert_one_line_error(p, "NaN")
    write_like_llama_cpp(p, {"blk.0.attn_q.weight": (q, [-1])})
    assert_one_line_error(p, "negative")
    write_like_llama_cpp(p, {"blk.0.attn_q.weight": (np.ones((3, 32), np.float32), [1, 2, 3, 4, 5])})
    assert_one_line_error(p, "96 sums for 5 counts")

    def write(tensors, keys=True):
        w = gguf.GGUFWriter(str(p), "llama")
        w.add_string("general.type", "imatrix")
        if keys:
            w.add_array("imatrix.datasets", ["a"])
            w.add_uint32("imatrix.chunk_count", 1)
            w.add_uint32("imatrix.chunk_size", 512)
        for name, a in tensors.items():
            w.add_tensor(name, a)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    write({"blk.0.attn_q.weight.in_sum2": q})
    assert_one_line_error(p, "mismatched sums and counts for 'blk.0.attn_q.weight'")
    write({"blk.0.attn_q.weight.in_sum2": q.astype(np.float16), "blk.0.attn_q.weight.counts": np.ones(1, np.float32)})
    assert_one_line_error(p, "'blk.0.attn_q.weight.in_sum2' is F16; imatrix tensors are F32")
    write({"blk.0.attn_q.weight.in_sum2": q, "blk.0.attn_q.weight.counts": np.ones(1, np.float32)}, keys=False)
    assert_one_line_error(p, "missing metadata key 'imatrix.datasets'")
    write_like_llama_cpp(p, {})
    assert_one_line_error(p, "no importance matrices")
    assert_one_line_error(tmp_path / "absent.gguf", "cannot read")


# -- fitting a model ---------------------------------------------------------------------------------


def test_check_rejects_what_does_not_fit_the_model(tiny_llama_path):
    im = sample()
    im.check(model_shapes())
    im.check([(n, s, T.F32) for n, s in model_shapes().items()])  # make_plan's (name, shape, type) tuples
    im.check({n: s for n, s in model_shapes().items() if n != "token_embd.weight"})
    for shapes, fragment in [
        ({**model_shapes(), "blk.0.attn_q.weight": (64, 64)}, "'blk.0.attn_q.weight' has 32 columns, but the model's "
                                                              "tensor [64, 64] has 64 columns"),
        ({**model_shapes(), "blk.0.ffn_gate_exps.weight": (32, 96, 8)}, "has 4 x 32, but the model's tensor "
                                                                       "[32, 96, 8] has 8 x 32"),
        ({n: s for n, s in model_shapes().items() if n != "blk.0.attn_q.weight"}, "'blk.0.attn_q.weight' is not a "
                                                                                  "tensor of the model"),
    ]:
        with pytest.raises(ImatrixError) as e:
            sample().check(shapes)
        assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
    with GGUFFile(tiny_llama_path) as gf, pytest.raises(ImatrixError, match="not a tensor of the model"):
        sample().check(gf)  # another model's imatrix: none of its matrices are this model's


# -- collection --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    p = tmp_path_factory.mktemp("imatrix") / "tiny-untied.gguf"
    write_tiny_llama(p, tied=False)
    return p


@pytest.fixture(scope="module")
def untied_llm(untied):
    return LLM(str(untied), progress=False)


def numpy_inputs(path, chunks) -> dict[str, list[np.ndarray]]:
    """The float inputs of every matmul of the tiny llama over the chunks, from a numpy forward pass of the
    file's dequantized weights (no edgeinfer code): rmsnorm, RoPE on (2i, 2i + 1) pairs, GQA, SwiGLU."""
    r = gguf.GGUFReader(path)
    f = {fl.name: fl for fl in r.fields.values()}
    val = lambda k: f[k].contents()  # noqa: E731
    ts = {t.name: t for t in r.tensors}

    def w(name):
        t = ts[name]
        a = gguf.quants.dequantize(t.data, t.tensor_type) if t.tensor_type != T.F32 else np.array(t.data)
        return np.asarray(a, np.float64).reshape([int(d) for d in reversed(t.shape)])

    n_layer, n_head = val("llama.block_count"), val("llama.attention.head_count")
    n_kv = val("llama.attention.head_count_kv")
    eps, base = val("llama.attention.layer_norm_rms_epsilon"), val("llama.rope.freq_base")
    norm = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g  # noqa: E731
    out: dict[str, list] = {}
    rec = lambda name, x: out.setdefault(name, []).append(x)  # noqa: E731
    emb = w("token_embd.weight")
    for ids in chunks:
        t = len(ids)
        x = emb[ids]
        hd = x.shape[1] // n_head
        inv = base ** (-np.arange(0, hd, 2) / hd)
        ang = np.arange(t)[:, None] * inv[None]
        cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]

        def rope(v):
            v = v.reshape(t, -1, hd).copy()
            a, b = v[..., 0::2].copy(), v[..., 1::2].copy()
            v[..., 0::2], v[..., 1::2] = a * cos - b * sin, a * sin + b * cos
            return v

        for i in range(n_layer):
            p = f"blk.{i}."
            h = norm(x, w(p + "attn_norm.weight"))
            for m in ("attn_q", "attn_k", "attn_v"):
                rec(p + m + ".weight", h)
            q, k = rope(h @ w(p + "attn_q.weight").T), rope(h @ w(p + "attn_k.weight").T)
            v = (h @ w(p + "attn_v.weight").T).reshape(t, n_kv, hd)
            o = np.empty((t, n_head, hd))
            for j in range(n_head):
                s = q[:, j] @ k[:, j // (n_head // n_kv)].T / np.sqrt(hd)
                s[np.triu_indices(t, 1)] = -np.inf
                pr = np.exp(s - s.max(1, keepdims=True))
                o[:, j] = (pr / pr.sum(1, keepdims=True)) @ v[:, j // (n_head // n_kv)]
            o = o.reshape(t, -1)
            rec(p + "attn_output.weight", o)
            x = x + o @ w(p + "attn_output.weight").T
            h = norm(x, w(p + "ffn_norm.weight"))
            rec(p + "ffn_gate.weight", h)
            rec(p + "ffn_up.weight", h)
            g = h @ w(p + "ffn_gate.weight").T
            g = g / (1 + np.exp(-g)) * (h @ w(p + "ffn_up.weight").T)
            rec(p + "ffn_down.weight", g)
            x = x + g @ w(p + "ffn_down.weight").T
        rec("output.weight", norm(x, w("output_norm.weight")))
    return out


@pytest.mark.parametrize("qtype", [T.F32, T.Q8_0])
def test_importance_is_the_mean_square_of_each_matmul_input(qtype, tmp_path):
    # F32 weights and KV: the engine computes in float32 as numpy does, so they agree closely. Q8_0: its
    # matmuls read int8-quantized activations, so later layers drift from numpy's float64 by quantization
    # noise, while what is recorded is each input before that quantization.
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, tied=False, qtype=qtype, embd_type=qtype)
    llm = LLM(str(path), progress=False, kv_type="f32" if qtype == T.F32 else "f16")
    pieces = calibration_chunks(llm, TEXT, CTX, 3)
    assert len(pieces) == 3 and all(len(c) == CTX for c in pieces)
    im = collect(llm, TEXT, n_ctx=CTX, chunks=3, process_output=True, dataset="t.txt")
    im.check(llm.gguf.tensors)
    ref = numpy_inputs(path, pieces)
    assert set(im.names) == set(ref)  # every layer matrix, and output.weight (process_output)
    for name, xs in ref.items():
        x = np.concatenate(xs)
        e, want, got = im.entries[name], (x * x).mean(0), im.importance(name)[0]
        assert e.counts.tolist() == [3 * CTX], name
        if qtype == T.F32:
            np.testing.assert_allclose(got, want, rtol=2e-4, err_msg=name)
            np.testing.assert_allclose(e.in_sum[0], x.sum(0), rtol=1e-3, atol=1e-3 * np.abs(x).sum(0).max())
        else:
            assert np.abs(got - want).sum() / want.sum() < 0.03 and np.max(np.abs(got - want) / want) < 0.1, name
    np.testing.assert_allclose(im.importance("blk.0.attn_q.weight")[0],
                               (np.concatenate(ref["blk.0.attn_q.weight"]) ** 2).mean(0), rtol=1e-4)  # exact inputs
    assert collect(llm, TEXT, n_ctx=CTX, chunks=3).names == sorted(set(ref) - {"output.weight"})


def test_collection_leaves_the_model_as_it_was(untied_llm):
    from edgeinfer.sampling import SamplingParams

    p = SamplingParams(temperature=0, max_tokens=8)
    before = untied_llm.generate("the hen", p)[0].token_ids
    kb = untied_llm.model.kb
    collect(untied_llm, TEXT, n_ctx=CTX, chunks=1)
    assert untied_llm.model.kb is kb and untied_llm.generate("the hen", p)[0].token_ids == before


def test_chunks_put_bos_first_when_the_model_adds_one(tiny_gemma3_path):
    llm = LLM(str(tiny_gemma3_path), progress=False)  # SentencePiece, BOS added
    ids = llm.tokenizer.encode(TEXT, add_bos=True)
    pieces = calibration_chunks(llm, TEXT, CTX)
    assert len(pieces) == len(ids) // CTX
    assert pieces[0] == ids[:CTX] and pieces[1] == [llm.tokenizer.bos_id] + ids[CTX + 1:2 * CTX]
    with pytest.raises(ValueError, match="fewer than one chunk"):
        calibration_chunks(llm, "the hen", CTX)
    with pytest.raises(ValueError, match=">= 16"):
        calibration_chunks(llm, TEXT, 8)


def test_moe_experts_count_only_their_tokens(zoo):
    for arch in ("olmoe", "qwen2moe"):
        llm = LLM(str(zoo(arch)), progress=False)
        im = collect(llm, TEXT, n_ctx=CTX, chunks=2)
        im.check(llm.gguf.tensors)
        cfg, n_tok = llm.config, 2 * CTX
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            gate, up, down, router = (im.entries[p + n] for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight",
                                                                   "ffn_down_exps.weight", "ffn_gate_inp.weight"))
            assert gate.sums.shape == (cfg.n_expert, cfg.dim) and down.sums.shape == (cfg.n_expert, cfg.expert_ffn_dim)
            assert gate.counts.sum() == cfg.n_expert_used * n_tok and router.counts.tolist() == [n_tok]
            assert np.array_equal(gate.counts, up.counts) and np.array_equal(gate.counts, down.counts)
            np.testing.assert_array_equal(gate.sums, up.sums)  # one input, two tensors
            # each token's input reaches k experts: the experts' sums add up to k times the router's
            np.testing.assert_allclose(gate.sums.sum(0), cfg.n_expert_used * router.sums[0], rtol=1e-5)
            if arch == "qwen2moe":  # the shared expert and its gate read every token, the router's input
                for n in ("ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_gate_inp_shexp.weight"):
                    np.testing.assert_allclose(im.entries[p + n].sums, router.sums, rtol=1e-6)
                assert im.entries[p + "ffn_down_shexp.weight"].counts.tolist() == [n_tok]


def test_fused_tensors_are_one_entry_counted_once(zoo):
    llm = LLM(str(zoo("phi3")), progress=False)
    im = collect(llm, TEXT, n_ctx=CTX, chunks=2)
    im.check(llm.gguf.tensors)
    assert {n.split(".", 2)[2] for n in im.names} == {"attn_qkv.weight", "attn_output.weight", "ffn_up.weight",
                                                      "ffn_down.weight"}
    assert all(e.counts.tolist() == [2 * CTX] for e in im.entries.values())


def golden_cases():
    with open(golden_path("imatrix_llamacpp.json")) as f:
        return json.load(f)["cases"]


@pytest.mark.parametrize("case", ["tiny_llama_q8_0_untied", "qwen2moe", "phi3"])
def test_matches_llama_cpp(case, zoo, tmp_path):
    # tests/golden/imatrix_llamacpp.json: llama.cpp's graph (llama-cpp-python, its cb_eval hook, the
    # collector of llama-imatrix; benchmarks/imatrix_llamacpp.py --golden) on these models and chunks
    gold = golden_cases()[case]
    if case.startswith("tiny_llama"):
        path = tmp_path / "tiny.gguf"
        write_tiny_llama(path, tied=False)
    else:
        path = zoo(case)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == gold["sha256"]  # the model llama.cpp ran
    llm = LLM(str(path), progress=False)
    assert llm.engine.max_context == gold["context"]  # (phi3's LongRoPE factors follow it)
    text = (Path(golden_path("botchan_a.txt"))).read_text(encoding="utf-8")
    n_ctx = gold["n_ctx"]
    assert calibration_chunks(llm, text, n_ctx, len(gold["chunks"])) == gold["chunks"]
    im = collect(llm, text, n_ctx=n_ctx, chunks=len(gold["chunks"]), process_output=gold["process_output"])
    assert sorted(im.names) == sorted(gold["tensors"])  # the same tensors as llama-imatrix collects
    for name, g in gold["tensors"].items():
        counts = im.entries[name].counts
        # a near-tie in the router may send a token to another expert
        assert np.abs(counts - g["counts"]).sum() <= 2 * max(1, counts.sum() // 100), name
        imp = im.importance(name)
        np.testing.assert_allclose(imp.sum(1), g["row_sums"], rtol=0.05, err_msg=name)
        head, want = imp[:, :len(g["head"][0])], np.array(g["head"])
        assert np.abs(head - want).sum() / np.abs(want).sum() < 0.05, name


# -- the command -------------------------------------------------------------------------------------


def test_cli_writes_both_formats_and_combines(untied, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text(TEXT)
    out = tmp_path / "im.gguf"
    r = run("imatrix", untied, text, "-o", out, "--ctx", CTX, "--chunks", 2)
    assert r.exit_code == 0, r.output
    im = Imatrix.load(out)
    assert len(im) == 14 and im.chunk_count == 2 and im.chunk_size == CTX and im.datasets == [str(text)]
    r = run("imatrix", untied, text, "-o", tmp_path / "im.dat", "--ctx", CTX, "--chunks", 1, "--process-output")
    assert r.exit_code == 0, r.output
    dat = Imatrix.load(tmp_path / "im.dat")
    assert dat.legacy and len(dat) == 15 and dat.chunk_count == 1
    r = run("imatrix", untied, "-o", tmp_path / "both.gguf", "--in-file", out, "--in-file", tmp_path / "im.dat",
            "--ctx", CTX)
    assert r.exit_code == 0, r.output
    both = Imatrix.load(tmp_path / "both.gguf")
    assert both.chunk_count == 3 and both.entries["blk.0.attn_q.weight"].counts.tolist() == [3 * CTX]
    assert both.entries["output.weight"].counts.tolist() == [CTX]
    r = run("imatrix", untied, text, "-o", tmp_path / "more.gguf", "--in-file", out, "--ctx", CTX, "--chunks", 1)
    assert r.exit_code == 0, r.output
    assert Imatrix.load(tmp_path / "more.gguf").datasets == [str(text), str(text)]


def test_cli_bad_inputs_are_one_line_errors(untied, tmp_path, monkeypatch):
    short = tmp_path / "short.txt"
    short.write_text("the hen")
    text = tmp_path / "calib.txt"
    text.write_text(TEXT)
    out = tmp_path / "im.gguf"
    for args, code, fragment in [
        ((untied, tmp_path / "missing.txt", "-o", out), 2, "does not exist"),
        ((untied, short, "-o", out, "--ctx", CTX), 1, "fewer than one chunk"),
        ((untied, text, "-o", out, "--ctx", 8), 1, ">= 16"),
        ((untied, text), 2, "Missing option '-o'"),
        ((untied, "-o", out), 2, "give a TEXT file"),
        ((untied, text, "-o", out, "--in-file", short), 1, "not an imatrix"),
        ((untied, text, "-o", tmp_path / "no" / "dir" / "im.gguf", "--ctx", CTX), 1, "cannot write"),
        ((untied, text, "-o", out, "--output-format", "txt"), 2, "Invalid value for '--output-format'"),
    ]:
        r = run("imatrix", *args)
        assert r.exit_code == code and fragment in r.output and "Traceback" not in r.output, (args, r.output)
    monkeypatch.setenv("EDGEINFER_HOME", str(tmp_path / "home"))
    r = run("imatrix", "no-such-model", text, "-o", out)
    assert r.exit_code == 1 and r.output.startswith("error: ") and "Traceback" not in r.output, r.output
    assert not out.exists()


@pytest.mark.model
def test_real_model_one_chunk(tmp_path):
    from conftest import real_model_path

    path = real_model_path("smollm2-135m-instruct")
    llm = LLM(str(path), progress=False)
    text = (Path(edgeinfer.__file__).parent / "data" / "botchan.txt").read_text(encoding="utf-8")
    im = collect(llm, text[:20000], n_ctx=128, chunks=1)
    im.check(llm.gguf.tensors)
    assert len(im) == 7 * llm.config.n_layer
    p = tmp_path / "smollm2.imatrix.gguf"
    im.save(p)
    back = Imatrix.load(p)
    back.check(GGUFFile(path))
    assert all(np.all(np.isfinite(back.importance(n))) and back.importance(n).min() >= 0 for n in back.names)
