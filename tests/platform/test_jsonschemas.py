"""Clients' JSON Schemas are applied with patterns that match in linear time (`baton_platform.jsonschemas`).

Python's `re` needs about 2**n steps for `^(a+)+$` on n a's and a "!": the cases below, at 5,000
characters, would not finish in this universe. The module's timeout (pytest-timeout) is what fails
these tests if a pattern reaches a backtracking engine."""

from __future__ import annotations

import jsonschema
import pytest

from baton_platform import jsonschemas

pytestmark = pytest.mark.timeout(60)

EVIL = "^(a+)+$"
LONG = "a" * 5000 + "!"


def test_a_catastrophic_pattern_is_matched_in_linear_time_in_every_keyword_that_matches():
    for schema, instance, valid in (
        ({"type": "string", "pattern": EVIL}, LONG, False),
        ({"type": "object", "properties": {"x": {"pattern": EVIL}}}, {"x": LONG}, False),
        ({"type": "object", "patternProperties": {EVIL: {"type": "string"}}}, {LONG: 1}, True),  # no key matches
        ({"type": "object", "patternProperties": {EVIL: {}}, "additionalProperties": False}, {LONG: 1}, False),
    ):
        if valid:
            jsonschemas.validate(instance, schema)
        else:
            with pytest.raises(jsonschema.ValidationError):
                jsonschemas.validate(instance, schema)


def test_patterns_keep_their_meaning():
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-\\d+$"}},
              "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}
    jsonschemas.validate({"id": "AB-12", "x-count": 3}, schema)
    for bad, where in (({"id": "ab-12"}, ["id"]), ({"x-count": "3"}, ["x-count"]), ({"other": 1}, [])):
        with pytest.raises(jsonschema.ValidationError) as err:
            jsonschemas.validate(bad, schema)
        assert list(err.value.absolute_path) == where
    with pytest.raises(jsonschema.ValidationError, match="additional properties"):
        jsonschemas.validate({"other": 1}, schema)


def test_what_linear_time_matching_cannot_do_is_refused_naming_the_pattern():
    for schema, said in (
        ({"type": "string", "pattern": "(a)\\1"}, '"(a)\\\\1"'),  # a backreference, as JSON writes it
        ({"type": "string", "pattern": "^(?!x)"}, "(?!x)"),  # a lookahead
        ({"type": "object", "patternProperties": {"(?<=a)b": {}}}, "(?<=a)b"),
        ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties"),
        ({"type": 5}, "not a valid JSON Schema"),
    ):
        with pytest.raises(jsonschemas.SchemaRefused) as err:
            jsonschemas.check(schema)
        assert said in str(err.value)
    jsonschemas.check({"type": "object", "properties": {"pattern": {"type": "string"}}})  # a property so named
