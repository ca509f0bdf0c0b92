"""Clients' JSON Schemas (`response_format`), checked and applied with regular expressions that run in
linear time.

A schema's `pattern` is the client's code: Python's backtracking `re` takes exponential time on
patterns such as `^(a+)+$` (36 characters of input: about 40 minutes), and validation runs on a
service's event loop. Here every pattern a schema holds (`pattern`, the keys of `patternProperties`,
which `additionalProperties` consults too) is compiled by RE2, whose matching time is linear in the
input. RE2 has no lookaround and no backreferences: a schema that uses them is refused with its
pattern named, at the gateway, before anything is spent. `unevaluatedProperties`, which would match
patterns the same way through every subschema, is refused too.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import re2
from jsonschema import ValidationError, validators
from jsonschema.exceptions import best_match

UNSUPPORTED = ("unevaluatedProperties",)


class SchemaRefused(ValueError):
    """A schema Baton will not apply, with the reason in the client's terms."""


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str):
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        reason = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        # Shown as the client's JSON writes it.
        raise SchemaRefused(f"pattern {json.dumps(pattern[:200])} is not supported: patterns are matched in linear "
                            f"time, without lookaround or backreferences ({reason})") from None


def _walk(node: Any) -> Iterator[dict]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def check(schema: dict) -> None:
    """Raises `SchemaRefused` unless `schema` is a valid JSON Schema (2020-12) Baton can apply."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise SchemaRefused(f"not a valid JSON Schema: {e.message}") from None
    for node in _walk(schema):
        for keyword in UNSUPPORTED:
            if keyword in node:
                raise SchemaRefused(f"{keyword} is not supported")
        if isinstance(node.get("pattern"), str):
            _compiled(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            for pattern in node["patternProperties"]:
                _compiled(pattern)


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield ValidationError(f"{instance[:80]!r} does not match {pattern[:80]!r}")


def _pattern_properties(validator, patterns, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _compiled(pattern).search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    named, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = [k for k in instance if k not in named and not any(_compiled(p).search(k) for p in patterns)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        yield ValidationError(f"additional properties are not allowed ({', '.join(map(repr, sorted(extras)))})")


_Validator = validators.extend(jsonschema.Draft202012Validator, {
    "pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties})


def validate(instance: Any, schema: dict) -> None:
    """Raises `SchemaRefused` for a schema Baton does not apply, `jsonschema.ValidationError` (the first
    error) when `instance` does not match it."""
    check(schema)
    error = best_match(_Validator(schema).iter_errors(instance))
    if error is not None:
        raise error
