"""Where the benchmark scripts put their JSON: benchmarks/results/NAME-YYYYmmdd-HHMMSS.json."""

from __future__ import annotations

import json
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def save(name: str, data) -> Path:
    """Write data as JSON under a timestamped name, say where, and return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    dest = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    dest.write_text(json.dumps(data, indent=1))
    print(f"\nJSON: {dest}")
    return dest
