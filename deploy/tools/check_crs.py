#!/usr/bin/env python3
"""kubernetes-validate has schemas for built-in kinds only. This checks the custom resources the
manifests use (PodMonitor, PrometheusRule, InferencePool, InferenceObjective) against schemas of the
fields Tessera sets, written from the projects' API references: required fields present, types right,
no unknown field in spec (strict). Each rule's PromQL is also parsed by promtool.
  usage: check_crs.py RENDERED.yaml"""
import json
import os
import subprocess
import sys
import tempfile

import jsonschema
import yaml

S = {"type": "string", "minLength": 1}
I = {"type": "integer"}
SELECTOR = {"type": "object", "additionalProperties": False, "required": ["matchLabels"],
            "properties": {"matchLabels": {"type": "object", "additionalProperties": S, "minProperties": 1}}}


def obj(required, props):
    return {"type": "object", "additionalProperties": False, "required": required, "properties": props}


SCHEMAS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): obj(["selector", "podMetricsEndpoints"], {
        "selector": SELECTOR,
        "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": obj(["port"], {
            "port": S, "path": S, "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
            "scheme": {"enum": ["http", "https"]}})}}),
    ("monitoring.coreos.com/v1", "PrometheusRule"): obj(["groups"], {
        "groups": {"type": "array", "minItems": 1, "items": obj(["name", "rules"], {
            "name": S, "interval": S,
            "rules": {"type": "array", "minItems": 1, "items": obj(["expr"], {
                "alert": S, "record": S, "expr": S, "for": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                "labels": {"type": "object", "additionalProperties": S},
                "annotations": {"type": "object", "additionalProperties": S}})}})}}),
    ("inference.networking.k8s.io/v1", "InferencePool"): obj(["selector", "targetPorts", "endpointPickerRef"], {
        "selector": SELECTOR,
        "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8,
                        "items": obj(["number"], {"number": {"type": "integer", "minimum": 1, "maximum": 65535}})},
        "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
        "endpointPickerRef": obj(["name", "port"], {
            "group": {"type": "string"}, "kind": S, "name": S,
            "port": obj(["number"], {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}),
            "failureMode": {"enum": ["FailOpen", "FailClose"]}})}),
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"): obj(["poolRef"], {
        "priority": I,
        "poolRef": obj(["name"], {"group": S, "kind": {"enum": ["InferencePool"]}, "name": S})}),
}


def main():
    docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    checked, problems = [], []
    for d in docs:
        key = (d["apiVersion"], d["kind"])
        if key not in SCHEMAS:
            continue
        meta_ok = set(d) <= {"apiVersion", "kind", "metadata", "spec"}
        try:
            jsonschema.validate(d["spec"], SCHEMAS[key])
        except jsonschema.ValidationError as e:
            problems.append(f"{d['kind']}/{d['metadata']['name']}: {e.message} at spec.{'.'.join(map(str, e.path))}")
        if not meta_ok:
            problems.append(f"{d['kind']}: unknown top-level fields {set(d) - {'apiVersion', 'kind', 'metadata', 'spec'}}")
        checked.append(d["kind"])
        if d["kind"] == "InferenceObjective" and ("InferencePool", d["spec"]["poolRef"]["name"]) not in names:
            problems.append(f"InferenceObjective poolRef {d['spec']['poolRef']['name']} is not in the manifests")
        if d["kind"] == "PrometheusRule":
            with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
                yaml.safe_dump({"groups": d["spec"]["groups"]}, f)
            r = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
            os.unlink(f.name)
            if r.returncode != 0:
                problems.append("PrometheusRule: promtool: " + r.stdout + r.stderr)
    for p in problems:
        print("FAIL " + p)
    print(f"custom resources checked against their API fields (strict): {', '.join(checked)}: "
          f"{len(checked) - len(problems)} passed, {len(problems)} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
