"""`edgeinfer ps`: the models a running server has in memory, as `ollama ps` shows them (its /api/ps)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime, timezone

import click

FOREVER_AFTER_DAYS = 365 * 100  # an expiry further away than this is a model kept loaded


def _size(n: int) -> str:
    """Bytes as ollama prints them: decimal units, three significant digits."""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            v = n / div
            return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"
    return f"{n} B"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def until(expires_at: str, now: datetime | None = None) -> str:
    """'4 minutes from now', 'Forever' or 'Stopping...' for an RFC 3339 expiry."""
    now = now or datetime.now(timezone.utc)
    try:
        t = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return "?"
    s = (t - now).total_seconds()
    if s > FOREVER_AFTER_DAYS * 86400:
        return "Forever"
    if s < 1:
        return "Stopping..."
    for unit, secs in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if s >= secs:
            n = int(s // secs)
            return ("About a" + ("n" if unit == "hour" else "") + f" {unit} from now") if n == 1 \
                else f"{_plural(n, unit)} from now"
    return f"{_plural(int(s), 'second')} from now"


def table(models: list[dict]) -> list[str]:
    rows = [("NAME", "ID", "SIZE", "PROCESSOR", "UNTIL")]
    for m in models:
        size, vram = int(m.get("size") or 0), int(m.get("size_vram") or 0)
        gpu = round(100 * vram / size) if size else 0
        proc = "100% GPU" if gpu >= 100 else "100% CPU" if gpu <= 0 else f"{100 - gpu}%/{gpu}% CPU/GPU"
        rows.append((m.get("name", "?"), (m.get("digest") or "")[:12], _size(size), proc,
                     until(m.get("expires_at", ""))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The server's address.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option("--url", default=None, help="The server's base URL (instead of --host and --port).")
@click.option("--api-key", envvar="EDGEINFER_API_KEY", default=None, help="The server's API key (or EDGEINFER_API_KEY).")
@click.option("--timeout", type=click.FloatRange(0.1, None), default=10.0, show_default=True, help="Seconds to wait.")
@click.option("--json", "as_json", is_flag=True, help="Print the server's answer as JSON.")
def ps(host, port, url, api_key, timeout, as_json):
    """List the models a running server has loaded: size, processor and when each unloads."""
    base = (url or f"http://{host}:{port}").rstrip("/")
    req = urllib.request.Request(base + "/api/ps", headers={"Accept": "application/json"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = e.reason
        raise click.ClickException(f"the server at {base} answered {e.code}: {message}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise click.ClickException(f"no edgeinfer server at {base}: {reason}") from None
    except ValueError:
        raise click.ClickException(f"the server at {base} did not answer /api/ps with JSON") from None
    if as_json:
        click.echo(json.dumps(body))
        return
    for line in table(body.get("models") or []):
        click.echo(line)


__all__ = ["ps", "table", "until"]
