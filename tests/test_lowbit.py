"""The types below 4.5 bits (Q2_K, Q3_K, IQ4_NL, IQ4_XS): quantizers against llama.cpp's own blocks, with and
without an importance matrix, and loading them for the kernels (Q2_K, Q3_K and IQ4_NL in kinds of their own,
IQ4_XS on IQ4_NL's: quant/repack.py's WIDENED) against gguf's dequantize."""

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from edgeinfer.kernels import get_backend, kinds
from edgeinfer.quant import kquants, lowbit
from edgeinfer.quant.repack import WIDENED, loaded_bytes, repack
from edgeinfer.quant.tool import LEGACY_WEIGHTED, WEIGHTED, quantize_rows

GOLDEN = Path(__file__).parent / "golden" / "lowbit_blocks.npz"  # benchmarks/make_lowbit_golden.py
PLAIN_TYPES = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS")
WIDE_TYPES = ("IQ4_XS",)  # loaded as a wider kind (the others have their own: tests/test_kernels.py too)
OWN_TYPES = ("Q2_K", "Q3_K", "IQ4_NL")
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")  # the older K-quants' reference quantizers, held to llama.cpp's blocks too
IMATRIX_TYPES = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
kb = get_backend("cpu")


def sample():
    """The reference input: (48, 1024) float32 with a few heavy columns (as activation outliers make
    weights' columns matter unequally), a zero row, a constant row, a row zero but for its first 32 values, a
    sparse row, a heavy-tailed (Cauchy) row, a row whose every block starts with -0.0; and an importance row
    spanning four orders of magnitude."""
    rng = np.random.default_rng(37)
    x = (rng.standard_normal((48, 1024)) * 0.02).astype(np.float32)
    x[:, ::97] *= 6
    x[3] = 0
    x[7] = 0.0125
    x[11] = 0
    x[11, :32] = rng.standard_normal(32).astype(np.float32) * 0.05
    x[13] *= rng.random(1024) < 0.1
    x[17] = (rng.standard_cauchy(1024) * 0.01).astype(np.float32)
    x[19, ::32] = -0.0
    imp = (10.0 ** rng.uniform(-3, 1, 1024)).astype(np.float32)
    return x, imp


SPECIAL_ROWS = [3, 7, 11, 13, 17, 19]


def sparse_importance():
    """An importance row that is zero in 90% of the columns (columns no calibration token reached)."""
    rng = np.random.default_rng(41)
    return ((rng.random(1024) < 0.1) * rng.uniform(0.5, 2, 1024)).astype(np.float32)


def _quantize(name, x, w=None):
    return quantize_rows(x, T[name], w)


@pytest.mark.parametrize("name", PLAIN_TYPES + K_TYPES)
def test_quantizer_equals_llama_cpp_reference_block_for_block(name):
    x, _ = sample()
    want = np.load(GOLDEN)[f"{name}_plain"]
    got = _quantize(name, x)
    assert got.shape == want.shape
    block = GGML_QUANT_SIZES[T[name]][1]
    same = (got.reshape(-1, block) == want.reshape(-1, block)).all(axis=1)
    assert same.all(), f"{(~same).sum()} of {same.size} blocks differ from llama.cpp's"


@pytest.mark.parametrize("sparse", [False, True], ids=["imatrix", "sparse_imatrix"])
@pytest.mark.parametrize("name", IMATRIX_TYPES)
def test_imatrix_quantizer_equals_llama_cpp_block_for_block(name, sparse):
    x, imp = sample()
    if sparse:
        imp = sparse_importance()
    want = np.load(GOLDEN)[f"{name}_{'sparse_' if sparse else ''}imatrix"]
    got = _quantize(name, x, imp)
    block = GGML_QUANT_SIZES[T[name]][1]
    same = (got.reshape(-1, block) == want.reshape(-1, block)).all(axis=1)
    assert same.all(), f"{(~same).sum()} of {same.size} blocks differ from llama.cpp's"


