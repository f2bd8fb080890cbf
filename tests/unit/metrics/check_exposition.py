#!/usr/bin/env python3
"""Parses a text-format 0.0.4 exposition with prometheus_client's parser and checks it against
expectations given as JSON: {"families": {name: type}, "samples": [[name, {labels}, value], ...]}.
Exit 0: parsed and matched; 1: mismatch or parse error; 77: prometheus_client is not installed."""
import json
import math
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    sys.exit(77)


def main() -> int:
    text = open(sys.argv[1], encoding="utf-8").read()
    expected = json.load(open(sys.argv[2], encoding="utf-8"))
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError (and others) on malformed input
        print(f"parse error: {e!r}")
        return 1
    by_name = {f.name: f for f in families}
    ok = True
    for name, typ in expected["families"].items():
        fam = by_name.get(name)
        if fam is None:
            print(f"missing family {name}; have {sorted(by_name)}")
            ok = False
        elif fam.type != typ:
            print(f"family {name}: type {fam.type}, expected {typ}")
            ok = False
    samples = {}
    for fam in families:
        if fam.type == "unknown" or fam.type == "untyped":
            print(f"family {fam.name} parsed as {fam.type}: its TYPE line did not match its samples")
            ok = False
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    for name, labels, value in expected["samples"]:
        key = (name, tuple(sorted(labels.items())))
        if key not in samples:
            print(f"missing sample {name}{labels}")
            ok = False
            continue
        got = samples[key]
        want = float(value) if not isinstance(value, str) else float(value.replace("Inf", "inf"))
        if not (got == want or (math.isnan(got) and math.isnan(want)) or abs(got - want) <= 1e-9 * max(1, abs(want))):
            print(f"sample {name}{labels}: {got}, expected {want}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
