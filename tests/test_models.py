"""Architectures on tiny random models: cached decoding equals one full forward pass."""

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels import get_backend
from edgeinfer.models import load_model
from edgeinfer.engine.kv_cache import KVCache
from edgeinfer.engine.model_runner import Batch
from edgeinfer.models.common import ModelLoadError
from tiny_models import write_tiny_gemma3, write_tiny_llama, write_tiny_qwen2

kb = get_backend("cpu")


def _cache(m, n_blocks=32, bs=4):
    c = m.cfg
    return KVCache(c.n_layer, n_blocks, bs, c.n_kv_head, c.head_dim, c.v_head_dim, kb=kb)


def _full(m, ids, bs=4):
    t = len(ids)
    pos = np.arange(t)
    table = np.arange(32)[None]
    return m.forward(Batch(ids, pos, np.zeros(t), pos, table, np.arange(t)), _cache(m, bs=bs))


def _incremental(m, ids, chunks, bs=4):
    cache = _cache(m, bs=bs)
    table = np.arange(32)[None]
    out, start = [], 0
    for n in chunks:
        pos = np.arange(start, start + n)
        out.append(m.forward(Batch(ids[start:start + n], pos, np.zeros(n), pos, table, np.arange(n)), cache))
        start += n
    return np.concatenate(out)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("writer", [write_tiny_llama, write_tiny_gemma3, write_tiny_qwen2],
                         ids=["llama", "gemma3", "qwen2"])
def test_chunked_prefill_equals_one_pass_bit_for_bit(tmp_path, writer, qtype):
    """A prompt prefilled in one pass, one token at a time, or in chunks of any size gives every token the
    same logits: the matmul tiles, the attention tiles (16 queries x 16 keys) and the row ops (serial
    below 16 rows, parallel above) compute each token's result by the same arithmetic, for every
    weight type (K-quants need 256-wide rows)."""
    p = tmp_path / "m.gguf"
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        extra = {"head_dim": 128} if writer is write_tiny_gemma3 else {}
        writer(p, qtype=qtype, dim=256, ffn=512, **extra)
    else:
        writer(p, qtype=qtype)
    m = load_model(GGUFFile(p), kb)
    ids = np.random.default_rng(0).integers(0, m.cfg.vocab_size, 40)
    full = _full(m, ids)
    one_by_one = _incremental(m, ids, [1] * 40)
    chunked = _incremental(m, ids, [7, 1, 17, 9, 6])
    np.testing.assert_array_equal(one_by_one, full)
    np.testing.assert_array_equal(chunked, full)


def test_gemma3_sliding_window_limits_attention(tmp_path):
    # window 8: with 7 layers, layers 0-4 and 6 are local. Changing token 0 must still change the last
    # logits (through the global layer 5), but a model with only local layers must not see it.
    p = tmp_path / "g.gguf"
    write_tiny_gemma3(p, n_layer=3, window=4)  # 3 layers: all local (every 6th is global)
    m = load_model(GGUFFile(p), kb)
    assert [m.cfg.is_sliding(i) for i in range(3)] == [True, True, True]
    ids = np.arange(10, 30)
    a = _full(m, ids)[-1]
    ids2 = ids.copy()
    ids2[0] = 99
    b = _full(m, ids2)[-1]
    # receptive field: 3 layers x window 4 reaches back at most 9 positions from position 19
    np.testing.assert_array_equal(a, b)
    c = _full(m, np.concatenate([ids[:12], [99], ids[13:]]))[-1]
    assert not np.array_equal(a, c)


def test_gemma3_every_sixth_layer_is_global(tiny_gemma3_path):
    m = load_model(GGUFFile(tiny_gemma3_path), kb)
    assert [m.cfg.is_sliding(i) for i in range(7)] == [True] * 5 + [False, True]
    assert m.cfg.rope_base_local == 10000.0 and m.cfg.rope_base == 1e6
    assert m.cfg.embed_scale == pytest.approx(8.0)  # sqrt(64)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0])
def test_llama_runs_with_each_weight_type(tmp_path, qtype):
    p = tmp_path / "m.gguf"
    write_tiny_llama(p, qtype=qtype, tied=False)
    m = load_model(GGUFFile(p), kb)
    logits = _full(m, np.arange(5, 12))
    assert logits.shape == (7, m.cfg.vocab_size) and np.isfinite(logits).all()


