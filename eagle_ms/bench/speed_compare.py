"""``eagle-ms trace speed BEFORE AFTER``: the before/after speed of two bench runs of the same turns.

Two runs of different code (or settings) on the same machine, one after the other, each measure their own
teacher-only baseline and speculative (EA) tokens/s per turn. This pairs the turns by key and reports,
for the baseline and for EA tokens/s, the after/before ratio three ways:

* ``ratio_of_means``: mean tokens/s after / mean tokens/s before (what a table of the two runs' means gives);
* ``median_ratio`` and ``geomean_ratio``: the median and the geometric mean of the per-turn ratios;
* ``turns_faster``: how many turns have a ratio above 1.

A turn counts only when it is ``ok`` in both runs and its prompt ids are equal (an MT-Bench second turn
follows the baseline's first answer, so its prompt differs if that answer does); the others are listed.
Worked example: baseline tokens/s before [10, 20], after [15, 20] -> per-turn ratios [1.5, 1.0],
ratio_of_means 35 / 30 = 1.167, median 1.25, geometric mean sqrt(1.5) = 1.225, turns_faster 1.
"""
from __future__ import annotations

import numpy as np

from eagle_ms.trace import turn_headers

QUANTITIES = (("baseline", "teacher-only (baseline) tokens/s"), ("ea", "speculative (EA) tokens/s"))


def _ratios(before: list[float], after: list[float]) -> dict:
    b, a = np.asarray(before, np.float64), np.asarray(after, np.float64)
    r = a / b
    return {"before_mean": float(b.mean()), "after_mean": float(a.mean()),
            "ratio_of_means": float(a.mean() / b.mean()), "median_ratio": float(np.median(r)),
            "geomean_ratio": float(np.exp(np.log(r).mean())), "turns_faster": int((r > 1).sum())}


def compare_speed(run_before: str, run_after: str) -> dict:
    """The comparison (module doc) as a JSON-ready dict. Raises FileNotFoundError naming a missing run
    directory, ValueError when no turn is ok in both runs with the same prompt."""
    before, after = turn_headers(run_before), turn_headers(run_after)
    keys = sorted(set(before) & set(after), key=lambda k: (before[k].get("index", 0), k))
    not_ok = [k for k in keys if before[k]["status"] != "ok" or after[k]["status"] != "ok"]
    prompt_differs = [k for k in keys if k not in not_ok
                      and before[k].get("prompt_ids") != after[k].get("prompt_ids")]
    paired = [k for k in keys if k not in not_ok and k not in prompt_differs]
    if not paired:
        raise ValueError(f"no turn is ok in both {run_before} and {run_after} with the same prompt "
                         f"({len(keys)} turns in both, {len(not_ok)} not ok, {len(prompt_differs)} prompts differ)")
    out = {"before": run_before, "after": run_after, "turns": len(paired),
           "only_before": sorted(set(before) - set(after)), "only_after": sorted(set(after) - set(before)),
           "not_ok": not_ok, "prompt_differs": prompt_differs,
           "ea_tokens_differ": [k for k in paired if before[k]["ea"]["tokens"] != after[k]["ea"]["tokens"]]}
    for name, _ in QUANTITIES:
        out[name] = _ratios([before[k][name]["tokens_per_s"] for k in paired],
                            [after[k][name]["tokens_per_s"] for k in paired])
    out["speedup_mean"] = {"before": float(np.mean([before[k]["speedup"] for k in paired])),
                           "after": float(np.mean([after[k]["speedup"] for k in paired]))}
    return out


def format_speed(c: dict) -> str:
    """A readable table of ``compare_speed``'s result."""
    lines = [f"before = {c['before']}", f"after  = {c['after']}",
             f"{c['turns']} turns paired (ok in both, same prompt); {len(c['only_before'])} only before, "
             f"{len(c['only_after'])} only after, {len(c['not_ok'])} not ok, {len(c['prompt_differs'])} prompts differ",
             "", "| tokens/s | mean before | mean after | ratio of means | median ratio | geomean ratio | turns faster |",
             "|---|---|---|---|---|---|---|"]
    for name, label in QUANTITIES:
        q = c[name]
        lines.append(f"| {label} | {q['before_mean']:.2f} | {q['after_mean']:.2f} | {q['ratio_of_means']:.3f}x | "
                     f"{q['median_ratio']:.3f}x | {q['geomean_ratio']:.3f}x | {q['turns_faster']} of {c['turns']} |")
    s = c["speedup_mean"]
    lines += ["", f"speedup mean (EA / baseline, each run against its own baseline): before {s['before']:.2f}x, "
                  f"after {s['after']:.2f}x",
              f"EA tokens differ between the runs on {len(c['ea_tokens_differ'])} of {c['turns']} turns"]
    return "\n".join(lines)
