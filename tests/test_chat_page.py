"""The chat page at `/`: served with a strict Content-Security-Policy, installed with the package, and
driven in a real headless Chromium (Debian's, through Playwright) against a live `edgeinfer serve`.

The browser tests skip on a machine without chromium or playwright, saying how to install them; with
EDGEINFER_BROWSER_TESTS=require (set by .ci/run) a missing browser fails them instead. EDGEINFER_CHROMIUM
names another chromium binary than Debian's /usr/bin/chromium."""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
from test_server import Server

ROOT = Path(__file__).resolve().parents[1]
PAGE_SOURCE = ROOT / "edgeinfer" / "server" / "static" / "chat.html"
CHROMIUM = os.environ.get("EDGEINFER_CHROMIUM", "/usr/bin/chromium")  # Debian's; elsewhere, say where
# Without the background-networking flags Chromium phones home, and a closed network refuses it.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
INSTALL_HINT = ("install it with `apt-get install -y chromium` (Debian's package, at /usr/bin/chromium) and "
                "`pip install playwright` (in the test extras; never `playwright install`)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A small random model with a long context, slow enough that a long answer can be stopped mid-way."""
    from tiny_models import write_tiny_llama

    path = tmp_path_factory.mktemp("chat_page") / "tiny-llama.gguf"
    write_tiny_llama(path, n_ctx=4096, dim=256, n_head=4, n_kv=2, ffn=1024, n_layer=8)
    s = Server(path).wait_ready()
    yield s
    s.stop()


# -- the route and the package, no browser ------------------------------------------------------------


def test_get_serves_the_page_with_a_strict_content_security_policy(server):
    r = httpx.get(server.base + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.text == PAGE_SOURCE.read_text("utf-8")
    csp = dict(d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";"))
    assert csp["default-src"] == "'self'" and csp["connect-src"] == "'self'"
    assert not re.search(r"https?:|\*|unsafe-inline|unsafe-eval", r.headers["content-security-policy"])
    assert r.headers["x-content-type-options"] == "nosniff"
    # the one inline script and the one inline style are allowed by their hashes, nothing else is
    from edgeinfer.server.page import content_security_policy

    assert content_security_policy(r.text) == r.headers["content-security-policy"]
    assert csp["script-src"].count("'sha256-") == 1 and csp["style-src"].count("'sha256-") == 1
    # self-contained: nothing in the page points at another origin
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", r.text)


def test_head_answers_200_with_no_body(server):
    r = httpx.head(server.base + "/")
    assert r.status_code == 200 and r.content == b""
    assert int(r.headers["content-length"]) == len(PAGE_SOURCE.read_bytes())
    assert httpx.post(server.base + "/").status_code == 405


def test_page_is_read_through_importlib_resources():
    from edgeinfer.server.page import page_html

    assert page_html() == PAGE_SOURCE.read_text("utf-8")


def test_a_built_wheel_installs_the_page(tmp_path):
    """A non-editable install carries static/chat.html: build the wheel from a copy of the sources (a
    build writes into its source tree), unpack it as pip would, and read the page from there."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "tests", "benchmarks", "build", "docs",
                                                             "*.egg-info", "__pycache__", "*.gguf"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                            str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("edgeinfer-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import edgeinfer.server.page as p, sys; assert p.__file__.startswith(sys.argv[1]), p.__file__; "
             "sys.stdout.write(p.page_html())")
    out = subprocess.run([sys.executable, "-c", probe, str(site)], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == PAGE_SOURCE.read_text("utf-8")


# -- in the browser -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Debian's chromium, headless, on a fresh profile; skipped (failed where required) when absent."""
    required = os.environ.get("EDGEINFER_BROWSER_TESTS") == "require"
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "the playwright package is not installed"
    if missing is None and not os.access(CHROMIUM, os.X_OK):
        missing = f"no browser at {CHROMIUM}"
    if missing:
        (pytest.fail if required else pytest.skip)(f"browser tests: {missing}; {INSTALL_HINT}")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(str(tmp_path_factory.mktemp("chromium-profile")),
                                                        executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context.set_default_timeout(20_000)
        yield context
        context.close()


class Tab:
    """One page of the browser, recording what a test asserts on: console errors, uncaught errors,
    dialogs (dismissed), every request's URL, and the chat requests' bodies and headers."""

    def __init__(self, context, base: str):
        self.base = base
        self.page = context.new_page()  # a new tab: its sessionStorage starts empty
        self.errors, self.dialogs, self.urls, self.chats = [], [], [], []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("request", self._request)

    def _request(self, request):
        self.urls.append(request.url)
        if request.url.endswith("/v1/chat/completions"):
            self.chats.append((request.post_data_json, request.headers))

    def open(self, wait_for_models=True):
        self.page.goto(self.base + "/")
        if wait_for_models:
            self.page.wait_for_function("() => document.querySelector('#model').options.length > 0")
        return self

    def settings(self, **fields):
        if not self.page.is_visible("#max-tokens"):
            self.page.click("#settings summary")
        for name, value in fields.items():
            self.page.fill("#" + name.replace("_", "-"), str(value))

    def ask(self, text):
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")

    def last_answer(self):
        return self.page.locator(".turn.assistant").last

    def wait_answered(self):
        """The last answer's stats line, once its stream is over (done, stopped or failed)."""
        answer = self.last_answer()
        self.page.wait_for_function("t => t.dataset.state !== 'streaming'", arg=answer.element_handle())
        return answer.locator(".stats").text_content()

    def route_chat(self, handler):
        self.page.route("**/v1/chat/completions", handler)

    def no_eos(self):
        """Chat requests go out with ignore_eos (the page has no such control), so that a random model's
        answer runs to max_tokens rather than ending at a chance EOS."""
        self.route_chat(lambda route: route.continue_(post_data=with_no_eos(route.request)))

    def close(self):
        self.page.close()


@pytest.fixture
def tab(browser, server):
    t = Tab(browser, server.base)
    yield t
    t.close()


def with_no_eos(request) -> str:
    return json.dumps({**request.post_data_json, "ignore_eos": True})


def streamed_content(sse_text: str) -> str:
    events = [json.loads(line[6:]) for line in sse_text.splitlines() if line.startswith("data: {")]
    return "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])


def sse(*chunks) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def delta(**d) -> dict:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": None}]}


def fulfil_with(body: str):
    return lambda route: route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)


def test_page_loads_offline_lists_the_model_and_streams_an_answer(tab, server):
    tab.open()
    assert tab.page.eval_on_selector("#model", "s => [...s.options].map(o => o.value)")[0] == "tiny-llama"
    assert tab.page.input_value("#model") == "tiny-llama"
    # every change to the answer's text, as the browser renders it
    tab.page.evaluate("""() => { window.lengths = [];
        new MutationObserver(() => { const b = document.querySelector('.turn.assistant .body');
            if (b) window.lengths.push(b.textContent.length); })
          .observe(document.querySelector('#chat'), {childList: true, subtree: true, characterData: true}); }""")
    tab.no_eos()
    tab.settings(max_tokens=48, temperature=0.8)
    tab.ask("the hen")
    stats = tab.wait_answered()
    m = re.fullmatch(r"48 tokens · ([\d.]+) tok/s", stats)
    assert m and float(m.group(1)) > 0, stats
    # rendered as it streamed, not at the end (Markdown may shorten the text for a moment: count, not order)
    assert len({n for n in tab.page.evaluate("window.lengths") if n}) >= 3
    body, _ = tab.chats[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "tiny-llama" and body["max_tokens"] == 48 and body["temperature"] == 0.8
    assert body["messages"] == [{"role": "user", "content": "the hen"}]
    assert tab.errors == [] and tab.dialogs == []
    assert tab.urls and all(u.startswith(server.base + "/") for u in tab.urls), tab.urls


def test_conversation_system_prompt_and_new_chat(tab):
    answers = []

    def record(route):  # buffered here (this test needs no streaming): the answer exactly as the server sent it
        response = route.fetch(post_data=with_no_eos(route.request))
        answers.append(streamed_content(response.text()))
        route.fulfill(response=response)

    tab.open()
    tab.route_chat(record)
    tab.settings(max_tokens=4, system="Be brief.")
    tab.ask("one")
    tab.wait_answered()
    tab.ask("two")
    tab.wait_answered()
    sent = tab.chats[-1][0]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[0]["content"] == "Be brief." and sent[3]["content"] == "two"
    assert sent[2]["content"] == answers[0] != ""  # the answer as streamed, sent back as history
    tab.page.click("#new-chat")
    assert tab.page.locator(".turn").count() == 0
    tab.ask("three")
    tab.wait_answered()
    assert [m["content"] for m in tab.chats[-1][0]["messages"]] == ["Be brief.", "three"]


def test_stop_aborts_the_stream_and_the_server_frees_its_blocks(tab, server):
    tab.open()
    tab.no_eos()
    tab.settings(max_tokens=3000)
    tab.ask("the")
    tab.page.wait_for_function("() => (document.querySelector('.turn.assistant .body') || {}).textContent?.length > 8")
    assert server.metric("edgeinfer_running_sequences") == 1 and server.metric("edgeinfer_kv_blocks_used") >= 1
    assert tab.page.is_visible("#stop") and not tab.page.is_visible("#send")
    tab.page.click("#stop")
    assert tab.wait_answered() == "stopped" and tab.last_answer().get_attribute("data-state") == "stopped"
    assert server.wait_blocks_freed(3.0), "the server kept the stopped request's KV blocks"
    assert server.metric("edgeinfer_running_sequences") == 0
    assert tab.page.is_visible("#send") and not tab.page.is_visible("#stop")
    assert tab.last_answer().locator(".body").inner_text().strip()  # the partial answer stays
    assert tab.errors == []


HOSTILE = ("# Title\n"
           "<img src=x onerror=alert(1)>\n"
           "<script>window.pwned = 1</script>\n"
           "see [click](javascript:alert(2)) and [docs](https://example.com/a?b=1) and **bold** *it* `x<b>y</b>`\n"
           "\n"
           "```python\nprint(\"<i>hi</i>\")\n```\n"
           "- item <svg onload=alert(3)>\n"
           "- two\n"
           "1. first\n")


def test_hostile_markdown_stays_text(tab):
    tab.open()
    pieces = [HOSTILE[i:i + 7] for i in range(0, len(HOSTILE), 7)]  # split mid-tag, as a stream would
    tab.route_chat(fulfil_with(sse(delta(role="assistant", content=""), *[delta(content=p) for p in pieces],
                                   {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 40}})))
    tab.ask("hi")
    assert tab.wait_answered().startswith("40 tokens")
    body = tab.last_answer().locator(".body")
    injected = body.evaluate("b => [...b.querySelectorAll('img, script, svg, i, b, iframe, [onerror], [onload]')]"
                             ".map(e => e.outerHTML)")
    assert injected == []
    assert tab.page.evaluate("window.pwned") is None and tab.dialogs == []
    text = body.inner_text()
    for literal in ("<img src=x onerror=alert(1)>", "<script>window.pwned = 1</script>", "[click](javascript:alert(2))",
                    "<svg onload=alert(3)>", "x<b>y</b>"):
        assert literal in text, literal
    links = body.evaluate("b => [...b.querySelectorAll('a')].map(a => [a.getAttribute('href'), a.rel, a.textContent])")
    assert links == [["https://example.com/a?b=1", "noopener noreferrer", "docs"]]
    assert body.locator("pre > code").text_content() == 'print("<i>hi</i>")'
    assert body.locator(".codeblock .lang").text_content() == "python"
    assert body.locator("h1").text_content() == "Title"
    assert body.locator("strong").text_content() == "bold" and body.locator("em").text_content() == "it"
    assert body.locator("p code").text_content() == "x<b>y</b>"
    assert body.locator("ul > li").count() == 2 and body.locator("ol > li").text_content() == "first"
    assert tab.errors == [] and not any("example.com" in u for u in tab.urls)


MARKDOWN = [  # source -> the HTML the renderer builds (read back with innerHTML; nothing is written with it)
    ("plain\ntwo lines\n\nnext", "<p>plain<br>two lines</p><p>next</p>"),
    ("**b** *i* __b2__ _i2_ snake_case_name", "<p><strong>b</strong> <em>i</em> <strong>b2</strong> <em>i2</em> "
                                               "snake_case_name</p>"),
    ("**bold with *italic* inside**", "<p><strong>bold with <em>italic</em> inside</strong></p>"),
    ("`a*b*c` and ``x`y``", "<p><code>a*b*c</code> and <code>x`y</code></p>"),
    ("## Head *x*", "<h2>Head <em>x</em></h2>"),
    ("3. three\n4. four\n\n- a\n  more", '<ol start="3"><li>three</li><li>four</li></ol><ul><li>a more</li></ul>'),
    ("> quoted **q**\n> on", "<blockquote><p>quoted <strong>q</strong><br>on</p></blockquote>"),
    ("---", "<hr>"),
    ("```js\nlet a = '<b>';\n", None),  # an unclosed fence (still streaming): a code block so far
    ("[a](data:text/html,x) [b](//evil.example) [c](JavaScript:x) [d]( https://ok.example/ )",
     '<p>[a](data:text/html,x) [b](//evil.example) [c](JavaScript:x) '
     '<a href="https://ok.example/" rel="noopener noreferrer" target="_blank">d</a></p>'),
    ("see https://x.example/a_b, then", '<p>see <a href="https://x.example/a_b" rel="noopener noreferrer" '
                                        'target="_blank">https://x.example/a_b</a>, then</p>'),
    ("&amp; &lt;b&gt; <b>x</b>", "<p>&amp;amp; &amp;lt;b&amp;gt; &lt;b&gt;x&lt;/b&gt;</p>"),
]


def test_markdown_renderer(tab):
    tab.open(wait_for_models=False)
    rendered = tab.page.evaluate("""sources => sources.map(src => {
        const d = document.createElement('div'); window.edgeinfer.renderMarkdown(src, d); return d.innerHTML; })""",
                                 [src for src, _ in MARKDOWN])
    for (src, expected), got in zip(MARKDOWN, rendered):
        if expected is None:
            assert "<pre><code class=\"language-js\">let a = '&lt;b&gt;';</code></pre>" in got, got
            assert '<span class="lang">js</span>' in got
        else:
            assert got == expected, src


def test_reasoning_shows_in_a_collapsed_thinking_block(tab):
    tab.open()
    tab.route_chat(fulfil_with(sse(delta(role="assistant", content=""), delta(reasoning_content="let me <b>think</b>"),
                                   delta(reasoning_content=" hard"), delta(content="**42**"))))
    tab.ask("why")
    tab.wait_answered()
    thinking = tab.last_answer().locator("details.thinking")
    assert thinking.locator("summary").text_content() == "Thinking"
    assert thinking.evaluate("d => d.open") is False
    assert thinking.locator(".body").text_content() == "let me <b>think</b> hard"
    assert tab.last_answer().locator(".bubble > .body strong").text_content() == "42"


def test_server_errors_are_shown_in_the_chat(tab, server):
    tab.open()
    tab.settings(max_tokens=100000)  # past the model's context: the server's 400 names max_tokens
    expected = httpx.post(server.base + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}).json()["error"]["message"]
    tab.ask("x")
    tab.wait_answered()
    assert tab.last_answer().get_attribute("data-state") == "error"
    error = tab.last_answer().locator(".error-text")
    assert error.text_content() == "Error: " + expected and "max_tokens" in expected
    assert "failed" in tab.page.locator(".turn.user").last.get_attribute("class")
    # an error event inside a stream, after some text: both shown
    tab.route_chat(fulfil_with(sse(delta(content="partial"), {"error": {"message": "generation failed: boom"}})))
    tab.ask("y")
    tab.wait_answered()
    assert tab.last_answer().locator(".error-text").text_content() == "Error: generation failed: boom"
    assert tab.last_answer().locator(".body").text_content() == "partial"
    assert tab.chats[-1][0]["messages"] == [{"role": "user", "content": "y"}]  # the failed question was dropped


