"""The CUDA backend on numba's CUDA simulator: each kernel against the CPU kernel, and generation."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from edgeinfer.kernels import get_backend
from test_kernels import random_tensor
from edgeinfer.quant.repack import repack

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("the CUDA tests run on numba's simulator (NUMBA_ENABLE_CUDASIM=1, set by conftest)",
                allow_module_level=True)

from numba import cuda  # noqa: E402

cpu = get_backend("cpu")
gpu = get_backend("cuda")
rng = np.random.default_rng(0)
# Tolerances: the two backends sum in different orders (lanes vs one accumulator), float32; 1e-4
# relative covers K up to a few hundred terms.
RTOL, ATOL = 1e-4, 1e-5


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


@pytest.mark.parametrize("t", [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K,
                               T.Q3_K, T.Q2_K, T.MXFP4],
                         ids=lambda t: t.name)
def test_matmul_embed_dequantize(t):
    n, k = 5, 256
    raw, ref = random_tensor(t, n, k, rng)
    w = repack(raw, t, (k, n))
    wd = gpu.upload(w)
    x = rng.standard_normal((2, k)).astype(np.float32)
    # against the float reference: the CPU kernels round activations to 8 bits, the CUDA ones do not
    np.testing.assert_allclose(gpu.to_host(gpu.matmul(wd, dev(x))), x @ ref.T, rtol=RTOL, atol=ATOL * 10)
    np.testing.assert_array_equal(gpu.dequantize(wd), ref)
    ids = np.array([4, 0, 2])
    np.testing.assert_array_equal(gpu.to_host(gpu.embed(wd, ids)), cpu.embed(w, ids))


@pytest.mark.parametrize("t", [T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS], ids=lambda t: t.name)
def test_the_low_bit_types_run_on_the_host_kinds_kernels(t):
    """Q2_K, Q3_K and IQ4_NL in their own kinds, IQ4_XS on IQ4_NL's: both backends decode the same values,
    gguf's (IQ4_XS within the widening's rounding), from quantize-model's quantizers."""
    import gguf

    from edgeinfer.quant.tool import quantize_rows

    n, k = 5, 512
    x32 = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    raw = quantize_rows(x32, t)
    ref = gguf.quants.dequantize(raw, t).reshape(n, k)
    w = repack(raw, t, (k, n))
    wd = gpu.upload(w)
    got = gpu.dequantize(wd)
    np.testing.assert_array_equal(got, cpu.dequantize(w))  # the host kind's values, on both backends
    tol = {T.Q3_K: 0, T.IQ4_NL: 0, T.IQ4_XS: 2.0 ** -11, T.Q2_K: 0}[t]
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
    x = rng.standard_normal((2, k)).astype(np.float32)
    np.testing.assert_allclose(gpu.to_host(gpu.matmul(wd, dev(x))), x @ got.T, rtol=RTOL, atol=ATOL * 10)


def test_float32_matrix():
    w = rng.standard_normal((7, 32)).astype(np.float32)
    x = rng.standard_normal((3, 32)).astype(np.float32)
    np.testing.assert_allclose(gpu.to_host(gpu.matmul(gpu.upload(w), dev(x))), x @ w.T, rtol=RTOL, atol=ATOL)


