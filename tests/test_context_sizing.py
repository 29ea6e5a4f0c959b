"""The context when nobody gives one: the model's trained context, cut so one context's KV takes at most
memory.KV_SHARE of the memory left once the model is loaded (the machine's, within its container's limit),
never below memory.MIN_CONTEXT; --max-context wins; `inspect --memory` and the server say what they chose."""

import pytest
from click.testing import CliRunner

from edgeinfer import LLM, SamplingParams, memory
from edgeinfer import file_estimate
from edgeinfer.config import EngineConfig
from edgeinfer.engine.llm_engine import PromptTooLongError
from edgeinfer.gguf_file import GGUFFile
from edgeinfer.memory_available import available_memory, cgroup_left
from tiny_models import write_tiny_llama

MB = memory.MB


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """A tiny model trained for 8,192 tokens (past DEFAULT_MAX_CONTEXT, which no longer caps it)."""
    p = tmp_path_factory.mktemp("ctx") / "long.gguf"
    write_tiny_llama(p, n_ctx=8192)
    return p


def _estimate(path, config=None):
    with GGUFFile(path) as gf:
        return file_estimate.estimate_file(gf, config or EngineConfig())


def test_the_trained_context_where_memory_allows(long_model):
    llm = LLM(str(long_model), progress=False)
    assert llm.engine.max_context == 8192 and llm.context_note == "the model's trained context"
    bs = llm.engine.config.block_size
    assert llm.engine.block_manager.num_blocks * bs == 8192  # the pool: one whole context
    assert LLM(str(long_model), max_context=300, progress=False).engine.max_context == 300  # a given one wins


def test_a_context_cut_to_the_memory_available(long_model, monkeypatch):
    est = _estimate(long_model)
    per_token = est.kv_per_token["f16"]
    # memory for 3,000 tokens' KV at KV_SHARE once the model is in: the context is the whole blocks of that
    available = memory.RUNTIME_BYTES + est.fixed("f16") + int(3000 * per_token / memory.KV_SHARE)
    monkeypatch.setattr(file_estimate, "available_memory", lambda: available)
    llm = LLM(str(long_model), progress=False)
    assert llm.engine.max_context == 3000 // 16 * 16
    assert "the model's 8192 cut" in llm.context_note and "--max-context" in llm.context_note
    # the engine holds to it: a prompt past it is refused, naming it
    with pytest.raises(PromptTooLongError, match=f"the context holds {3000 // 16 * 16}"):
        llm.generate([5] * 3000, SamplingParams(max_tokens=1))
    # never below MIN_CONTEXT, however little is free
    monkeypatch.setattr(file_estimate, "available_memory", lambda: 1)
    assert LLM(str(long_model), progress=False).engine.max_context == memory.MIN_CONTEXT
    # unreadable: the model's, capped at DEFAULT_MAX_CONTEXT, as before
    monkeypatch.setattr(file_estimate, "available_memory", lambda: None)
    llm = LLM(str(long_model), progress=False)
    assert llm.engine.max_context == memory.DEFAULT_MAX_CONTEXT and "could not be read" in llm.context_note


def test_longrope_models_and_other_backends_keep_the_capped_context(zoo, tmp_path):
    from test_arch_zoo import _rewrite

    p = tmp_path / "phi3-long.gguf"
    _rewrite(zoo("phi3"), p, meta={"phi3.context_length": 131072})  # LongRoPE, trained for 131,072
    with GGUFFile(p) as gf:  # its factors follow the context: the old default, whatever the memory
        config, why = file_estimate.context_for_memory(gf, EngineConfig())
        assert config.max_context == memory.DEFAULT_MAX_CONTEXT and "LongRoPE" in why
    with GGUFFile(zoo("phi3")) as gf:  # trained for 1,024: that
        assert file_estimate.context_for_memory(gf, EngineConfig())[0].max_context == 1024
    q = tmp_path / "olmo2-long.gguf"
    _rewrite(zoo("olmo2"), q, meta={"olmo2.context_length": 65536})
    with GGUFFile(q) as gf:  # the CUDA backend allocates its whole pool at load: the old default there
        config, why = file_estimate.context_for_memory(gf, EngineConfig(backend="cuda"))
        assert config.max_context == memory.DEFAULT_MAX_CONTEXT and "on cuda" in why
        assert file_estimate.context_for_memory(gf, EngineConfig())[0].max_context == 65536


def test_context_within_rules():
    est = memory.Estimate(weights=0, kv_per_token={"f16": 1000}, buffers=0, max_context=4096, trained_context=32768)
    assert est.context_within("f16", 10**12) == 32768  # the trained context at most
    assert est.context_within("f16", 5_000_000) == 4992  # whole blocks of 16
    assert est.context_within("f16", 0) == memory.MIN_CONTEXT
    recurrent = memory.Estimate(weights=0, kv_per_token={"f16": 0}, buffers=0, max_context=4096, trained_context=2**20)
    assert recurrent.context_within("f16", 0) == 2**20  # no KV grows with the context: the trained one
    short = memory.Estimate(weights=0, kv_per_token={"f16": 1000}, buffers=0, max_context=100, trained_context=100)
    assert short.context_within("f16", 0) == 100  # MIN_CONTEXT never lifts it past the trained one


