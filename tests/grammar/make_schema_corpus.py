#!/usr/bin/env python3
"""Writes the grammar engine's JSON-schema corpus: one JSON line {"name", "schema"} per schema.

Deterministic (a fixed seed), at least 200 schemas, covering what request schemas use: flat and
nested objects, required and optional properties, additionalProperties: false, arrays with
minItems/maxItems, enums and consts, anyOf and oneOf, $ref/$defs, string patterns, formats and
lengths, bounded numbers and integers. Every construct is one the engine enforces (the constructs it
rejects, e.g. uniqueItems or multipleOf on numbers, are left out on purpose).

    python3 tests/grammar/make_schema_corpus.py OUT.jsonl
"""
import json
import random
import sys

FORMATS = ["date", "time", "date-time", "email", "uuid", "ipv4", "ipv6", "hostname"]
PATTERNS = [r"^[A-Z]{3}-[0-9]{4}$", r"^[a-z]+(_[a-z]+)*$", r"^\+?[0-9]{7,12}$", r"^#[0-9a-f]{6}$",
            r"^v[0-9]+\.[0-9]+\.[0-9]+$", r"^[A-Za-z0-9]{8}$"]
WORDS = ["name", "id", "title", "count", "price", "tags", "owner", "status", "created", "email",
         "score", "items", "city", "zip", "active", "notes", "level", "kind", "rate", "label"]


def scalar(rng, depth=0):
    """A random leaf schema."""
    kind = rng.choice(["string", "integer", "number", "boolean", "null", "enum", "bounded_int",
                       "bounded_num", "pattern", "format", "length", "const"])
    if kind in ("string", "integer", "number", "boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return rng.choice([{"type": "string", "enum": rng.sample(["red", "green", "blue", "cyan",
                                                                   "a b", "x\"y"], 3)},
                           {"enum": [1, 2, 3, "many", None]},
                           {"type": "integer", "enum": [10, 20, 30]}])
    if kind == "bounded_int":
        low = rng.randint(-100, 100)
        schema = {"type": "integer", "minimum": low, "maximum": low + rng.randint(1, 500)}
        if rng.random() < 0.3:
            schema = {"type": "integer", "minimum": 0, "maximum": 1000, "multipleOf": rng.choice([2, 5, 10])}
        return schema
    if kind == "bounded_num":
        return rng.choice([{"type": "number", "minimum": 0, "maximum": 1},
                           {"type": "number", "exclusiveMinimum": -5.5, "exclusiveMaximum": 5.5},
                           {"type": "number", "minimum": 100}])
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind == "format":
        return {"type": "string", "format": rng.choice(FORMATS)}
    if kind == "length":
        low = rng.randint(0, 5)
        return {"type": "string", "minLength": low, "maxLength": low + rng.randint(0, 10)}
    return {"const": rng.choice(["fixed", 7, True])}


def obj(rng, depth, strict=None):
    names = rng.sample(WORDS, rng.randint(1, 5))
    properties = {}
    for name in names:
        if depth < 2 and rng.random() < 0.25:
            properties[name] = obj(rng, depth + 1)
        elif depth < 2 and rng.random() < 0.2:
            properties[name] = array(rng, depth + 1)
        else:
            properties[name] = scalar(rng)
    schema = {"type": "object", "properties": properties,
              "required": sorted(rng.sample(names, rng.randint(0, len(names))))}
    if strict if strict is not None else rng.random() < 0.5:
        schema["additionalProperties"] = False
    return schema


def array(rng, depth):
    low = rng.randint(0, 3)
    items = obj(rng, depth + 1) if depth < 2 and rng.random() < 0.3 else scalar(rng)
    schema = {"type": "array", "items": items, "minItems": low}
    if rng.random() < 0.8:
        schema["maxItems"] = low + rng.randint(0, 4)
    return schema


def any_of(rng):
    options = rng.sample([{"type": "string", "maxLength": 12}, {"type": "integer"}, {"type": "null"},
                          {"type": "boolean"}, obj(rng, 2)], rng.randint(2, 3))
    return {"type": "object", "properties": {"value": {"anyOf": options}}, "required": ["value"]}


def one_of(rng):
    # Branches told apart by a const discriminator, so exactly one can match.
    kinds = rng.sample(["circle", "square", "triangle", "hexagon"], rng.randint(2, 3))
    branches = []
    for kind in kinds:
        branch = obj(rng, 2, strict=True)
        branch["properties"]["kind"] = {"const": kind}
        branch["required"] = sorted(set(branch["required"]) | {"kind"})
        branches.append(branch)
    return {"oneOf": branches}


def with_refs(rng):
    defs = {"address": {"type": "object", "properties": {
                "street": {"type": "string", "maxLength": 30}, "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": r"^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False},
            "person": {"type": "object", "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 20},
                "email": {"type": "string", "format": "email"},
                "home": {"$ref": "#/$defs/address"}}, "required": ["name", "home"]},
            "node": {"type": "object", "properties": {
                "label": {"type": "string", "maxLength": 8},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                "required": ["label"], "additionalProperties": False}}
    root = rng.choice([
        {"$ref": "#/$defs/person"},
        {"type": "object", "properties": {"people": {"type": "array", "items": {"$ref": "#/$defs/person"},
                                                      "minItems": 1, "maxItems": 2}}, "required": ["people"]},
        {"type": "object", "properties": {"from": {"$ref": "#/$defs/address"}, "to": {"$ref": "#/$defs/address"}},
         "required": ["from", "to"], "additionalProperties": False},
        {"$ref": "#/$defs/node"},
    ])
    return dict(root, **{"$defs": defs})


def top_level_array(rng):
    return array(rng, 0)


def corpus(count=240, seed=20240501):
    rng = random.Random(seed)
    makers = [("object", lambda: obj(rng, 0)), ("nested", lambda: obj(rng, 1)),
              ("array", lambda: top_level_array(rng)), ("any_of", lambda: any_of(rng)),
              ("one_of", lambda: one_of(rng)), ("refs", lambda: with_refs(rng)),
              ("strings", lambda: {"type": "object", "properties": {w: scalar(rng) for w in rng.sample(WORDS, 3)},
                                   "required": [], "additionalProperties": False})]
    out = []
    for i in range(count):
        kind, make = makers[i % len(makers)]
        out.append({"name": f"{i:03d}_{kind}", "schema": make()})
    # Every format and pattern appears at least once, required.
    for fmt in FORMATS:
        out.append({"name": f"format_{fmt}", "schema": {"type": "object", "properties": {
            "value": {"type": "string", "format": fmt}}, "required": ["value"], "additionalProperties": False}})
    for i, pattern in enumerate(PATTERNS):
        out.append({"name": f"pattern_{i}", "schema": {"type": "object", "properties": {
            "value": {"type": "string", "pattern": pattern}}, "required": ["value"]}})
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_schema_corpus.py OUT.jsonl")
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        for entry in corpus():
            f.write(json.dumps(entry, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
