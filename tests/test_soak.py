"""The short soak: benchmarks/soak.py for two minutes on a tiny model, as CI runs it (the 30-minute
run on SmolLM2 is in docs/reliability.md). Over 1,000 requests of every kind; the server must not
leak memory, KV blocks, file descriptors or threads, and must answer only 2xx, 4xx and 503s."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_short_soak_leaks_nothing(tmp_path):
    from tiny_models import write_tiny_llama

    model = tmp_path / "soak-tiny.gguf"
    write_tiny_llama(model, n_ctx=512, dim=64, n_head=2, n_kv=1, ffn=128, n_layer=2)
    out = tmp_path / "soak"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--model", str(model), "--minutes", "2",
                        "--burst-every", "15", "--idle-every", "12", "--threads", "1", "--short-tokens", "8",
                        "--long-tokens", "32", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    record = json.loads((out / "soak.json").read_text())
    v = record["verdict"]
    print(r.stdout)
    assert v["figures"]["requests"] >= 1000, v["figures"]
    assert set(v["figures"]["by_kind"]) == {"plain", "stream", "cancel", "malformed"}
    assert min(v["figures"]["by_kind"].values()) >= 50, v["figures"]["by_kind"]
    # every leak and error criterion; the P99 comparison is printed but not asserted here, since two
    # minutes on a shared CI machine are too short for a latency comparison to mean anything
    checks = {k: ok for k, ok in v["checks"].items() if k != "p99_latency_within_20pct"}
    assert all(checks.values()), (checks, r.stdout[-2000:])
    assert v["figures"]["idle_points"] >= 8 and v["figures"]["idle_points_with_blocks_in_use"] == 0
    assert "503" in v["figures"]["statuses"], "the bursts never filled the queue"
    assert (out / "soak.png").stat().st_size > 10_000