def test_models_are_listed_loaded_first(tab):
    tab.page.route("**/v1/models", lambda route: route.fulfill(json={"object": "list", "data": [
        {"id": "big", "object": "model", "status": "available"},
        {"id": "small", "object": "model", "status": "loaded"},
        {"id": "plain", "object": "model"}]}))
    tab.open()
    options = tab.page.eval_on_selector("#model", "s => [...s.options].map(o => [o.value, o.textContent])")
    assert options == [["small", "small"], ["plain", "plain"], ["big", "big (available)"]]


def test_the_policy_blocks_other_origins_in_the_browser(tab):
    tab.open()
    violated = tab.page.evaluate("""() => new Promise(resolve => {
        document.addEventListener('securitypolicyviolation', e => resolve(e.effectiveDirective));
        fetch('http://192.0.2.1/x').catch(() => {}); })""")
    assert violated == "connect-src"
    assert not any("192.0.2.1" in u for u in tab.urls)  # blocked before any request left the page


def test_fits_a_phone_screen(tab):
    tab.page.set_viewport_size({"width": 360, "height": 740})
    tab.open()
    tab.route_chat(fulfil_with(sse(delta(content="```\n" + "x" * 400 + "\n```\n" + "word " * 200))))
    tab.ask("long")
    tab.wait_answered()
    assert tab.page.evaluate("document.documentElement.scrollWidth") <= 360
    for selector in ("#send", "#prompt", "#model", "#new-chat"):
        box = tab.page.locator(selector).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 360, selector