@pytest.mark.parametrize("name", IMATRIX_TYPES)
def test_the_imatrix_lowers_the_error_it_weights(name):
    x, imp = sample()
    t = T[name]
    plain = np.delete(np.arange(48), SPECIAL_ROWS)  # the Gaussian rows: outlier rows can go either way
    err = {}
    for with_imx in (False, True):
        y = gguf.quants.dequantize(_quantize(name, x, imp if with_imx else None), t).reshape(x.shape)
        err[with_imx] = float((imp * (y - x)[plain] ** 2).sum())
    assert err[True] < err[False]


# relative RMS error on the sample (its heavy columns included), with a margin over what each type reaches
ERROR_BOUND = {"Q2_K": 0.38, "Q3_K": 0.24, "IQ4_NL": 0.12, "IQ4_XS": 0.12}


@pytest.mark.parametrize("name", PLAIN_TYPES)
def test_round_trip_error_and_the_special_rows(name):
    x, imp = sample()
    for w in (None, imp):
        y = gguf.quants.dequantize(_quantize(name, x, w), T[name]).reshape(x.shape)
        assert np.isfinite(y).all()
        assert np.all(y[3] == 0)  # an all-zero row stays zero
        assert np.all(y[11, 32:] == 0)
        assert np.all(np.abs(y[19].reshape(-1, 32)[:, 0]) <= np.abs(y[19]).max() * 0.2)
        assert np.abs(y[7] - x[7]).max() <= 0.3 * 0.0125  # a constant row, within its own grid
        g = np.delete(x, [3, 7, 11, 13, 17], axis=0)
        gy = np.delete(y, [3, 7, 11, 13, 17], axis=0)
        assert np.sqrt(((gy - g) ** 2).mean() / (g ** 2).mean()) < ERROR_BOUND[name]


def test_a_row_length_the_type_cannot_take_or_a_wrong_importance_is_an_error():
    x, imp = sample()
    with pytest.raises(ValueError, match="columns"):
        lowbit.quantize_q3_k(x, imp[:512])
    with pytest.raises(ValueError, match="columns"):
        kquants.quantize_q4_k(x, imp[:256])
    for name in ("Q2_K", "Q3_K", "IQ4_XS", "Q4_K", "Q5_K", "Q6_K"):  # 320: whole 32-blocks, not 256-blocks
        with pytest.raises(ValueError, match="320"):
            quantize_rows(x[:4, :320], T[name])
    with pytest.raises(ValueError, match="48"):
        quantize_rows(x[:4, :48], T.IQ4_NL)
    with pytest.raises(ValueError, match="320"):
        lowbit.quantize_iq4_xs(x[:4, :320])


def test_every_quantizer_with_an_importance_is_in_the_tool():
    assert {t.name for t in (*WEIGHTED, *LEGACY_WEIGHTED)} == set(IMATRIX_TYPES)


# -- loading: their own kinds, and the widened one ----------------------------------------------------


def _values(w):
    """A row-major widened QTensor's weights as float32, by its host kind's definition (IQ4_NL's)."""
    n, k = w.shape
    assert w.kind == kinds.IQ4_NL  # Q4_0's nibbles (low: elements 0-15 of a 32-block), each a grid index
    q = w.qs.reshape(n, -1, 16)
    v = np.array(gguf.quants.IQ4_NL.kvalues, np.float32)[np.concatenate([q & 15, q >> 4], axis=2)]
    return (v * w.d.view(np.float16).astype(np.float32)[:, :, None]).reshape(n, k)


@pytest.mark.parametrize("name", OWN_TYPES)
def test_low_bit_types_load_in_their_own_packing_at_the_files_size(name):
    """Q2_K, Q3_K and IQ4_NL from quantize-model's quantizers: their own kinds, gguf's values exactly, row-major
    and interleaved, and in memory the file's bytes (Q3_K: its scales a byte each, 114 bytes per 110)."""
    from edgeinfer.kernels.cpu.layout import interleave8

    x, imp = sample()
    t = T[name]
    raw = _quantize(name, x, imp)
    ref = gguf.quants.dequantize(raw, t).reshape(x.shape)
    w = repack(raw, t, (x.shape[1], x.shape[0]))
    assert w.kind == kinds.OF_GGML[t] and t not in WIDENED
    np.testing.assert_array_equal(kb.dequantize(w), ref)
    np.testing.assert_array_equal(kb.dequantize(interleave8(w)), ref)
    assert w.nbytes == loaded_bytes(t, x.size, raw.nbytes) <= raw.nbytes * 1.037
    assert interleave8(w).nbytes == w.nbytes  # 48 rows: whole groups of eight, no padding