def test_a_shared_budget_cuts_every_unset_context_by_one_factor():
    a = memory.Estimate(weights=10 * MB, kv_per_token={"f16": 1024}, buffers=MB, max_context=4096,
                        trained_context=32768)
    b = memory.Estimate(weights=10 * MB, kv_per_token={"f16": 4096}, buffers=MB, max_context=4096,
                        trained_context=8192)
    # room for half of each one's trained-context KV (32 MB + 32 MB = 64 MB wanted)
    budget = (memory.RUNTIME_BYTES + 22 * MB + 32 * MB) / MB
    out = memory.fit_budget([a, b], [EngineConfig(), EngineConfig()], budget)
    assert [c.max_context for c in out] == [16384, 4096]
    # a context given stays, and its KV comes out of the room first
    out = memory.fit_budget([a, b], [EngineConfig(), EngineConfig(max_context=4096)], budget)
    assert out[1].max_context == 4096 and out[0].max_context == (32 * MB - 16 * MB) // 1024 // 16 * 16


def test_sizing_leaves_room_for_every_sequences_window_and_state():
    """A sliding-window model: its sequences' windows are counted before the context takes what is left (with
    a budget, and without one), so a budget does not end with one sequence at a time."""
    est = memory.Estimate(weights=500 * MB, kv_per_token={"f16": 32768}, buffers=50 * MB, max_context=4096,
                          trained_context=131072, window_kv_per_token={"f16": 65536}, window_blocks_per_seq=34,
                          window_step_blocks=32, state_per_seq=2 * MB)
    config = EngineConfig(max_seqs=8)
    per_seq = est.window_kv("f16", 34) + 2 * MB
    (out,) = memory.fit_budget([est], [config], 4000)
    assert out.max_seqs == 8 and out.max_context > memory.DEFAULT_MAX_CONTEXT
    room = 4000 * MB - memory.RUNTIME_BYTES - est.fixed("f16", 8)
    assert out.max_context == room // 32768 // 16 * 16
    # a tight budget: the old default context with fewer sequences, not a short context with all of them
    small = (memory.RUNTIME_BYTES + est.fixed("f16") + est.kv("f16", 4096) + 2 * per_seq) / MB
    (out,) = memory.fit_budget([est], [config], small)
    assert out.max_context == 4096 and 1 < out.max_seqs < 8
    # without a budget: every sequence's window and state come out of the memory first
    available = memory.RUNTIME_BYTES + est.fixed("f16", 8) + 2 * 10000 * 32768
    assert memory.context_for_memory(est, config, available)[0] == 10000 // 16 * 16


def test_available_memory_reads_meminfo_and_the_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n")
    cg = tmp_path / "cgroup"
    (cg / "app").mkdir(parents=True)
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/app\n")
    assert available_memory(str(meminfo), str(proc), str(cg)) == 8000000 * 1024  # no limit files: the machine's
    (cg / "app" / "memory.max").write_text("max\n")
    (cg / "app" / "memory.current").write_text("1000\n")
    assert cgroup_left(str(proc), str(cg)) is None  # "max": no limit
    (cg / "memory.max").write_text(f"{2 * 2**30}\n")  # a limit above: the tightest on the path counts
    (cg / "memory.current").write_text(f"{2**30}\n")
    assert available_memory(str(meminfo), str(proc), str(cg)) == 2**30
    (cg / "memory.stat").write_text(f"anon 1000\ninactive_file {2**28}\nactive_file 5\n")  # page cache it can drop
    assert available_memory(str(meminfo), str(proc), str(cg)) == 2**30 + 2**28
    v1 = tmp_path / "v1"
    (v1 / "memory" / "box").mkdir(parents=True)
    (v1 / "memory" / "box" / "memory.limit_in_bytes").write_text(f"{3 * 2**30}\n")
    (v1 / "memory" / "box" / "memory.usage_in_bytes").write_text(f"{2**30}\n")
    proc.write_text("5:memory:/box\n4:cpu,cpuacct:/box\n")
    assert cgroup_left(str(proc), str(v1)) == 2 * 2**30
    (v1 / "memory" / "box" / "memory.stat").write_text(f"cache 9\ntotal_inactive_file {2**29}\n")
    assert cgroup_left(str(proc), str(v1)) == 2 * 2**30 + 2**29
    (v1 / "memory" / "box" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "unlimited"
    assert cgroup_left(str(proc), str(v1)) is None
    assert available_memory() > 0  # this machine's, read for real


def test_inspect_says_which_context_and_why(long_model):
    from edgeinfer.cli.main import main

    r = CliRunner().invoke(main, ["inspect", str(long_model), "--memory"])
    assert r.exit_code == 0 and "context 8192 tokens: the model's trained context" in r.output
    r = CliRunner().invoke(main, ["inspect", str(long_model), "--memory", "--max-context", "512"])
    assert r.exit_code == 0 and "context 512 tokens: --max-context" in r.output


def test_a_pool_the_system_refuses_is_one_line_naming_it():
    from edgeinfer.engine.kv_cache import KVCache
    from edgeinfer.kernels import get_backend

    with pytest.raises(ValueError, match=r"the KV pool \(7340032 MB: 67108864 tokens of f16 KV\) does not fit"):
        KVCache(28, 2**22, 16, 8, 128, 128, "f16", kb=get_backend("cpu"))  # 7 TB
