"""Compare two train_moe_gpt.py summaries: same loss curve within noise, and both learning.

    python compare_runs.py REFERENCE.json CANDIDATE.json [--report parity.json]
        [--first-atol 0.05] [--atol 0.08] [--rtol 0.01]

Step 1's loss is computed before any update, so it differs only by the dispatchers' arithmetic
(summation order in bf16): it gets the tight ``--first-atol``. Later steps compound those
differences through the optimizer: each must be within ``atol + rtol * |reference|``. Both runs
must have the same step count, finite losses, and a lower loss at the end than at the start.
Exit status 0 = match, 1 = mismatch (the report says where), 2 = unusable input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def compare(ref: dict, cand: dict, first_atol: float, atol: float, rtol: float) -> dict:
    a, b = ref["losses"], cand["losses"]
    problems = []
    if len(a) != len(b) or not a:
        problems.append(f"step counts differ or are empty: {len(a)} vs {len(b)}")
    rows = []
    for step, (x, y) in enumerate(zip(a, b), start=1):
        tol = first_atol if step == 1 else atol + rtol * abs(x)
        diff = abs(x - y) if math.isfinite(x) and math.isfinite(y) else math.inf
        ok = diff <= tol
        rows.append({"step": step, "reference": x, "candidate": y, "abs_diff": diff, "tol": tol, "ok": ok})
        if not ok:
            problems.append(f"step {step}: |{x:.5f} - {y:.5f}| = {diff:.5f} > {tol:.5f}")
    for name, losses in (("reference", a), ("candidate", b)):
        if losses and not losses[-1] < losses[0]:
            problems.append(f"{name} did not learn: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    finite = [r["abs_diff"] for r in rows if math.isfinite(r["abs_diff"])]
    return {
        "match": not problems,
        "problems": problems,
        "max_abs_diff": max(finite) if len(finite) == len(rows) and rows else None,
        "reference": {"dispatcher": ref["config"]["dispatcher"], "tokens_per_s": ref["tokens_per_s"]},
        "candidate": {"dispatcher": cand["config"]["dispatcher"], "tokens_per_s": cand["tokens_per_s"]},
        "tokens_per_s_ratio": cand["tokens_per_s"] / ref["tokens_per_s"] if ref["tokens_per_s"] else None,
        "steps": rows,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reference")
    p.add_argument("candidate")
    p.add_argument("--report", default=None)
    p.add_argument("--first-atol", type=float, default=0.05)
    p.add_argument("--atol", type=float, default=0.08)
    p.add_argument("--rtol", type=float, default=0.01)
    args = p.parse_args(argv)
    try:
        with open(args.reference) as f:
            ref = json.load(f)
        with open(args.candidate) as f:
            cand = json.load(f)
        report = compare(ref, cand, args.first_atol, args.atol, args.rtol)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"compare_runs: unusable input: {exc}", file=sys.stderr)
        return 2
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    verdict = "MATCH" if report["match"] else "MISMATCH"
    print(f"{verdict}: {report['candidate']['dispatcher']} vs {report['reference']['dispatcher']}, "
          f"max |dloss| {report['max_abs_diff']}, tokens/s {report['candidate']['tokens_per_s']:.0f} vs "
          f"{report['reference']['tokens_per_s']:.0f}")
    for problem in report["problems"]:
        print("  " + problem)
    return 0 if report["match"] else 1


if __name__ == "__main__":
    sys.exit(main())
