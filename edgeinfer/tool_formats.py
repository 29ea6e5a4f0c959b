"""Tool-call formats per model family: which one a model writes (chosen from its chat template and its
vocabulary), how the calls of each are read, and the grammar that forces one (tool_choice "required" or a
named function) in the model's own form.

    format        families                               a call as the model writes it
    hermes        Qwen2.5, Qwen3, Hermes, SmolLM3, LFM2,  <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>
                  Granite, any other (the fallback)
    llama3        Llama 3.1 - 3.3                         {"name": "f", "parameters": {...}}, or after <|python_tag|>
                                                          the same, or a built-in tool's f.call(query="...")
    mistral       Mistral 7B v0.3, Mistral Nemo           [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "..."}]
    mistral_args  Mistral Small 3.2, Devstral, Ministral  [TOOL_CALLS]f[ARGS]{...} (or f[CALL_ID]id[ARGS]{...})
                  3, Magistral
    qwen3_coder   Qwen3-Coder, Qwen3.5, Qwen3-Next        <tool_call>\\n<function=f>\\n<parameter=k>\\nv\\n</parameter>\\n
                                                          </function>\\n</tool_call> (the opening tag may be missing)
    harmony       gpt-oss                                 <|channel|>commentary to=functions.f <|constrain|>json
                                                          <|message|>{...}<|call|> (read by edgeinfer.harmony)
    gemma4        Gemma 4                                 <|tool_call>call:f{k:<|"|>v<|"|>}<tool_call|>

A reply is read for every one of these forms, whatever the model (a small model may write another family's
form, as llama.cpp's generic parser allows); a block that is not a well-formed call of a given tool stays
text, so nothing the model wrote is lost. The format decides the rest: whether the reply's text keeps the
control tokens its calls start with ([TOOL_CALLS], <|python_tag|>: `special_text`), the form of new call
ids (Mistral's templates take only nine letters and digits), and the grammar of a forced call.

`read_block` reads one block at the start of a text (edgeinfer.tools' scanner finds the openers, `OPENERS`).
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
from dataclasses import dataclass, field
from functools import lru_cache

from .harmony import is_harmony
from .structured import JSON_DEFAULTS, close_objects

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN = "<function="  # Qwen3-Coder's call, where a model leaves out its <tool_call>
TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
PYTHON_TAG = "<|python_tag|>"
OPENERS = (HERMES_OPEN, FUNCTION_OPEN, TOOL_CALLS, PYTHON_TAG)  # (and Gemma 4's, in edgeinfer.tools)

_PARAM = re.compile(r"<parameter=([^>\n]{1,128})>\n?")
_FUNC = re.compile(r"<function=([A-Za-z0-9_.-]{1,64})>\n?")
_MISTRAL_NAME = re.compile(r"\s*([A-Za-z0-9_.-]{1,64})(?:\[CALL_ID\]([A-Za-z0-9_-]{1,64}))?\[ARGS\]")
_ID_CHARS = string.ascii_letters + string.digits
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolFormat:
    name: str
    special_text: bool = False  # the reply's text keeps control tokens (its calls start with one)
    short_ids: bool = False  # new call ids are nine letters and digits (Mistral's templates check them)
    tokens: dict = field(default_factory=dict, compare=False)  # control tokens of its calls: text -> id

    def call_id(self) -> str:
        if self.short_ids:
            return "".join(secrets.choice(_ID_CHARS) for _ in range(9))
        return "call_" + secrets.token_hex(12)

    def token(self, text: str) -> str:
        """A grammar's reference to a control token (llguidance's <[id]>), or the text as a literal where the
        vocabulary has no such token."""
        i = self.tokens.get(text)
        return f"<[{i}]>" if i is not None else json.dumps(text)


HERMES = ToolFormat("hermes")


def detect(template: str | None, special: dict | None = None) -> ToolFormat:
    """The format a model writes its calls in, from its chat template's text (how it writes past calls back)
    and its control tokens (text -> id)."""
    t, special = template or "", special or {}
    mine = lambda *names: {n: special[n] for n in names if n in special}  # noqa: E731
    if is_harmony(t):
        return ToolFormat("harmony", True, tokens=mine("<|channel|>", "<|constrain|>", "<|message|>"))
    if "<|tool_call>" in t:
        return ToolFormat("gemma4")
    if TOOL_CALLS in t:
        args = ARGS in t
        return ToolFormat("mistral_args" if args else "mistral", TOOL_CALLS in special, True,
                          mine(TOOL_CALLS, ARGS, CALL_ID))
    if "<function=" in t and "<parameter=" in t:
        return ToolFormat("qwen3_coder")
    if PYTHON_TAG in t or ('"parameters"' in t and "<|eot_id|>" in t):
        return ToolFormat("llama3", PYTHON_TAG in special, tokens=mine(PYTHON_TAG))
    return HERMES


@lru_cache(maxsize=32)
def _detect_cached(template: str | None, special: tuple) -> ToolFormat:
    return detect(template, dict(special))


def for_model(llm) -> ToolFormat:
    """The format of a loaded model (edgeinfer.LLM), chosen once per template and vocabulary."""
    special = getattr(llm.tokenizer, "_special_text", {})
    wanted = (TOOL_CALLS, ARGS, CALL_ID, PYTHON_TAG, "<|channel|>", "<|constrain|>", "<|message|>")
    return _detect_cached(llm.chat_template.source, tuple((k, special[k]) for k in wanted if k in special))


# -- reading ----------------------------------------------------------------------------------


def read_block(buf: str, opener: str, tools: dict, final: bool):
    """One block at the start of buf, which starts with `opener`: None where more text may change what it
    is (never when final), else (end, calls): calls a list of (name, arguments dict, id or None), or None
    where buf[:end] is not a well-formed call of the given tools (it stays text)."""
    if opener == HERMES_OPEN or opener == FUNCTION_OPEN:
        end = buf.find(HERMES_CLOSE) if opener == HERMES_OPEN else buf.find("</function>")
        again = buf.find(opener, len(opener))
        if 0 <= again and (end < 0 or again < end):  # another opens before this one closes: this one is text
            return len(opener), None
        if end < 0:
            return (len(opener), None) if final else None  # never closed: the opener is text, the rest read on
        if opener == HERMES_OPEN:
            body, end = buf[len(HERMES_OPEN):end].strip(), end + len(HERMES_CLOSE)
        else:
            body, end = buf[:end + len("</function>")], end + len("</function>")
            m = re.match(r"\s*</tool_call>", buf[end:])
            if m is None and not final and HERMES_CLOSE.startswith(buf[end:].lstrip()[:len(HERMES_CLOSE)]):
                return None  # its </tool_call> may follow
            end += m.end() if m else 0
        call = _xml_call(body, tools) if body.startswith(FUNCTION_OPEN) else _json_call(body, tools)
        return end, [call] if call else None
    if opener == TOOL_CALLS:
        return _mistral(buf, tools, final)
    if opener == PYTHON_TAG:  # the rest of the reply (it ends the turn)
        if not final:
            return None
        calls = json_calls(buf[len(PYTHON_TAG):], tools) or _builtin_call(buf[len(PYTHON_TAG):], tools)
        return (len(buf), calls) if calls else (len(PYTHON_TAG), None)
    raise ValueError(opener)


def _json_call(body: str, tools: dict):
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return _call_object(obj, tools)


def _call_object(obj, tools: dict, args_keys=("arguments", "parameters")):
    if not isinstance(obj, dict) or obj.get("name") not in tools:
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    cid = obj.get("id")
    return obj["name"], args, cid if isinstance(cid, str) and cid else None


def json_calls(text: str, tools: dict):
    """A text that is nothing but call objects (Llama 3's {"name": ..., "parameters": ...}, or Hermes' keys),
    one or more, apart by blanks or ';': their calls, else None."""
    calls, pos, text = [], 0, text.strip()
    while pos < len(text):
        try:
            obj, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        call = _call_object(obj, tools)
        if call is None:
            return None
        calls.append(call)
        while pos < len(text) and text[pos] in " \t\r\n;":
            pos += 1
    return calls or None


def _builtin_call(text: str, tools: dict):
    # Llama 3.1's built-in tools after <|python_tag|>: brave_search.call(query="...")
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "call"
            and isinstance(node.func.value, ast.Name) and node.func.value.id in tools and not node.args):
        return None
    try:
        args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    except (ValueError, SyntaxError):
        return None
    return [(node.func.value.id, args, None)] if len(args) == len(node.keywords) else None


def _xml_call(body: str, tools: dict):
    # <function=NAME>\n<parameter=K>\nV\n</parameter>...</function>; V typed by the tool's schema
    m = _FUNC.match(body)
    if not m or m.group(1) not in tools or not body.rstrip().endswith("</function>"):
        return None
    props = _properties(tools[m.group(1)].parameters)
    inner, args, pos = body.rstrip()[m.end():-len("</function>")], {}, 0
    while True:
        while pos < len(inner) and inner[pos] in " \t\r\n":
            pos += 1
        if pos == len(inner):
            break
        p = _PARAM.match(inner, pos)
        end = inner.find("</parameter>", pos) if p else -1
        if p is None or end < 0:
            return None
        raw = inner[p.end():end]
        raw = raw[:-1] if raw.endswith("\n") else raw
        args[p.group(1)] = _xml_value(raw, props.get(p.group(1)))
        pos = end + len("</parameter>")
    return m.group(1), args, None


def _properties(parameters) -> dict:
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    return props if isinstance(props, dict) else {}


def _xml_value(raw: str, schema):
    # a string parameter is its text as it is; any other value is JSON, or its text where it is not
    kinds = schema.get("type") if isinstance(schema, dict) else None
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds and len(kinds) == 1:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


_NAME_CHARS = re.compile(r"[A-Za-z0-9_.-]{0,64}")
_ID_RUN = re.compile(r"[A-Za-z0-9_-]{0,64}")


def _may_become_name_call(s: str) -> bool:
    # is s a prefix of "NAME[ARGS]" or "NAME[CALL_ID]ID[ARGS]" (blanks first)? In one pass: no backtracking
    s = s.lstrip()
    rest = s[_NAME_CHARS.match(s).end():]
    if rest.startswith(CALL_ID):
        rest = rest[len(CALL_ID):]
        rest = rest[_ID_RUN.match(rest).end():]
        return ARGS.startswith(rest)
    return ARGS.startswith(rest) or CALL_ID.startswith(rest)


def _mistral(buf: str, tools: dict, final: bool):
    pos = len(TOOL_CALLS)
    rest = buf[pos:].lstrip()
    if not rest:
        return (pos, None) if final else None
    if rest[0] == "[":  # [{"name": ..., "arguments": ..., "id": ...}, ...]
        start = len(buf) - len(rest)
        try:
            arr, end = _DECODER.raw_decode(buf, start)
        except ValueError:
            return (pos, None) if final else None
        calls = [_call_object(o, tools) for o in arr] if isinstance(arr, list) and arr else [None]
        return end, None if None in calls else calls
    m = _MISTRAL_NAME.match(buf, pos)
    if m is None:
        if not final and _may_become_name_call(buf[pos:]):
            return None  # the name or its [CALL_ID] / [ARGS] may still be coming
        return pos, None
    at = m.end()
    while at < len(buf) and buf[at] in " \t\r\n":
        at += 1
    try:
        args, end = _DECODER.raw_decode(buf, at)
    except ValueError:
        return (pos, None) if final else None
    if m.group(1) not in tools or not isinstance(args, dict):
        return end, None
    return end, [(m.group(1), args, m.group(2))]


# -- forcing a call ---------------------------------------------------------------------------


def grammar(fmt: ToolFormat, chosen: list, parallel: bool) -> str | None:
    """A Lark grammar (llguidance's) for a reply that is nothing but calls of the chosen tools in the model's
    form; None for the formats whose forced form is Hermes' (edgeinfer.tools writes that one)."""
    if fmt.name == "llama3":
        body = _one_of([_schema(t, "parameters") for t in chosen])
        start = 'start: call ("; " call)*' if parallel else "start: call"
        return f"{start}\ncall: %json {json.dumps(body, ensure_ascii=False)}\n"
    if fmt.name == "mistral":
        body = _one_of([_schema(t, "arguments") for t in chosen])
        calls = 'call (", " call)*' if parallel else "call"
        return (f'start: {fmt.token(TOOL_CALLS)} "[" {calls} "]"\n'
                f"call: %json {json.dumps(body, ensure_ascii=False)}\n")
    if fmt.name == "mistral_args":
        rules = [f'start: call{"+" if parallel else ""}', "call: " + " | ".join(f"c{i}" for i in range(len(chosen)))]
        for i, t in enumerate(chosen):
            rules.append(f"c{i}: {fmt.token(TOOL_CALLS)} {json.dumps(t.name)} {fmt.token(ARGS)} a{i}")
            rules.append(f"a{i}: %json {json.dumps(_args(t), ensure_ascii=False)}")
        return "\n".join(rules) + "\n"
    if fmt.name == "qwen3_coder":
        rules = ['start: call ("\\n" call)*' if parallel else "start: call",
                 'call: "<tool_call>\\n" (' + " | ".join(f"f{i}" for i in range(len(chosen))) + ') "</tool_call>"']
        for i, t in enumerate(chosen):
            props = _properties(t.parameters)
            required = t.parameters.get("required") if isinstance(t.parameters, dict) else None
            required = set(required) if isinstance(required, list) else set()
            parts = []
            for j, (k, sub) in enumerate(props.items()):
                sub = sub if isinstance(sub, dict) else {}
                if sub.get("type") == "string":  # its text and "\n</parameter>", the first one in it
                    n = sub.get("maxLength")
                    rules.append(f'p{i}_{j}: {_lit(f"<parameter={k}>" + NL)} V{i}_{j} "\\n"')
                    rules.append(f"V{i}_{j}: /(.|\\n)" + (f"{{0,{int(n)}}}" if n else "*") + r"\n<\/parameter>/"
                                 + r" & ~/(.|\n)*\n<\/parameter>(.|\n)+/")
                else:
                    rules.append(f'p{i}_{j}: {_lit(f"<parameter={k}>" + NL)} v{i}_{j} "\\n</parameter>\\n"')
                    value = {"x-guidance": JSON_DEFAULTS, **close_objects(sub)}
                    rules.append(f"v{i}_{j}: %json {json.dumps(value, ensure_ascii=False)}")
                parts.append(f"p{i}_{j}" + ("" if k in required else "?"))
            rules.append(f'f{i}: "<function={t.name}>\\n" {" ".join(parts)} "</function>\\n"')
        return "\n".join(rules) + "\n"
    if fmt.name == "harmony":
        alts = " | ".join(f"c{i}" for i in range(len(chosen)))
        rules = [f"start: {alts}"]
        for i, t in enumerate(chosen):
            rules.append(f'c{i}: {fmt.token("<|channel|>")} "commentary to=functions.{t.name} " '
                         f'{fmt.token("<|constrain|>")} "json" {fmt.token("<|message|>")} a{i}')
            rules.append(f"a{i}: %json {json.dumps(_args(t), ensure_ascii=False)}")
        return "\n".join(rules) + "\n"
    return None


NL = "\n"


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _args(tool) -> dict:
    return {"x-guidance": JSON_DEFAULTS, **close_objects(tool.parameters)}


def _schema(tool, key: str) -> dict:
    return {"type": "object", "properties": {"name": {"const": tool.name}, key: close_objects(tool.parameters)},
            "required": ["name", key], "additionalProperties": False}


def _one_of(alts: list) -> dict:
    return {"x-guidance": JSON_DEFAULTS, "anyOf": alts} if len(alts) > 1 else {"x-guidance": JSON_DEFAULTS, **alts[0]}