@pytest.mark.parametrize("name", WIDE_TYPES)
def test_widened_weights_equal_gguf_dequantize(name):
    x, imp = sample()
    t = T[name]
    raw = _quantize(name, x, imp)
    ref = gguf.quants.dequantize(raw, t).reshape(x.shape)
    w = repack(raw, t, (x.shape[1], x.shape[0]))
    assert w.kind == WIDENED[t] and w.ggml_type == t
    got = _values(w)
    assert t == T.IQ4_XS  # each 32-block's scale d * (ls - 32) rounded to float16
    blk = np.abs(ref.reshape(48, -1, 32)).max(axis=2, keepdims=True)
    assert np.all(np.abs(got - ref).reshape(48, -1, 32) <= blk * 2.0 ** -11)
    assert w.nbytes == loaded_bytes(t, x.size, raw.nbytes)
    assert np.array_equal(kb.dequantize(w), got)  # the kernels' decode: the same values


@pytest.mark.parametrize("name", PLAIN_TYPES)
def test_matmul_of_a_low_bit_type_matches_its_dequantized_weights(name):
    """The kernels of the host kind on this CPU's path (interleaved on the SIMD paths), one token and a batch:
    within the activation's 8-bit rounding of the float product, and a batch equal to its tokens alone."""
    x, imp = sample()
    t = T[name]
    raw = _quantize(name, x, imp)
    ref = gguf.quants.dequantize(raw, t).reshape(x.shape).astype(np.float64)
    w = kb.upload(repack(raw, t, (x.shape[1], x.shape[0])))
    rng = np.random.default_rng(5)
    a = rng.standard_normal((9, x.shape[1])).astype(np.float32)
    got = kb.matmul(w, a)
    want = a.astype(np.float64) @ ref.T
    block = 256 if t in (T.Q2_K, T.Q3_K) else 32
    d = np.abs(a.reshape(9, -1, block)).max(axis=2) / 127
    bound = (1.001 * (np.repeat(d, block, axis=1) / 2) @ np.abs(ref).T + 4 * 1024 * 1.2e-7 * np.abs(a) @ np.abs(ref).T
             + 1e-6)
    if t == T.IQ4_XS:  # and the widening's own rounding per element (the test above)
        blk = np.repeat(np.abs(ref.reshape(48, -1, 32)).max(axis=2), 32, axis=1)
        bound = bound + np.abs(a) @ (blk * 2.0 ** -11).T
    assert np.all(np.abs(got - want) <= bound)
    one = kb.matmul(w, a[4:5])
    np.testing.assert_array_equal(one[0], got[4])


# -- quantize-model with the new types and an importance matrix ---------------------------------------


def _tiny_f32(path, n_layer=2):
    from tiny_models import write_tiny_llama

    # rows of 256 columns, so the K-quant mixes apply as they would to a real model (no fallbacks but the
    # 64-wide attention rows)
    write_tiny_llama(path, qtype=T.F32, embd_type=T.F32, dim=256, ffn=512, n_head=4, n_kv=1, n_layer=n_layer)


