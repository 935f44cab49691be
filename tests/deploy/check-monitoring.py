#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check deploy/monitoring's Grafana dashboard and alert rules against the daemon's real metrics.

usage: check-monitoring.py DASHBOARD.json RULES.yml METRICS.txt...

The dashboard must be a Grafana dashboard (uid, title, schemaVersion, a data source variable, panels with
unique ids, a grid position inside 24 columns, queries with unique refIds), and cover what issue 28 asks for
(budget, leased, pool, pressure signals, per-cgroup leased bytes, revocations, refusals, loop turn time).
Every pinbroker_ metric name a panel or an alert rule queries must be one the daemon emits: the names come from
the METRICS files, the daemon's real output. No query uses the job label for pinbroker's cgroups (Prometheus's
own target label) or the retired pinbroker_signal.
"""
import json
import re
import sys

import yaml

NAME = re.compile(r"\bpinbroker_[a-zA-Z0-9_]+\b")
REQUIRED = {
    "budget": "pinbroker_budget_bytes",
    "leased": "pinbroker_leased_bytes",
    "pool": "pinbroker_pool_bytes",
    "pressure state": "pinbroker_pressure_state",
    "pressure signals": "pinbroker_mem_available_ratio",
    "per-cgroup leased bytes": "pinbroker_job_leased_bytes",
    "revocations": "pinbroker_revocations_total",
    "refusals": "pinbroker_acquires_refused_total",
    "loop turn time": "pinbroker_loop_turn_seconds_bucket",
}
errors = []


def err(msg):
    errors.append(msg)


def emitted(paths):
    names = set()
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"(pinbroker_[a-zA-Z0-9_]+)[{ ]", line)
                if m:
                    names.add(m.group(1))
    return names


def check_expr(where, expr, names):
    # up{job="pinbroker"} is Prometheus's own scrape job and fine; a job label on pinbroker's series, or a sum by
    # job, is the label the daemon no longer has (Prometheus renamed it exported_job).
    if re.search(r"pinbroker_[a-zA-Z0-9_]+\{[^}]*\bjob\s*[=!]|by\s*\([^)]*\bjob\b", expr):
        err(f"{where}: queries a job label: {expr}")
    if "pinbroker_signal" in expr:
        err(f"{where}: queries the retired pinbroker_signal: {expr}")
    used = set(NAME.findall(expr))
    for n in sorted(used - names):
        err(f"{where}: {n} is not a metric the daemon emits")
    return used


def check_dashboard(path, names):
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    if not isinstance(d, dict):
        err(f"{path}: not a JSON object")
        return
    for k, t in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list), ("templating", dict)):
        if not isinstance(d.get(k), t):
            err(f"{path}: {k} missing or not a {t.__name__}")
    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource":
        err(f"{path}: no datasource variable")
    ids, used = set(), set()
    panels = list(d.get("panels", []))
    for p in list(panels):
        panels.extend(p.get("panels", []))
    if not [p for p in panels if p.get("type") != "row"]:
        err(f"{path}: no panels")
    for p in panels:
        where = f"{path}: panel {p.get('id')} ({p.get('title')})"
        if p.get("id") in ids or not isinstance(p.get("id"), int):
            err(f"{where}: id missing or not unique")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "hwxy") or g["x"] < 0 or g["x"] + g["w"] > 24:
            err(f"{where}: gridPos {g} not inside the 24 columns")
        if not p.get("title") or not p.get("type"):
            err(f"{where}: no title or type")
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            err(f"{where}: datasource is not the ${{datasource}} variable")
        targets = p.get("targets") or []
        if not targets:
            err(f"{where}: no queries")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or None in refs:
            err(f"{where}: refIds missing or repeated")
        for t in targets:
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                err(f"{where}: a query without expr")
                continue
            used |= check_expr(where, expr, names)
    for what, n in REQUIRED.items():
        if n not in used:
            err(f"{path}: no panel shows {what} ({n})")
    if not any("by (cgroup)" in t.get("expr", "") for p in panels for t in p.get("targets", [])):
        err(f"{path}: no panel sums by (cgroup)")
    print(f"{path}: {len(panels)} panels and {len(used)} metric names checked")


def check_rules(path, names):
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    n = 0
    for g in doc.get("groups", []):
        for r in g.get("rules", []):
            n += 1
            check_expr(f"{path}: {r.get('alert') or r.get('record')}", str(r.get("expr", "")), names)
    print(f"{path}: {n} rules checked")


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    names = emitted(sys.argv[3:])
    if not names:
        err("no pinbroker_ metrics in " + " ".join(sys.argv[3:]))
    check_dashboard(sys.argv[1], names)
    check_rules(sys.argv[2], names)
    for e in errors:
        print("FAIL: " + e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
