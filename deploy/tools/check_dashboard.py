#!/usr/bin/env python3
"""Loads a Grafana dashboard JSON with grafana-foundation-sdk (PyPI) and fails on any key the SDK's
models do not know: the SDK's from_json drops unknown keys silently, so the check is a round trip
(from_json then to_json) in which every key of the file must survive. Panels and queries decode
through the SDK's registered plugins (timeseries options, Prometheus queries), so their keys are
checked too. Prints one line per panel: its type, title and PromQL.
  usage: check_dashboard.py DASHBOARD.json [--exprs OUT.json]   (OUT.json: [{panel, refId, expr}])"""
import argparse
import json
import sys

from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog import runtime
from grafana_foundation_sdk.models.dashboard import Dashboard


def plain(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.to_json()))


def lost_keys(src, out, path=""):
    lost = []
    if isinstance(src, dict):
        if not isinstance(out, dict):
            return [f"{path} (decoded as {type(out).__name__})"]
        for key, value in src.items():
            if key not in out:
                lost.append(f"{path}.{key}")
            else:
                lost += lost_keys(value, out[key], f"{path}.{key}")
    elif isinstance(src, list):
        if not isinstance(out, list) or len(out) != len(src):
            return [f"{path} (list)"]
        for i, (a, b) in enumerate(zip(src, out)):
            lost += lost_keys(a, b, f"{path}[{i}]")
    return lost


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dashboard")
    ap.add_argument("--exprs")
    args = ap.parse_args()
    plugins.register_default_plugins()
    src = json.load(open(args.dashboard))
    model = Dashboard.from_json(src)
    lost = lost_keys(src, plain(model.to_json()))
    problems = [f"unknown key {k}" for k in lost]
    exprs = []
    for panel in model.panels or []:
        cfg = runtime.panelcfg_config(panel.type_val)
        if cfg is None:
            problems.append(f"panel '{panel.title}': type {panel.type_val} unknown to the SDK")
        for target in panel.targets or []:
            kind = type(target).__name__
            if kind == "UnknownDataquery":
                problems.append(f"panel '{panel.title}': query {target} not decoded as a known data source")
                continue
            exprs.append({"panel": panel.title, "refId": target.ref_id, "expr": target.expr})
            print(f"dashboard: panel {panel.id_val:2d} {panel.type_val:10s} {panel.title:24s} {target.ref_id}: {target.expr}")
    for p in problems:
        print(f"dashboard: FAIL {p}")
    print(f"dashboard: {args.dashboard}: {len(model.panels or [])} panels, {len(exprs)} queries, "
          f"{len(model.templating.list_val or [])} variables, {len(lost)} unknown keys "
          f"(grafana-foundation-sdk, round trip of {sum(1 for _ in walk(src))} keys)")
    if args.exprs:
        json.dump(exprs, open(args.exprs, "w"), indent=1)
    return 1 if problems else 0


def walk(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk(v)


if __name__ == "__main__":
    sys.exit(main())
