"""The edge footprint: KV types (q8_0 against f16), the KV pool's default size, memory budgets, the memory
estimate, and what a plain generate leaves unimported."""

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T
from gguf import quants

from edgeinfer import LLM, SamplingParams
from edgeinfer.config import KV_TYPES, EngineConfig
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.kernels import get_backend
from edgeinfer.kernels.cpu import attention, kv_rotation, ops
from edgeinfer.memory import MemoryBudgetError
from edgeinfer.models import load_model
from edgeinfer.engine.kv_cache import KVCache
from edgeinfer.engine.model_runner import Batch
from tiny_models import write_tiny_gemma3

kb = get_backend("cpu")


def q8_rows_as_gguf(cache: np.ndarray, d: int) -> np.ndarray:
    """A q8_0 KV cache's rows (.., d + d/16) as GGUF Q8_0 blocks (scale first, then the 32 quants)."""
    rows = cache.reshape(-1, cache.shape[-1])
    qs = rows[:, :d].reshape(-1, d // 32, 32).view(np.uint8)
    sc = rows[:, d:].reshape(-1, d // 32, 2).view(np.uint8)
    return np.concatenate([sc, qs], axis=2).reshape(-1)


def test_q8_0_kv_rows_are_ggml_q8_0_blocks_and_attention_reads_them_exactly():
    rng = np.random.default_rng(4)
    n, kvh, d, h = 48, 2, 64, 4
    k = (rng.standard_normal((n, kvh, d)) * rng.uniform(0.1, 4, (n, kvh, 1))).astype(np.float32)
    v = rng.standard_normal((n, kvh, d)).astype(np.float32)
    k[3, 1, :32] = 0  # an all-zero block: scale 0, quants 0
    kc = np.zeros((n, kvh, d + d // 16), np.int8)
    vc = np.zeros_like(kc)
    ops.write_kv(k, v, np.arange(n), kc, vc)
    # the quantization is llama.cpp's reference one, byte for byte (gguf's numpy quantizer), of the rows rotated
    # as llama.cpp rotates them (kv_rotation: heads of 64, one chunk each for K and V)
    kr, vr = kv_rotation.rotated(k, 64), kv_rotation.rotated(v, 64)
    np.testing.assert_array_equal(q8_rows_as_gguf(kc, d), quants.quantize(kr.reshape(-1, d), T.Q8_0).reshape(-1))
    np.testing.assert_array_equal(q8_rows_as_gguf(vc, d), quants.quantize(vr.reshape(-1, d), T.Q8_0).reshape(-1))
    kd = quants.dequantize(q8_rows_as_gguf(kc, d), T.Q8_0).reshape(n, kvh, d).astype(np.float32)
    vd = quants.dequantize(q8_rows_as_gguf(vc, d), T.Q8_0).reshape(n, kvh, d).astype(np.float32)
    # attention over the q8_0 cache: the same bits as over a float32 cache of the dequantized values with the
    # queries rotated as the keys, as q8_0 values (llama.cpp's flash attention quantizes them for its q8_0 dot
    # products), the output rotated back
    t = 20
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    args = (np.zeros(t, np.int64), np.arange(n - t, n), np.arange(n // 16, dtype=np.int32)[None], 16,
            np.float32(0.125), 0, np.float32(0.0), np.zeros(0, np.float32))
    got, want = np.zeros((t, h, d), np.float32), np.zeros((t, h, d), np.float32)
    attention.paged_attention(q, kc, vc, *args, got, 2)
    qv = attention.q8_values(kv_rotation.rotated(q, 64))
    attention.paged_attention(qv, kd, vd, *args, want, 2)
    np.testing.assert_array_equal(got, kv_rotation.rotated(want, 64))
    qv = attention.q8_values(q)
    # those values are gguf's q8_0 blocks of the queries, but rounded half to even (x * 127 / amax), as ggml's
    # quantize_row_q8_0 for the CPU rounds them, not its reference's halves away from zero
    ref = quants.dequantize(quants.quantize(q.reshape(-1, d), T.Q8_0), T.Q8_0).reshape(q.shape)
    assert np.abs(qv - ref).max() <= np.abs(ref).max() / 127 and (qv == ref).mean() > 0.99


def test_q8_0_kv_cache_is_about_half_of_f16():
    from edgeinfer.config import ModelConfig

    Cfg = ModelConfig(arch="llama", n_layer=30, dim=576, n_head=9, n_kv_head=3, head_dim=64, v_head_dim=64,
                      ffn_dim=1536, vocab_size=100, context_length=512, norm_eps=1e-5, rope_base=1e4, rope_dim=64,
                      rope_neox=False)

    f16, q8 = kb.KV_FORMATS["f16"].bytes_per_token(Cfg), kb.KV_FORMATS["q8_0"].bytes_per_token(Cfg)
    assert q8 / f16 == pytest.approx(34 / 64)  # llama.cpp's q8_0: 34 bytes per 32 values, against 64
    assert kb.KV_FORMATS["f32"].bytes_per_token(Cfg) == 2 * f16


def forward_logits(m, kv: str, ids):
    c = m.cfg
    n = len(ids)
    cache = KVCache(c.n_layer, -(-n // 4), 4, c.n_kv_head, c.head_dim, c.v_head_dim, dtype=kv, kb=kb)
    return m.forward(Batch(ids, np.arange(n), np.zeros(n), np.arange(n), np.arange(-(-n // 4))[None],
                           np.arange(n)), cache)


@pytest.mark.parametrize("seed", [0, 1])
def test_q8_0_kv_against_f16_kv_on_a_tiny_model(tmp_path, seed):
    """Logits at every position of a 40-token prompt with a q8_0 cache against an f16 one. The bound:
    f16 KV is itself 0.06-0.07 standard deviations of the logits away from f32 KV on these random models
    (int8 activations amplify any change), and q8_0 measured the same; twice that fails a broken kernel
    (a wrong scale or block is many standard deviations off)."""
    p = tmp_path / "g.gguf"
    write_tiny_gemma3(p, qtype=T.Q8_0, seed=seed)
    m = load_model(GGUFFile(p), kb)
    ids = np.random.default_rng(seed).integers(3, 200, 40)
    f16, q8 = forward_logits(m, "f16", ids), forward_logits(m, "q8_0", ids)
    assert np.abs(q8 - f16).max() < 0.15 * f16.std()
    assert (q8.argmax(1) == f16.argmax(1)).mean() >= 0.9
    # through the engine: prefix cache, batching and chunked prefill with a q8_0 pool
    llm = LLM(str(p), kv_type="q8_0", progress=False)
    assert llm.engine.cache.k.dtype == np.int8
    prompts = ["<start_of_turn>user\nhi", "hello there", "<start_of_turn>user\nhi again"]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    together = [c.token_ids for c in llm.generate(prompts, params)]
    alone = [llm.generate(pr, params)[0].token_ids for pr in prompts]
    assert together == alone  # batched or alone, the same greedy tokens


def test_k_and_v_of_their_own_types_through_the_engine(tmp_path):
    """K in q8_0 and V in f16 (and the other way): the compiled step and the per-op forward agree bit for bit,
    and so do a batch and each prompt alone; the memory estimate counts each half in its own type."""
    from edgeinfer import memory

    p = tmp_path / "g.gguf"
    write_tiny_gemma3(p, qtype=T.Q8_0, seed=3)
    m = load_model(GGUFFile(p), kb)
    ids = np.random.default_rng(3).integers(3, 200, 40)
    f16, q8 = forward_logits(m, "f16", ids), forward_logits(m, "q8_0", ids)
    for kv in ("q8_0/f16",):  # (one way round: test_kv_format reads both ways, test_models steps q5_1/q4_0)
        step = forward_logits(m, kv, ids)
        c = m.cfg
        n = len(ids)
        cache = KVCache(c.n_layer, -(-n // 4), 4, c.n_kv_head, c.head_dim, c.v_head_dim, dtype=kv, kb=kb)
        per_op = m.forward_per_op(Batch(ids, np.arange(n), np.zeros(n), np.arange(n), np.arange(-(-n // 4))[None],
                                        np.arange(n)), cache)
        np.testing.assert_array_equal(step, per_op)
        assert not np.array_equal(step, f16) and not np.array_equal(step, q8)  # each half is read in its own type
        assert np.abs(step - f16).max() < 0.15 * f16.std()
    llm = LLM(str(p), kv_type="q8_0/f16", progress=False)
    assert (llm.engine.cache.k.dtype, llm.engine.cache.v.dtype) == (np.int8, np.uint16)
    est = memory.estimate(0, llm.config, llm.engine.config, kb.KV_FORMATS)
    assert est.kv_per_token["q8_0/f16"] * 2 == est.kv_per_token["q8_0"] + est.kv_per_token["f16"]
    prompts = ["<start_of_turn>user\nhi", "hello there", "<start_of_turn>user\nhi again"]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    together = [c.token_ids for c in llm.generate(prompts, params)]
    assert together == [llm.generate(pr, params)[0].token_ids for pr in prompts]


def test_k_and_v_types_from_the_cli(tmp_path):
    from edgeinfer.cli.main import main

    p = tmp_path / "g.gguf"
    write_tiny_gemma3(p, qtype=T.Q8_0)
    r = CliRunner().invoke(main, ["generate", str(p), "hi", "-n", "2", "--kv-type-k", "q8_0", "--kv-type-v", "f16"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["inspect", str(p), "--memory", "--json", "--kv-type", "f32", "--kv-type-v", "q8_0"])
    m = json.loads(r.output)["memory"]
    assert m["default_kv_type"] == "f32/q8_0" and set(m["kv_mb_per_1k_tokens"]) == {*KV_TYPES, "f32/q8_0"}
    per_1k = m["kv_mb_per_1k_tokens"]
    assert 0 < per_1k["q4_0"] <= 0.3 * per_1k["f16"] and per_1k["q4_0"] < per_1k["q8_0"] < per_1k["f16"]
    r = CliRunner().invoke(main, ["generate", str(p), "hi", "--kv-type-k", "q3_k"])
    assert r.exit_code == 2 and "'q3_k' is not one of" in r.output


def test_kv_type_defaults_and_errors(tiny_llama_path):
    assert EngineConfig().kv_dtype == "f16"
    assert EngineConfig(backend="cuda").kv_dtype == "f32"
    with pytest.raises(ValueError, match="CUDA backend has no q8_0 KV cache"):
        EngineConfig(backend="cuda", kv_dtype="q8_0")
    with pytest.raises(ValueError, match="q8_0 KV cache needs head sizes that are multiples of 32"):
        LLM(str(tiny_llama_path), kv_type="q8_0", progress=False)  # head size 16


def test_default_kv_pool_holds_one_context(tiny_llama_path):
    llm = LLM(str(tiny_llama_path), progress=False)  # context 256
    e = llm.engine
    assert e.max_context == 256
    assert e.block_manager.num_blocks * e.config.block_size == 256
    assert e.cache.k.dtype == np.uint16  # f16


def test_memory_budget_sizes_the_pool_or_names_the_smallest(tmp_path):
    from edgeinfer import memory

    p = tmp_path / "g.gguf"
    write_tiny_gemma3(p, n_ctx=512)
    with GGUFFile(p) as gf:
        from edgeinfer.file_estimate import weight_bytes
        from edgeinfer.kernels.kv_format import KV_FORMATS
        from edgeinfer.models import model_config

        est = memory.estimate(weight_bytes(gf), model_config(gf), EngineConfig(), KV_FORMATS)
    smallest = memory.RUNTIME_BYTES + est.minimum("f16")  # the trained context, 512 tokens
    # a budget a byte short of it: the context is cut to the whole blocks that fit (with --max-context, an error)
    cut = LLM(str(p), memory_budget_mb=(smallest - 1) / memory.MB, progress=False)
    assert cut.engine.max_context == 512 - 16 and cut.engine.block_manager.num_blocks == 496 // 16
    with pytest.raises(MemoryBudgetError, match="KV for one 512-token context"):
        LLM(str(p), memory_budget_mb=(smallest - 1) / memory.MB, max_context=512, progress=False)
    # never below memory.MIN_CONTEXT tokens: a budget short of that names the smallest that fits
    least = smallest - est.kv("f16", 512 - memory.MIN_CONTEXT)
    with pytest.raises(MemoryBudgetError) as e:
        LLM(str(p), memory_budget_mb=(least - 1) / memory.MB, progress=False)
    msg = str(e.value)
    assert f"the smallest budget that fits is {-(-least // memory.MB)} MB" in msg
    assert "weights" in msg and f"KV for one {memory.MIN_CONTEXT}-token context" in msg
    # q8_0 needs less: a budget too small for f16's whole context holds q8_0's
    q8 = LLM(str(p), memory_budget_mb=(smallest - 1) / memory.MB, kv_type="q8_0", progress=False)
    assert q8.engine.max_context == 512 and q8.engine.block_manager.num_blocks * 16 >= 512
    # a roomy budget: more KV than one context, never more than a context per sequence
    big = LLM(str(p), memory_budget_mb=smallest / memory.MB + 4, progress=False)
    blocks = big.engine.block_manager.num_blocks
    assert 512 // 16 < blocks <= big.engine.config.seqs_limit * 512 // 16
    spare = (4 * memory.MB) // (est.kv_per_token["f16"] * 16)
    assert blocks == min(512 // 16 + spare, big.engine.config.seqs_limit * 512 // 16)
    assert big.generate("hi", SamplingParams(max_tokens=3))[0].token_ids


def test_memory_budget_from_the_cli_is_one_line(tmp_path):
    from edgeinfer.cli.main import main

    p = tmp_path / "g.gguf"
    write_tiny_gemma3(p)
    r = CliRunner().invoke(main, ["generate", str(p), "hi", "-n", "2", "--memory-budget", "50"])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: a memory budget of 50 MB is too small")


def test_inspect_memory_estimate(tmp_path):
    from edgeinfer.cli.main import main

    p = tmp_path / "g.gguf"
    write_tiny_gemma3(p, n_ctx=512)
    r = CliRunner().invoke(main, ["inspect", str(p), "--memory", "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.output)["memory"]
    kv = m["kv_mb_per_1k_tokens"]
    # tiny gemma3: 7 layers, every sixth global, 1 KV head of 32: per token 2 * 32 values in the one global
    # layer; the six sliding-window layers' (window 8) in a window pool
    row = 2 * 32 * 4
    assert kv["f32"] == pytest.approx(row * 1000 / 2**20, abs=0.01)
    assert kv["f16"] == pytest.approx(kv["f32"] / 2, abs=0.01) and kv["q8_0"] < 0.6 * kv["f16"]
    assert m["max_context"] == 512 and m["default_kv_type"] == "f16"
    # a sequence's window, the 7 tokens before its next, in 3 blocks of 16 at most (partly behind the
    # window, unaligned), and a step's 512 tokens: with 8 sequences, capped by the full pool's 32 blocks
    assert m["window_kv_tokens_per_seq"] == 48 and m["window_kv_step_tokens"] == 512
    assert m["window_kv_mb_per_seq"]["f32"] == pytest.approx(6 * row * 48 / 2**20, abs=0.01)
    assert m["default_kv_pool_mb"] == pytest.approx(7 * row / 2 * 512 / 2**20, abs=0.05)
    assert m["total_mb"] == pytest.approx(m["weights_mb"] + m["buffers_mb"] + m["runtime_mb"]
                                          + m["default_kv_pool_mb"], abs=0.2)
    text = CliRunner().invoke(main, ["inspect", str(p), "--memory"]).output
    assert "KV per 1k tokens (full layers), q8_0" in text and "total when all is resident" in text
    assert "window KV per sequence, f16" in text
    # one sequence at a 4096-token context: the global layer's 4096 tokens, the windows' 48 and a step's 512
    r = CliRunner().invoke(main, ["inspect", str(p), "--memory", "--json", "--max-context", "4096", "--max-seqs", "1"])
    m = json.loads(r.output)["memory"]
    assert m["window_kv_seqs"] == 1
    assert m["default_kv_pool_mb"] == pytest.approx((4096 + 6 * 560) * row / 2 / 2**20, abs=0.05)


def test_a_plain_generate_imports_no_server_template_or_quantizer(tiny_llama_path):
    code = (
        "import sys\n"
        "from edgeinfer import LLM, SamplingParams\n"
        f"LLM({str(tiny_llama_path)!r}, progress=False).generate('the', SamplingParams(max_tokens=2))\n"
        "bad = [m for m in ('starlette', 'uvicorn', 'prometheus_client', 'jinja2', 'edgeinfer.quant.tool',\n"
        "                   'urllib.request') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_4_and_5_bit_kv_on_a_tiny_model_with_rotated_heads(tmp_path):
    """Heads of 64 (rotated before they are quantized, as llama.cpp's): a 5-bit type, a 4-bit one and bf16 near
    f16's logits, the coarser further off; the compiled step equals the per-op forward bit for bit; a batch equals
    each prompt alone. (Every type's attention is checked against its values in test_kv_format; each compiled
    step costs a compile, so three types run here.)"""
    p = tmp_path / "g.gguf"
    write_tiny_gemma3(p, qtype=T.Q8_0, head_dim=64, seed=2)
    m = load_model(GGUFFile(p), kb)
    ids = np.random.default_rng(2).integers(3, 200, 40)
    f16 = forward_logits(m, "f16", ids)
    off = {}
    for kv in ("bf16", "q5_1", "q4_0"):
        got = forward_logits(m, kv, ids)
        stack, m.stack = m.stack, None
        try:
            np.testing.assert_array_equal(forward_logits(m, kv, ids), got, err_msg=kv)  # per op
        finally:
            m.stack = stack
        off[kv] = np.abs(got - f16).max() / f16.std()
        assert (got.argmax(1) == f16.argmax(1)).mean() >= 0.8, kv
    assert off["bf16"] < 0.15 and off["q5_1"] < off["q4_0"] < 0.6, off
    llm = LLM(str(p), kv_type="q4_0", progress=False)
    prompts = ["<start_of_turn>user\nhi", "hello there", "<start_of_turn>user\nhi again"]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    together = [c.token_ids for c in llm.generate(prompts, params)]
    assert together == [llm.generate(pr, params)[0].token_ids for pr in prompts]
