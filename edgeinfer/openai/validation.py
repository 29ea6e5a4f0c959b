"""Validating a request body against its route's schema (openai.schemas) with messages that name the field:
SchemaError's param is the field's dotted path, its message says how the value breaks the schema (protocol
turns it into a 400)."""

from __future__ import annotations

import functools
import json
from typing import Any

from .schemas import PATHS, REQUESTS


@functools.lru_cache(maxsize=None)
def _validator(kind: str):
    import jsonschema_rs  # compiled (Rust): a million token ids validate in tens of milliseconds

    return jsonschema_rs.validator_for(REQUESTS[kind])


class SchemaError(ValueError):
    """A request body that breaks its schema: `param` names the field (a dotted path), the message says how."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param


def _param(path) -> str | None:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), type(v).__name__)


def _short(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _message(keyword: str, s: dict, instance: Any, param: str | None) -> str:
    """A message for a value that breaks `keyword` of its schema `s`, naming the field."""
    name = f"'{param}'" if param else "the request body"
    if keyword == "required":
        where = f" in {name}" if param else ""
        return f"'{_missing(s, instance)}' is required{where}"
    if "x-error" in s and keyword in ("anyOf", "oneOf"):
        return f"{name} {s['x-error']}"
    if keyword == "type":
        want = s["type"] if isinstance(s["type"], str) else " or ".join(t for t in s["type"])
        return f"{name} must be {'an' if want[0] in 'aeiou' else 'a'} {want}, got {_json_type(instance)}"
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        lo = s.get("minimum", s.get("exclusiveMinimum"))
        hi = s.get("maximum", s.get("exclusiveMaximum"))
        if "exclusiveMinimum" in s:
            return f"{name} must be greater than {lo} and at most {hi}, got {_short(instance)}"
        if hi is None:
            return f"{name} must be at least {lo}, got {_short(instance)}"
        if lo == hi:
            return f"{name} must be {lo}, got {_short(instance)}"
        return f"{name} must be between {lo} and {hi}, got {_short(instance)}"
    if keyword in ("enum", "const"):
        allowed = s.get("enum", [s.get("const")])
        return f"{name} must be one of {', '.join(json.dumps(a) for a in allowed)}, got {_short(instance)}"
    if keyword == "minItems":
        return f"{name} must be a non-empty array" if s["minItems"] == 1 else \
            f"{name} needs at least {s['minItems']} items"
    if keyword == "maxItems":
        return f"{name} has {len(instance)} items; at most {s['maxItems']} are allowed"
    if keyword == "minLength":
        return f"{name} must not be empty"
    if keyword == "maxLength":
        return f"{name} is {len(instance):,} characters long; at most {s['maxLength']} are allowed"
    if keyword == "pattern":
        return f"{name} must match {s['pattern']}, got {_short(instance)}"
    return f"{name} has the wrong form: {_short(instance)}"


def _missing(s: dict, instance: Any) -> str:
    return next((k for k in s.get("required", ()) if not isinstance(instance, dict) or k not in instance), "?")


def validate(kind: str, body: Any) -> None:
    """Raise SchemaError for the first way `body` breaks the request schema of `kind`."""
    if not isinstance(body, dict):
        raise SchemaError(None, f"the request body must be a JSON object, got {_json_type(body)}")
    v = _validator(kind)
    if v.is_valid(body):
        return
    err = next(iter(v.iter_errors(body)))
    *where, keyword = list(err.schema_path)
    s = REQUESTS[kind]
    for step in where:  # the subschema holding the keyword that failed
        s = s[step]
    path = list(err.instance_path)
    if keyword == "additionalProperties":  # the field named is the first one the schema does not know
        obj = body
        for step in path:
            obj = obj[step]
        key = next(k for k in obj if k not in s.get("properties", {}))[:64]
        where = f"'{_param(path)}'" if path else PATHS[kind]
        raise SchemaError(_param(path + [key]), f"unknown field '{_param(path + [key])}': {where} has no such field "
                                                "(the fields it takes are in /openapi.json)")
    message = _message(keyword, s, err.instance, _param(path))
    if keyword == "required":  # the field named is the one missing
        path.append(_missing(s, err.instance))
    raise SchemaError(_param(path), message)