def test_api_key_is_asked_for_kept_for_the_tab_and_sent(browser, tiny_key_server):
    tab = Tab(browser, tiny_key_server.base).open(wait_for_models=False)
    try:
        assert httpx.get(tiny_key_server.base + "/").status_code == 200  # the page itself needs no key
        tab.page.wait_for_selector("#key-form", state="visible")
        assert tab.page.locator("#model option").count() == 0
        assert "API key" in tab.page.text_content("#key-message")  # the server's own words
        tab.page.fill("#api-key", "wrong")
        with tab.page.expect_response("**/v1/models") as listed:
            tab.page.click("#key-form button")
        assert listed.value.status == 401 and listed.value.request.headers["authorization"] == "Bearer wrong"
        assert tab.page.is_visible("#key-form") and tab.page.locator("#model option").count() == 0
        tab.page.fill("#api-key", "sekret")
        tab.page.click("#key-form button")
        tab.page.wait_for_function("() => document.querySelector('#model').options.length > 0")
        assert tab.page.is_hidden("#key-form")
        tab.settings(max_tokens=3)
        assert tab.page.evaluate("sessionStorage.getItem('edgeinfer.apiKey')") == "sekret"
        tab.ask("hi")
        assert re.fullmatch(r"\d+ tokens?.*", tab.wait_answered())  # answered: the usage chunk came
        assert tab.page.locator(".error-text").count() == 0
        assert tab.chats[-1][1]["authorization"] == "Bearer sekret"
    finally:
        tab.close()