def test_unknown_architecture_names_the_supported_ones(tmp_path):
    import gguf

    p = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(p), "mamba")
    w.add_tensor("t", np.zeros(32, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ModelLoadError, match="unsupported architecture 'mamba' \\(supported: falcon-h1, gemma2, gemma3, gemma3n, gemma4, gpt-oss, granite, granitehybrid, granitemoe, lfm2, "
                       "lfm2moe, llama, mamba2, mistral3, nemotron_h, nomic-bert, olmo2, olmoe, phi3, qwen2, qwen2moe, qwen3, qwen35, "
                       "qwen35moe, qwen3moe, qwen3next, smollm3\\)"):
        load_model(GGUFFile(p), kb)


def test_missing_tensor_is_a_clear_error(tmp_path):
    import gguf

    p = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    for k, v in dict(block_count=1, embedding_length=32, feed_forward_length=64, head_count=2).items():
        getattr(w, f"add_{k}")(v)
    w.add_tensor("token_embd.weight", np.zeros((10, 32), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ModelLoadError, match="missing tensor 'blk.0.attn_norm.weight'"):
        load_model(GGUFFile(p), kb)


@pytest.mark.parametrize("writer,qtype", [(write_tiny_llama, T.Q4_1), (write_tiny_llama, T.Q8_0),
                                          (write_tiny_llama, T.Q5_0), (write_tiny_gemma3, T.Q8_0),
                                          (write_tiny_gemma3, T.Q4_0), (write_tiny_qwen2, T.Q5_0),
                                          (write_tiny_qwen2, T.Q8_0)], ids=lambda v: getattr(v, "name", None)
                         or getattr(v, "__name__", str(v)))
def test_compiled_step_equals_per_op_forward_bit_for_bit(tmp_path, writer, qtype):
    """The compiled whole-model step runs the same kernels in the same order as the per-op reference."""
    p = tmp_path / "m.gguf"
    writer(p, qtype=qtype)
    m = load_model(GGUFFile(p), kb)
    assert m.stack is not None
    ids = np.arange(3, 12)
    for kv in ("f32", "f16", "q8_0", "q5_1/q4_0") if m.cfg.head_dim % 32 == 0 else ("f32", "f16"):
        def run(use_stack):
            c = m.cfg
            cache = KVCache(c.n_layer, 32, 4, c.n_kv_head, c.head_dim, c.v_head_dim, dtype=kv, kb=kb)
            table = np.arange(32)[None]
            stack, m.stack = m.stack, (m.stack if use_stack else None)
            try:
                out = [m.forward(Batch(ids[:6], np.arange(6), np.zeros(6), np.arange(6), table, np.arange(6)), cache)]
                for i in range(6, 9):  # then one token at a time, through the cache
                    out.append(m.forward(Batch(ids[i:i + 1], [i], [0], [i], table, [0]), cache))
            finally:
                m.stack = stack
            return np.concatenate(out)
        np.testing.assert_array_equal(run(True), run(False))


def test_float_matrices_take_the_per_op_path(tmp_path):
    p = tmp_path / "m.gguf"
    write_tiny_llama(p, qtype=T.F16)
    assert load_model(GGUFFile(p), kb).stack is None  # and test_llama_runs_with_each_weight_type runs it


def test_qwen2_biases_and_neox_rope_change_the_result(tmp_path):
    """The qwen2 module reads its q/k/v biases and rotates NeoX-style: the same weights read as a llama
    model (no biases, interleaved RoPE) give other logits, and zeroing the biases moves the qwen2 ones."""
    p = tmp_path / "q.gguf"
    write_tiny_qwen2(p)
    m = load_model(GGUFFile(p), kb)
    assert m.cfg.arch == "qwen2" and m.cfg.rope_neox and m.layers[0].bk is not None
    ids = np.arange(3, 12)
    with_bias = _full(m, ids)
    for lw in m.layers:
        for name in ("bq", "bk", "bv"):
            getattr(lw, name)[:] = 0
    m.stack = None  # the per-op path reads the (now zero) biases directly
    assert np.abs(_full(m, ids) - with_bias).max() > 0.1


def test_a_model_with_per_layer_head_counts_is_a_clear_error(tmp_path):
    p = tmp_path / "m.gguf"
    write_tiny_llama(p, n_kv=[2, 2])  # one KV head count per layer, as Gemma 4's files have: valid GGUF
    assert list(GGUFFile(p).metadata["llama.attention.head_count_kv"]) == [2, 2]
    with pytest.raises(ModelLoadError, match="one value per layer"):
        load_model(GGUFFile(p), kb)
