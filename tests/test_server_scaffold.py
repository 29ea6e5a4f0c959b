"""The route scaffold (edgeinfer.server.scaffold) on a bare Starlette app with a fake server state: the API
key first, the route's own error body, 499 for a client gone, the lease released once (not by the scaffold
when the response streams), and the request's metrics with the right labels, status and token counts."""

from types import SimpleNamespace

import pytest

pytest.importorskip("starlette")

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import ClientDisconnect  # noqa: E402
from starlette.responses import JSONResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from edgeinfer.openai import protocol as P  # noqa: E402
from edgeinfer.server.scaffold import Call, route  # noqa: E402


class FakeModels:
    def __init__(self):
        self.held = 0

    async def acquire(self, name, keep_alive, timeout):
        self.held += 1

        def release(sm):
            self.held -= 1

        return SimpleNamespace(name=name or "default"), release


class FakeMetrics:
    def __init__(self):
        self.finished = []

    def finish(self, labels, status, n_prompt, n_out):
        self.finished.append((labels, status, n_prompt, n_out))


def _plain(e: P.APIError) -> JSONResponse:
    return JSONResponse({"error": e.message}, status_code=e.status)


@route("gen")
async def gen(request, call: Call):
    q = request.query_params
    if q.get("fail") == "before":
        raise P.bad("model", "no such thing")
    if q.get("gone") == "before":
        raise ClientDisconnect()
    sm = await call.use(q.get("model"))
    if q.get("fail") == "after":
        raise P.APIError(503, "busy", headers={"Retry-After": "1"})
    call.n_prompt = 7
    call.n_out = 3
    if q.get("gone") == "after":
        raise ClientDisconnect()
    if q.get("stream"):
        lease = call.lease

        async def body():
            yield "x"
            lease.release()

        return call.stream(StreamingResponse(body()))
    return JSONResponse({"model": sm.name})


@route(error=_plain)
async def plain(request, call: Call):
    await call.use("m")
    raise P.APIError(404, "nothing here")


@pytest.fixture
def app():
    a = Starlette(routes=[Route("/gen", gen, methods=["POST"]), Route("/plain", plain, methods=["GET"])])
    a.state.server = SimpleNamespace(
        config=SimpleNamespace(api_key="k", max_body_bytes=1024, read_timeout=5.0, request_timeout=5.0),
        api_key=b"k", models=FakeModels(), metrics=FakeMetrics())
    return a


AUTH = {"Authorization": "Bearer k"}


def _post(app, **params):
    with TestClient(app) as c:
        return c.post("/gen", params=params, headers=AUTH)


def test_api_key_is_checked_first_and_counted_under_the_unknown_model(app):
    with TestClient(app) as c:
        r = c.post("/gen")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert app.state.server.metrics.finished == [(("?", "gen"), "401", 0, 0)]


def test_success_releases_the_lease_and_counts_the_tokens(app):
    r = _post(app, model="m")
    assert r.status_code == 200 and r.json() == {"model": "m"}
    assert app.state.server.models.held == 0
    assert app.state.server.metrics.finished == [(("m", "gen"), "200", 7, 3)]


def test_errors_before_and_after_the_lease(app):
    r = _post(app, fail="before")
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = _post(app, model="m", fail="after")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert app.state.server.models.held == 0
    assert app.state.server.metrics.finished == [(("?", "gen"), "400", 0, 0), (("m", "gen"), "503", 0, 0)]


def test_a_client_gone_is_499_counted_only_once_a_generation_was_submitted(app):
    assert _post(app, gone="before").status_code == 499
    assert _post(app, model="m", gone="after").status_code == 499
    assert app.state.server.models.held == 0
    assert app.state.server.metrics.finished == [(("m", "gen"), "499", 7, 3)]


def test_a_streamed_response_owns_its_lease_and_metrics(app):
    r = _post(app, model="m", stream=1)
    assert r.status_code == 200 and r.text == "x"
    assert app.state.server.models.held == 0  # released by the stream's body, not twice
    assert app.state.server.metrics.finished == []


def test_a_route_without_an_endpoint_label_records_nothing_and_uses_its_error_body(app):
    with TestClient(app) as c:
        r = c.get("/plain", headers=AUTH)
    assert r.status_code == 404 and r.json() == {"error": "nothing here"}
    assert app.state.server.models.held == 0 and app.state.server.metrics.finished == []
