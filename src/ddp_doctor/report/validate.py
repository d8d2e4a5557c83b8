"""Is this JSON a ddp-doctor document?  Checked against the schemas of :mod:`ddp_doctor.report`, with no
optional package: ``jsonschema`` is a test dependency, and a plain install must refuse a report whose
``findings`` is a string as clearly as a full one does (the renderers trust the schema's shapes).

Covers the JSON Schema keywords those schemas use (``type``, ``required``, ``properties``, ``items``,
``enum``, ``const``, ``pattern``, ``minimum``, ``oneOf``); the tests hold it to ``jsonschema``'s verdicts.
Iterative, so no input nests it into a RecursionError.
"""
from __future__ import annotations

import re
from typing import Any

from ddp_doctor.report import (CHECK_JSON_SCHEMA, CHECK_SCHEMA_ID, LINT_JSON_SCHEMA, LINT_SCHEMA_ID,
                               REPORT_JSON_SCHEMA, REPORT_SCHEMA_ID)

KNOWN = (REPORT_SCHEMA_ID, LINT_SCHEMA_ID, CHECK_SCHEMA_ID)


def _is(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    return True


def _show(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 60 else s[:57] + "..."


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1.0 is 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def _own_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """The first way ``value`` breaks ``schema``'s own keywords (not those of its members)."""
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_is(value, k) for k in kinds):
            return f"{_show(value)} is not of type {' or '.join(map(repr, kinds))}"
    if "const" in schema and not _equal(value, schema["const"]):
        return f"{schema['const']!r} was expected, not {_show(value)}"
    if "enum" in schema and not any(_equal(value, e) for e in schema["enum"]):
        return f"{_show(value)} is not one of {schema['enum']!r}"
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        return f"{_show(value)} does not match {schema['pattern']!r}"
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        return f"{_show(value)} is less than the minimum of {schema['minimum']!r}"
    if isinstance(value, dict):
        for k in schema.get("required") or ():
            if k not in value:
                return f"{k!r} is a required property"
    if "oneOf" in schema:
        fits = sum(1 for sub in schema["oneOf"] if not problems(value, sub, limit=1))
        if fits != 1:
            return f"{_show(value)} is not valid under {'any' if not fits else 'more than one'} of the given schemas"
    return None


def problems(data: Any, schema: dict[str, Any], limit: int = 10) -> list[str]:
    """Up to ``limit`` problems, ``"path/to/field: what is wrong"``, in document order (empty: it conforms)."""
    out: list[str] = []
    todo: list[tuple[Any, dict[str, Any], tuple]] = [(data, schema, ())]
    while todo and len(out) < limit:
        value, sch, path = todo.pop()
        bad = _own_problem(value, sch)
        if bad is not None:
            out.append(f"{'/'.join(map(str, path)) or '(top level)'}: {bad}")
            continue
        kids: list[tuple[Any, dict[str, Any], tuple]] = []
        if isinstance(value, dict):
            for k, sub in (sch.get("properties") or {}).items():
                if k in value:
                    kids.append((value[k], sub, path + (k,)))
        elif isinstance(value, list) and isinstance(sch.get("items"), dict):
            kids = [(v, sch["items"], path + (i,)) for i, v in enumerate(value)]
        todo.extend(reversed(kids))
    return out


def schema_for(data: dict[str, Any]) -> dict[str, Any]:
    kind = data.get("schema")
    if not isinstance(kind, str):
        return REPORT_JSON_SCHEMA
    return {LINT_SCHEMA_ID: LINT_JSON_SCHEMA, CHECK_SCHEMA_ID: CHECK_JSON_SCHEMA}.get(kind, REPORT_JSON_SCHEMA)


def validate(data: Any, limit: int = 10) -> list[str]:
    """Problems that make ``data`` not a ddp-doctor report, lint or check document (empty when it is one)."""
    if not isinstance(data, dict):
        return [f"(top level): {_show(data)} is not a JSON object"]
    if "schema" in data and data["schema"] not in KNOWN:
        return [f"schema: {_show(data['schema'])} is not one of {list(KNOWN)!r}"]
    return problems(data, schema_for(data), limit)