def test_norm_rope_activations():
    x = rng.standard_normal((3, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    a, b = np.empty_like(x), gpu.empty(x.shape)
    cpu.rmsnorm(x, w, 1e-6, a)
    gpu.rmsnorm(dev(x), dev(w), 1e-6, b)
    np.testing.assert_allclose(gpu.to_host(b), a, rtol=RTOL, atol=ATOL)
    for neox in (False, True):
        q = rng.standard_normal((3, 2, 8)).astype(np.float32)
        pos = np.array([0, 5, 40])
        inv = 10000.0 ** (-np.arange(0, 8, 2) / 8)
        qc, qg = q.copy(), dev(q)
        cpu.rope(qc, pos, inv, neox)
        gpu.rope(qg, dev(pos), dev(inv.astype(np.float32)), neox)
        np.testing.assert_allclose(gpu.to_host(qg), qc, rtol=RTOL, atol=1e-4)  # float32 angles on the GPU
    g, u = (rng.standard_normal((2, 9)).astype(np.float32) for _ in range(2))
    for fname in ("silu_mul", "gelu_tanh_mul"):
        a, b = np.empty_like(g), gpu.empty(g.shape)
        getattr(cpu, fname)(g, u, a)
        getattr(gpu, fname)(dev(g), dev(u), b)
        np.testing.assert_allclose(gpu.to_host(b), a, rtol=RTOL, atol=ATOL)
    s = dev(g * 10)
    gpu.softcap(s, 5.0)
    c = g * 10
    cpu.softcap(c, np.float32(5.0))
    np.testing.assert_allclose(gpu.to_host(s), c, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("window", [0, 3])
def test_write_kv_and_paged_attention(window):
    seq_len, h, kvh, d, bs = 9, 2, 1, 8, 4
    k, v = (rng.standard_normal((seq_len, kvh, d)).astype(np.float32) for _ in range(2))
    table = np.array([[2, 0, 3, 1]], np.int32)
    slots = (table[0][np.arange(seq_len) // bs] * bs + np.arange(seq_len) % bs).astype(np.int64)
    kc, vc = np.zeros((16, kvh, d), np.float32), np.zeros((16, kvh, d), np.float32)
    kcg, vcg = gpu.zeros((16, kvh, d)), gpu.zeros((16, kvh, d))
    cpu.write_kv(k, v, slots, kc, vc)
    gpu.write_kv(dev(k), dev(v), dev(slots), kcg, vcg)
    np.testing.assert_array_equal(gpu.to_host(kcg), kc)
    q = rng.standard_normal((3, h, d)).astype(np.float32)
    pos = np.array([0, 4, 8])
    seq = np.zeros(3, np.int64)
    a, b = np.zeros((3, h, d), np.float32), gpu.empty((3, h, d))
    cpu.paged_attention(q, kc, vc, seq, pos, table, bs, np.float32(0.3), window, np.float32(0.0), a)
    gpu.paged_attention(dev(q), kcg, vcg, dev(seq), dev(pos), dev(table), bs, 0.3, window, 0.0, b)
    np.testing.assert_allclose(gpu.to_host(b), a, rtol=RTOL, atol=ATOL)


def test_sampling_helpers_and_array_ops():
    x = rng.standard_normal((3, 11)).astype(np.float32)
    np.testing.assert_array_equal(gpu.argmax_rows(x), cpu.argmax_rows(x))
    np.testing.assert_allclose(gpu.log_softmax_rows(x), cpu.log_softmax_rows(x), rtol=RTOL, atol=ATOL)
    y = rng.standard_normal((3, 11)).astype(np.float32)
    xd = dev(x)
    gpu.add_(xd, dev(y))
    gpu.scale_(xd, 2.0)
    np.testing.assert_allclose(gpu.to_host(xd), (x + y) * 2, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(gpu.to_host(gpu.take_rows(xd, dev(np.array([2, 0])))), gpu.to_host(xd)[[2, 0]])


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2"])
def test_greedy_generation_equal_between_backends(tmp_path, arch):
    from edgeinfer import LLM, SamplingParams
    from tiny_models import write_tiny_gemma3, write_tiny_llama

    p = tmp_path / f"{arch}.gguf"
    if arch in ("llama", "qwen2"):
        write_tiny_llama(p, dim=32, n_head=2, n_kv=1, ffn=64, n_layer=1, arch=arch)
    else:
        write_tiny_gemma3(p, dim=32, n_head=2, n_kv=1, head_dim=16, ffn=64, n_layer=2, window=4)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    # structured output masks the logits on the host, after either backend's forward pass
    constrained = SamplingParams(temperature=0, max_tokens=5, regex="[a-z]{2} [0-9]")
    from edgeinfer.config import EngineConfig

    outs = {}
    for backend in ("cpu", "cuda"):
        llm = LLM(str(p), engine_config=EngineConfig(backend=backend, num_kv_blocks=8, block_size=4), progress=False)
        outs[backend] = llm.generate(["the hen sat", "a", "b"], [params, params, constrained])
    assert [c.token_ids for c in outs["cuda"]] == [c.token_ids for c in outs["cpu"]]
    assert re.fullmatch("[a-z]{2} [0-9]", outs["cuda"][2].text)


def test_cuda_without_a_gpu_is_a_clear_error(tiny_llama_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-m", "edgeinfer.cli.main", "generate", str(tiny_llama_path), "hi",
                        "--device", "cuda"], capture_output=True, text=True, env=env, timeout=120)
    if r.returncode == 0:
        pytest.skip("this machine has a usable GPU")
    assert r.returncode == 1 and "needs an NVIDIA GPU" in r.stderr and "Traceback" not in r.stderr


def test_importing_edgeinfer_does_not_load_the_cuda_backend():
    code = ("import sys, edgeinfer, edgeinfer.llm, edgeinfer.kernels; "
            "assert 'edgeinfer.kernels.cuda.backend' not in sys.modules, 'cuda backend imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_encoder_models_are_a_clear_error_on_cuda(tiny_nomic_path):
    """The CUDA backend has no encoder kernels yet: loading nomic-bert there says so (and speculation,
    a CPU-only feature, is refused before any backend starts)."""
    from edgeinfer import LLM
    from edgeinfer.engine.speculative import SpeculationError
    from edgeinfer.models.common import ModelLoadError

    p = tiny_nomic_path
    with pytest.raises(ModelLoadError, match="the cuda backend cannot run encoder models \\(nomic-bert\\) yet"):
        LLM(str(p), backend="cuda", progress=False)
    with pytest.raises(SpeculationError, match="not available on the cuda backend yet"):
        LLM(str(p), backend="cuda", progress=False, speculate="lookup")
