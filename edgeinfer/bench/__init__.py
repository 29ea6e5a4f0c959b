"""Benchmarks the runtime runs itself: inprocess.py measures one loaded model (`edgeinfer bench`,
benchmarks/compare_llamacpp.py), and serve.py (with workload.py, client.py and report.py) load-tests any
OpenAI-compatible server (`edgeinfer bench-serve`). The in-process measurements' names are here, as
callers use them (`from edgeinfer import bench; bench.run(llm)`); the load generator's are in
edgeinfer.bench.serve."""

from .inprocess import (KEYS, STARTUP, child_env, cold_start, decode_tok_s, first_run, format_spec,
                        format_table, load_spec_prompts, prefix_ttft_ratio, prompt_tok_s, random_prompt, run,
                        spec_compare, system_info, timed_decode, to_json)
from .inprocess import _prompt_ids  # noqa: F401  (benchmarks/speculative/bench_spec.py imports it from here)

__all__ = ["KEYS", "STARTUP", "child_env", "cold_start", "decode_tok_s", "first_run", "format_spec", "format_table",
           "load_spec_prompts", "prefix_ttft_ratio", "prompt_tok_s", "random_prompt", "run", "spec_compare",
           "system_info", "timed_decode", "to_json"]
