"""openai.times: the one RFC 3339 formatter and the one keep_alive parser, as each of their callers sees
them (Ollama's request bodies, `serve --keep-alive`, /api/ps and /v1/models, Ollama's created_at)."""

from datetime import datetime, timedelta, timezone

import pytest

from edgeinfer.openai import protocol as P
from edgeinfer.openai.ollama_options import keep_alive
from edgeinfer.openai.times import parse_keep_alive, rfc3339
from edgeinfer.server.models import FOREVER


def test_rfc3339_to_the_second_as_expires_at():
    """/api/ps and /v1/models: seconds, a Z, whatever the datetime's zone; the far-future FOREVER too."""
    t = datetime(2024, 5, 1, 12, 0, 7, 999999, tzinfo=timezone.utc)
    assert rfc3339(t) == "2024-05-01T12:00:07Z"
    assert rfc3339(t.astimezone(timezone(timedelta(hours=5, minutes=30)))) == "2024-05-01T12:00:07Z"
    assert rfc3339(FOREVER) == "9999-12-31T23:59:59Z"
    assert rfc3339(t) == t.strftime("%Y-%m-%dT%H:%M:%SZ")  # the strftime it replaced


def test_rfc3339_with_microseconds_as_ollama_writes_created_at():
    assert rfc3339(1.5, "microseconds") == "1970-01-01T00:00:01.500000Z"
    assert rfc3339(1714564807.25, "microseconds") == "2024-05-01T12:00:07.250000Z"
    now = datetime.now(timezone.utc)
    got = datetime.fromisoformat(rfc3339(timespec="microseconds").replace("Z", "+00:00"))
    assert abs((got - now).total_seconds()) < 5


# value, what `serve --keep-alive` gets, what an Ollama body's keep_alive gets (negative: -1, keep loaded)
SHARED = [(300, 300.0, 300.0), (0, 0.0, 0.0), (-1, -1.0, -1.0), (-5, -5.0, -1.0), (0.5, 0.5, 0.5),
          ("300", 300.0, 300.0), ("0", 0.0, 0.0), ("-1", -1.0, -1.0), ("-5", -5.0, -1.0), ("+5", 5.0, 5.0),
          ("1e3", 1000.0, 1000.0), (" 5m ", 300.0, 300.0), ("30s", 30.0, 30.0), ("5m", 300.0, 300.0),
          ("1h", 3600.0, 3600.0), ("1h30m", 5400.0, 5400.0), ("500ms", 0.5, 0.5), ("250ms", 0.25, 0.25),
          (".5s", 0.5, 0.5), ("1.5h", 5400.0, 5400.0), ("-1m", -60.0, -1.0), ("-5m", -300.0, -1.0),
          ("+5m", 300.0, 300.0), ("100us", 100 * 1e-6, 100 * 1e-6), ("100µs", 100 * 1e-6, 100 * 1e-6),
          ("10ns", 10 * 1e-9, 10 * 1e-9)]
BAD = ["", " ", "-", "+", "soon", "5x", "m", "1y", "5 minutes", "inf", "-inf", "nan", "5m-", "m5",
       float("inf"), float("nan"), True, False, [5], {"s": 1}]


@pytest.mark.parametrize("value, cli, body", SHARED)
def test_keep_alive_read_alike_by_cli_and_body(value, cli, body):
    assert parse_keep_alive(value) == cli
    assert keep_alive({"keep_alive": value}) == body


@pytest.mark.parametrize("value", BAD)
def test_bad_keep_alive_refused_by_cli_and_body(value):
    with pytest.raises(ValueError, match="keep_alive"):
        parse_keep_alive(value)
    with pytest.raises(P.APIError) as e:
        keep_alive({"keep_alive": value})
    assert e.value.status == 400 and e.value.param == "keep_alive" and "'keep_alive' must be" in e.value.message


def test_absent_keep_alive_is_none_in_a_body_and_an_error_on_the_cli():
    assert keep_alive({}) is None and keep_alive({"keep_alive": None}) is None
    with pytest.raises(ValueError, match="keep_alive"):
        parse_keep_alive(None)
