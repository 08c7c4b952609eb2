"""Issue 34's goals against what bench/gpu_suite.sh measured: one short table, printed last, so that a lent GPU's
reply (which keeps only the end of the output) says at once which goal was met and which was missed.

    python bench/gpu_goals.py h200 docs/bench              # the figures for one GPU kind, from one folder
    python bench/gpu_goals.py h200 "$OUT" docs/bench       # each file from the first folder that has it

Reads train_bench_<gpu>.json (Kiln against the reference, per preset) and, where the suite made them,
train_bench_<preset>_zero3_<gpu>.json and train_bench_<preset>_zero1_<gpu>.json (one preset forced to a stage,
compared with the stage the layout chose for it), and prints each file's path and date: a file from an earlier
call or session is there to see. A figure the suite did not get reads "n/a", and its goal "not measured": nothing
is inferred. Exits 0 whatever the figures are; the verdicts are for the reader.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Issue 34's "Done means", on one H100/H200, bf16, seq_len 2048, default settings
MFU_GOAL = {"125m": 0.35, "350m": 0.40, "1b": 0.45}
RATIO_GOAL = 0.95  # Kiln's step throughput over the reference loop's
GOODPUT_GOAL = 0.90  # goodput at the default checkpoint cadence over step throughput


def first(folders: list[Path], name: str) -> Path | None:
    return next((folder / name for folder in folders if (folder / name).is_file()), None)


def load(path: Path | None) -> dict | None:
    try:
        return json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None


def verdict(value: float | None, goal: float | None) -> str:
    if goal is None:
        return ""
    if value is None:
        return "not measured"
    return "met" if value >= goal else "MISSED"


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def preset_rows(report: dict) -> list[dict]:
    rows = []
    for run in report.get("runs", []):
        if "kiln" not in run:  # Kiln's run failed (the bench goes on to the next preset)
            rows.append({"preset": run["preset"], "error": run.get("error", "no figures")})
            continue
        kiln = run["kiln"]
        layout = kiln.get("layout") or {}
        step = kiln.get("tokens_per_s")
        at_cadence = kiln.get("goodput_at_default_cadence_tokens_per_s")
        estimated = (layout.get("memory_gib") or {}).get("total")
        rows.append({
            "preset": run["preset"], "stage": (kiln.get("parallelism") or {}).get("zero_stage"),
            "micro_batch": layout.get("micro_batch"), "tokens_per_s": step, "mfu": kiln.get("mfu"),
            "reference_mfu": (run.get("reference") or {}).get("mfu"), "ratio": run.get("kiln_over_reference"),
            "goodput_share": at_cadence / step if at_cadence and step else None,
            "busy": ((kiln.get("profile") or {}).get("device_busy_fraction")),
            "memory": kiln["peak_memory_gib"] / estimated if estimated and kiln.get("peak_memory_gib") else None,
            "error": run.get("error")})  # the reference's, after Kiln's figures
    return rows


def forced_line(label: str, forced: dict | None, chosen: dict | None) -> str:
    if not (forced or {}).get("runs"):  # no file, or a run cut short before its figures
        return f"{label}: not measured"
    run = forced["runs"][0]
    if "kiln" not in run:
        return f"{label}: failed ({run.get('error', 'no figures')})"
    tokens = run["kiln"].get("tokens_per_s")
    stage = (run["kiln"].get("parallelism") or {}).get("zero_stage")
    line = f"{label}: ZeRO-{stage} {fmt(tokens, ',.0f')} tokens/s, MFU {fmt(run['kiln'].get('mfu'), '.1%')}"
    if chosen and chosen["tokens_per_s"]:
        line += (f"; the layout's ZeRO-{chosen['stage']}: {chosen['tokens_per_s']:,.0f} tokens/s "
                 f"(forced / chosen {fmt(tokens / chosen['tokens_per_s'] if tokens else None, '.2f')})")
    return line


def summary(gpu: str, folders: list[Path]) -> str:
    found = first(folders, f"train_bench_{gpu}.json")
    forced = {stage: sorted({p.name for folder in folders for p in folder.glob(f"train_bench_*_zero{stage}_{gpu}.json")})
              for stage in (3, 1)}
    report = load(found) or {}
    rows = {row["preset"]: row for row in preset_rows(report)}
    lines = [f"issue 34's goals on {report.get('machine', gpu)}; figures from:"]
    for path in [found, *(first(folders, name) for names in forced.values() for name in names)]:
        if path:
            lines.append(f"  {path} ({(load(path) or {}).get('date', 'no date')})")
    lines.append(f"{'preset':<7}{'stage':>6}{'micro':>6}{'tokens/s':>11}{'MFU':>7} {'goal':<13}{'ref MFU':>8}"
                 f"{'kiln/ref':>9} {'goal':<13}{'goodput':>8} {'goal':<13}{'busy':>6}{'mem/est':>8}")
    for preset in [*MFU_GOAL, *(p for p in rows if p not in MFU_GOAL)]:
        row = rows.get(preset)
        if row is None:
            if preset in MFU_GOAL:
                lines.append(f"{preset:<7} not measured")
            continue
        if "tokens_per_s" not in row:
            lines.append(f"{preset:<7} failed: {row['error']}")
            continue
        goal = preset in MFU_GOAL  # the goals are the issue's presets' (a dry run's tiny gets figures only)
        lines.append(
            f"{preset:<7}{fmt(row['stage'], 'd'):>6}{fmt(row['micro_batch'], 'd'):>6}{fmt(row['tokens_per_s'], ',.0f'):>11}"
            f"{fmt(row['mfu'], '.1%'):>7} {verdict(row['mfu'], MFU_GOAL.get(preset)):<13}"
            f"{fmt(row['reference_mfu'], '.1%'):>8}{fmt(row['ratio'], '.2f'):>9} "
            f"{verdict(row['ratio'], RATIO_GOAL if goal else None):<13}{fmt(row['goodput_share'], '.3f'):>8} "
            f"{verdict(row['goodput_share'], GOODPUT_GOAL if goal else None):<13}"
            f"{fmt(row['busy'], '.0%'):>6}{fmt(row['memory'], '.2f'):>8}")
    lines += [f"{preset}: {row['error']}" for preset, row in rows.items() if "tokens_per_s" in row and row["error"]]
    lines.append("goodput: at the default cadence, over step throughput; busy: the device's busy share of two profiled "
                 "steps; mem/est: peak allocated over the layout's estimate")
    for stage, names in forced.items():
        for name in names:
            preset = name.removeprefix("train_bench_").split("_zero")[0]
            lines.append(forced_line(f"{preset} forced to ZeRO-{stage}", load(first(folders, name)), rows.get(preset)))
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: gpu_goals.py GPU FOLDER [FOLDER ...]   (e.g. gpu_goals.py h200 docs/bench)")
    print(summary(sys.argv[1], [Path(folder) for folder in sys.argv[2:]]))