def test_quantize_model_with_an_imatrix_weights_every_tensor_it_covers(tmp_path):
    from click.testing import CliRunner

    from edgeinfer.cli.main import main
    from edgeinfer.gguf_file import GGUFFile
    from edgeinfer.quant.imatrix import Imatrix

    src = tmp_path / "f32.gguf"
    _tiny_f32(src)
    rng = np.random.default_rng(3)
    im = Imatrix(datasets=["calib.txt"], chunk_size=64, chunk_count=2)
    with GGUFFile(src) as gf:
        covered = [n for n, t in gf.tensors.items() if n.startswith("blk.") and len(t.shape) == 2]
        for n in covered:
            im.accumulate(n, rng.standard_normal((64, gf.tensors[n].shape[0])) * rng.uniform(0.1, 4, gf.tensors[n].shape[0]))
    imx = tmp_path / "imatrix.gguf"
    im.save(imx)
    out = {}
    for tag, extra in (("plain", []), ("imatrix", ["--imatrix", imx])):
        out[tag] = tmp_path / f"q3_k_m-{tag}.gguf"
        r = CliRunner().invoke(main, ["quantize-model", str(src), str(out[tag]), "--type", "Q3_K_M", *map(str, extra)])
        assert r.exit_code == 0, r.output
    im = Imatrix.load(imx)
    with GGUFFile(src) as gf, GGUFFile(out["plain"]) as a, GGUFFile(out["imatrix"]) as b:
        assert b.get("quantize.imatrix.entries_count") == len(covered)
        assert b.get("quantize.imatrix.dataset") == "calib.txt"
        assert a.get("quantize.imatrix.file") is None
        for n in covered:
            t = b.tensors[n]
            assert t.ggml_type == a.tensors[n].ggml_type
            x = np.asarray(gf.tensor(n), np.float32).reshape(-1, t.shape[0])
            if t.ggml_type in WEIGHTED or t.ggml_type in LEGACY_WEIGHTED:  # the bytes of the weighted quantizer with this tensor's importance
                want = quantize_rows(x, t.ggml_type, im.importance(n)[0])
                np.testing.assert_array_equal(np.asarray(b.tensor_bytes(n)).reshape(want.shape), want)
                assert not np.array_equal(b.tensor_bytes(n), a.tensor_bytes(n))
    from edgeinfer import LLM, SamplingParams

    llm = LLM(str(out["imatrix"]), progress=False)
    assert len(llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4))[0].token_ids) == 4