@pytest.fixture
def tiny_key_server(tmp_path):
    from tiny_models import write_tiny_llama

    path = tmp_path / "tiny-llama.gguf"
    write_tiny_llama(path)
    s = Server(path, env={"EDGEINFER_API_KEY": "sekret"}).wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    """A random SmolVLM-shaped pair (tests/vision_zoo.py) served with its projector, and a test image."""
    import vision_zoo
    from PIL import Image

    d = tmp_path_factory.mktemp("chat_page_vision")
    text, proj = vision_zoo.write_pair("idefics3", d)
    Image.fromarray(vision_zoo.test_image(40, 60)).save(d / "cat.png")
    (d / "notes.txt").write_text("not an image")
    s = Server(text, "--mmproj", proj).wait_ready(timeout=120)
    s.folder = d
    yield s
    s.stop()


def test_an_image_attached_is_shown_and_sent(browser, vision_server):
    # the file picker (and a drop) add images above the message box; sent with the message as image_url parts,
    # shown in the conversation, kept in it for the next turn; a file that is not an image is refused on the page
    tab = Tab(browser, vision_server.base).open()
    try:
        tab.settings(max_tokens=3, temperature=0)
        tab.page.set_input_files("#image-file", str(vision_server.folder / "cat.png"))
        tab.page.wait_for_selector("#attachments .attachment img")
        # a drop of the same file, through the page's drop handler
        tab.page.evaluate("""() => {
            const b64 = document.querySelector('#attachments img').src.split(',')[1];  // (the policy: no fetch)
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const dt = new DataTransfer(); dt.items.add(new File([bytes], 'dropped.png', {type: 'image/png'}));
            document.querySelector('#composer').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true}));
        }""")
        tab.page.wait_for_function("() => document.querySelectorAll('#attachments .attachment').length === 2")
        tab.page.click("#attachments .attachment button")  # one removed again
        assert tab.page.locator("#attachments .attachment").count() == 1
        tab.ask("What is in the picture?")
        assert re.fullmatch(r"\d+ tokens?.*", tab.wait_answered())
        assert tab.page.locator(".turn.user img.thumb").count() == 1
        assert tab.page.locator("#attachments .attachment").count() == 0
        body, _ = tab.chats[-1]
        parts = body["messages"][0]["content"]
        assert parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
        assert parts[1] == {"type": "text", "text": "What is in the picture?"}
        tab.ask("And now?")
        tab.wait_answered()
        assert tab.chats[-1][0]["messages"][0]["content"] == parts  # the image stays in the conversation
        tab.page.set_input_files("#image-file", str(vision_server.folder / "notes.txt"))
        tab.page.wait_for_selector("#notice:not([hidden])")
        assert "not an image" in tab.page.text_content("#notice")
        assert tab.page.locator(".error-text").count() == 0 and tab.errors == []
    finally:
        tab.close()
