"""Times and durations as the APIs write them, each written once: RFC 3339 timestamps in UTC (Ollama's
created_at and modified_at, the expires_at of /api/ps and /v1/models) and Ollama's keep_alive (a number of
seconds or a Go duration), read the same from a request body and from `serve --keep-alive`."""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timezone

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def rfc3339(t: datetime | float | None = None, timespec: str = "seconds") -> str:
    """`t` (a datetime, seconds since the epoch, or None: now) in UTC as RFC 3339 with a Z: to the second
    ("2024-05-01T12:00:00Z"), or with timespec="microseconds" as Ollama writes created_at."""
    if not isinstance(t, datetime):
        t = datetime.fromtimestamp(time.time() if t is None else t, timezone.utc)
    return t.astimezone(timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_keep_alive(value) -> float:
    """Ollama's keep_alive as seconds: a number of seconds (300, "300", 0.5), or a Go duration ("30s",
    "5m", "1h30m", "-1m"); 0 unloads as soon as the model is idle, a negative value keeps it loaded.
    ValueError naming the value for anything else."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"keep_alive must be a number of seconds or a duration such as '5m', got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"keep_alive must be finite, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"keep_alive must be a number of seconds or a duration such as '5m', got {value!r}")
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None and math.isfinite(number):
        return number
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"keep_alive {value!r} is not a duration: use seconds (300) or a duration such as '30s', "
                         "'5m', '1h' ('0': unload when idle, '-1': keep loaded)")
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)
