"""What a bench-serve run is asked to do: the target server, the workload and its sizes, the arrival
process, the SLOs. A leaf beside workload.py: the runner (serve.py) and the report both read it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .workload import WORKLOADS, BenchServeError


@dataclass
class BenchConfig:
    base_url: str
    model: str | None = None
    endpoint: str = "completions"  # or "chat"
    workload: str = "fixed"
    num_prompts: int = 100
    request_rate: float = math.inf
    burstiness: float = 1.0
    concurrency: int | None = None
    input_len: int = 128
    output_len: int = 64
    prefix_len: int = 512
    long_fraction: float = 0.2
    priority_fraction: float = 0.2
    high_priority: int = -1  # what the priority workload's urgent requests send (lower runs first)
    seed: int = 0
    warmup: int = 2
    timeout: float = 300.0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    temperature: float = 0.0
    ignore_eos: bool = True
    api_key: str | None = None
    tokenizer: str | None = None  # a model name or GGUF path for servers without /tokenize
    progress: bool = True
    wait: float = 300.0  # seconds to wait for a server whose /health says it is still loading

    def __post_init__(self):
        if self.endpoint not in ("completions", "chat"):
            raise BenchServeError(f"endpoint must be 'completions' or 'chat', got {self.endpoint!r}")
        if self.workload not in WORKLOADS:
            raise BenchServeError(f"unknown workload {self.workload!r}; choose from {', '.join(WORKLOADS)}")
        for name in ("num_prompts", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise BenchServeError(f"{name.replace('_', '-')} must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise BenchServeError("concurrency must be at least 1")
        if not 0 <= self.long_fraction <= 1 or not 0 <= self.priority_fraction <= 1:
            raise BenchServeError("the long and priority fractions must be between 0 and 1")
        if self.timeout <= 0:
            raise BenchServeError("the timeout must be positive")
        if not self.wait >= 0:
            raise BenchServeError("wait must be zero or more seconds")