def test_an_imatrix_that_does_not_fit_the_model_is_a_one_line_error(tmp_path):
    from click.testing import CliRunner

    from edgeinfer.cli.main import main
    from edgeinfer.quant.imatrix import Imatrix

    src = tmp_path / "f32.gguf"
    _tiny_f32(src)
    im = Imatrix(datasets=["x"], chunk_size=64, chunk_count=1)
    im.accumulate("blk.0.attn_q.weight", np.ones((8, 128), np.float32))  # the model's rows have 256 columns
    bad = tmp_path / "bad.gguf"
    im.save(bad)
    r = CliRunner().invoke(main, ["quantize-model", str(src), str(tmp_path / "o.gguf"), "--type", "IQ4_XS",
                                  "--imatrix", str(bad)])
    assert r.exit_code != 0
    assert "blk.0.attn_q.weight" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "o.gguf").exists()
    (tmp_path / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    r = CliRunner().invoke(main, ["quantize-model", str(src), str(tmp_path / "o.gguf"), "--type", "Q2_K",
                                  "--imatrix", str(tmp_path / "junk.gguf")])
    assert r.exit_code != 0 and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_dry_run_with_an_imatrix_plans_as_the_real_run(tmp_path):
    from click.testing import CliRunner

    from edgeinfer.cli.main import main
    from edgeinfer.quant.imatrix import Imatrix

    src = tmp_path / "f32.gguf"
    _tiny_f32(src, n_layer=8)  # n / 8 = 1: layer 0's ffn_down is the bumped one
    im = Imatrix(datasets=["x"], chunk_size=64, chunk_count=1)
    im.accumulate("blk.0.ffn_down.weight", np.ones((8, 512), np.float32))
    imx = tmp_path / "m.imatrix.gguf"
    im.save(imx)
    runner = CliRunner()
    plain = runner.invoke(main, ["quantize-model", str(src), str(tmp_path / "o.gguf"), "--type", "IQ4_XS", "--dry-run"])
    weighted = runner.invoke(main, ["quantize-model", str(src), str(tmp_path / "o.gguf"), "--type", "IQ4_XS",
                                    "--dry-run", "--imatrix", str(imx)])
    assert plain.exit_code == 0 and weighted.exit_code == 0, plain.output + weighted.output
    down = lambda out: [l for l in out.splitlines() if l.startswith("blk.0.ffn_down.weight")][0]  # noqa: E731
    assert "Q5_K" in down(plain.output)  # llama.cpp's first-layers bump, without an imatrix only
    assert "IQ4_XS" in down(weighted.output) and "Q5_K" not in down(weighted.output)
    assert not (tmp_path / "o.gguf").exists()


def test_each_expert_is_quantized_with_its_own_importance(tmp_path):
    from edgeinfer.gguf_file import GGUFFile
    from edgeinfer.quant.imatrix import Imatrix
    from edgeinfer.quant.tool import PlannedTensor, convert

    experts = np.random.default_rng(8).standard_normal((3, 16, 256)).astype(np.float32) * 0.02
    import gguf as g

    path = tmp_path / "experts.gguf"
    w = g.GGUFWriter(path, "qwen3moe")
    w.add_tensor("blk.0.ffn_up_exps.weight", experts)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    imp = np.stack([np.where(np.arange(256) % 3 == e, 5.0, 0.01) for e in range(3)]).astype(np.float32)
    im = Imatrix(datasets=["x"], chunk_size=8, chunk_count=1)
    for e in range(3):
        im.accumulate("blk.0.ffn_up_exps.weight", np.sqrt(imp[e])[None].repeat(4, 0), e, 3)
    with GGUFFile(path) as gf:
        im.check(gf)
        x = PlannedTensor("blk.0.ffn_up_exps.weight", (256, 16, 3), T.F32, T.Q3_K)
        got = convert(gf, x, threads=1, importance=im.importance(x.name))
    for e in range(3):
        np.testing.assert_array_equal(got[e], quantize_rows(experts[e], T.Q3_K, im.importance(x.name)[e]))
    assert not np.array_equal(got[1], quantize_rows(experts[1], T.Q3_K, im.importance(x.name)[0]))


@pytest.mark.parametrize("mix", ["Q2_K", "Q3_K_M"])
def test_a_low_bit_model_runs_the_values_of_its_weights(tmp_path, mix):
    """A model quantized to the Q2_K or Q3_K_M mix (Q2_K, Q3_K and Q4_K matrices, on their packed kernels)
    against the same weights dequantized to F32 (the float kernels): the same greedy tokens up to the reference's
    first near-tie, each the likeliest token's log-probability within the activations' 8-bit rounding. (A random model's
    unlikely tokens move by up to a unit of log-probability under that rounding, for Q8_0 as well; a wrong bit
    in a layout or kernel moves the likely ones.)"""
    from click.testing import CliRunner

    from edgeinfer import LLM, SamplingParams
    from edgeinfer.cli.main import main
    from edgeinfer.gguf_file import GGUFFile

    src, q, f = tmp_path / "f32.gguf", tmp_path / "q.gguf", tmp_path / "dequantized.gguf"
    _tiny_f32(src)
    for a, b, t in ((src, q, mix), (q, f, "F32")):
        r = CliRunner().invoke(main, ["quantize-model", str(a), str(b), "--type", t])
        assert r.exit_code == 0, r.output
    with GGUFFile(q) as gf:
        types = {t.ggml_type for t in gf.tensors.values()}
    assert {T.Q3_K, T.Q4_K} <= types and (T.Q2_K in types) == (mix == "Q2_K")
    prompts = [[5, 6, 7, 8, 9], [40, 41, 200, 12]]
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=3)
    got = LLM(str(q), progress=False).generate(prompts, params)
    want = LLM(str(f), progress=False).generate(prompts, params)
    compared = 0
    for g, w in zip(got, want):
        for step, (a, b) in enumerate(zip(g.logprobs, w.logprobs)):
            if b["top"][0][1] - b["top"][1][1] < 1.0:  # a near-tie in the reference: the rest may part
                break
            assert g.token_ids[step] == w.token_ids[step] and a["top"][0][0] == b["top"][0][0], step
            # Q8_K's 256-element activation blocks round a random model's outliers coarsely: up to 0.1 here
            assert abs(a["top"][0][1] - b["top"][0][1]) <= 0.25, (step, a, b)
            compared += 1
    assert compared >= 12  # of 24 steps: the check is not vacuous
