"""One of the paper's tables over several seeds: `bin/reproduce --seeds=42,1,2` runs the
table once per seed (DIR/seed-N/, each with its own table<N>.json) and this module
combines them into DIR/table<N>.json / .md / .png.

Per cell and column it keeps every seed's score, their mean and sample standard
deviation, and the paired difference to the table's first recipe row (the main
recipe in Tables 2-4) on the same seed: the cells of one seed share the teacher, the
data and, where they have one, the general model, so the paired difference is the
ablation's effect with less of the seed's noise in it than the two means have. The
Markdown says in how many seeds a row scored below the first one: with three seeds,
a difference is shown only when all three agree and the mean is well outside the
spread.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Optional

from tinybert_tf.paper import table_files
from tinybert_tf.paper import tables as paper_tables

AVERAGE = "average"


def _stats(values: list[Optional[float]]) -> dict[str, Any]:
    """Mean and sample standard deviation (n - 1; None for one value) of `values`;
    both None when a seed has no score."""
    if not values or any(v is None for v in values):
        return {"per_seed": values, "mean": None, "sd": None}
    sd = statistics.stdev(values) if len(values) > 1 else None
    return {"per_seed": values, "mean": round(statistics.fmean(values), 3),
            "sd": None if sd is None else round(sd, 3)}


def _diff(values: list[Optional[float]], first: list[Optional[float]]) -> dict[str, Any]:
    """The paired difference `values - first`, seed by seed, and how many are below 0."""
    if any(v is None for v in values + first):
        return {**_stats([None]), "below": None}
    per_seed = [round(v - f, 3) for v, f in zip(values, first)]
    return {**_stats(per_seed), "below": sum(d < 0 for d in per_seed)}


def _ours(row: dict, header: str) -> Optional[float]:
    entry = row["average"] if header == AVERAGE else row["scores"][header]
    return entry["ours"]


def _paper(row: dict, header: str) -> Optional[float]:
    entry = row["average"] if header == AVERAGE else row["scores"][header]
    return entry["paper"]


def _published_averages(table: dict[str, Any]) -> dict[str, Optional[float]]:
    """{cell: the paper's "Avg" of its own tasks} for the table's rows."""
    try:
        paper = paper_tables.get_table(int(table["table"]))
    except ValueError:
        return {}
    return {c.name: c.published.get("Avg") for c in paper.cells}


def summarise(tables: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """{seed: a run's table<N>.json} -> the table over the seeds (see the module doc).
    Every seed's table must have the same rows and columns (one command made them)."""
    seeds = list(tables)
    if not seeds:
        raise ValueError("no seed's table to combine")
    base = tables[seeds[0]]
    headers = [c["header"] for c in base["columns"]] + [AVERAGE]
    for seed in seeds[1:]:
        other = tables[seed]
        if [r["cell"] for r in other["rows"]] != [r["cell"] for r in base["rows"]] or \
                other["columns"] != base["columns"]:
            raise ValueError(f"seed {seed}'s table has other rows or columns than seed "
                             f"{seeds[0]}'s; run every seed with the same command")
    rows_by_seed = {s: {r["cell"]: r for r in tables[s]["rows"]} for s in seeds}
    first = next((r["cell"] for r in base["rows"] if r["flagfile"]), None)
    published = _published_averages(base)
    rows = []
    for row in base["rows"]:
        scores = {}
        for header in headers:
            values = [_ours(rows_by_seed[s][row["cell"]], header) for s in seeds]
            entry = {**_stats(values), "paper": _paper(row, header)}
            if header == AVERAGE and entry["paper"] is None:
                # Our columns are not the paper's (e.g. a proxy task): its own average.
                entry["paper"] = published.get(row["cell"])
                entry["paper_is_its_average"] = entry["paper"] is not None
            if row["flagfile"] and first and row["cell"] != first:
                entry["diff_to_first"] = _diff(
                    values, [_ours(rows_by_seed[s][first], header) for s in seeds])
                paper_first = (published.get(first) if entry.get("paper_is_its_average")
                               else _paper(rows_by_seed[seeds[0]][first], header))
                entry["paper_diff_to_first"] = (
                    None if entry["paper"] is None or paper_first is None
                    else round(entry["paper"] - paper_first, 3))
            scores[header] = entry
        rows.append({"cell": row["cell"], "label": row["label"],
                     "flagfile": row["flagfile"], "note": row["note"], "scores": scores})
    return {"table": base["table"], "title": base["title"], "paper_split": base["paper_split"],
            "our_split": base["our_split"], "source": base["source"], "note": base["note"],
            "seeds": seeds, "first_row": first, "columns": base["columns"], "rows": rows,
            "runs": {str(s): tables[s]["runs"] for s in seeds}}


def _num(value: Optional[float]) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.1f}"


def _mean_sd(entry: dict[str, Any]) -> str:
    if entry["mean"] is None:
        return "–"
    return _num(entry["mean"]) + ("" if entry["sd"] is None else f" ± {entry['sd']:.1f}")


def _signed(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:+.1f}"


def markdown(data: dict[str, Any]) -> str:
    """Per column "mean ± sd (paper)", then the average's paired difference to the first
    row: ours (mean ± sd, seeds below) beside the paper's."""
    headers = [c["header"] for c in data["columns"]]
    seeds = ", ".join(map(str, data["seeds"]))
    label_of = {r["cell"]: r["label"] for r in data["rows"]}
    first = label_of.get(data["first_row"], "the first row")
    lines = [f"# Table {data['table']}: {data['title']} (seeds {seeds})", "",
             f"Ours: {data['our_split']} set, mean ± standard deviation over "
             f"{len(data['seeds'])} seeds; paper: {data['paper_split']} ({data['source']}). "
             f"Each score: ours (paper). Δ: the average's paired difference to {first}, "
             "seed by seed (mean ± sd; how many seeds scored below it).", "",
             "| cell | " + " | ".join(headers) + f" | average | Δ vs {first} (ours) | "
             "seeds below | Δ (paper) |",
             "|---" * (len(headers) + 5) + "|"]
    for row in data["rows"]:
        cols = [f"{_mean_sd(row['scores'][h])} ({_num(row['scores'][h]['paper'])})"
                for h in headers + [AVERAGE]]
        avg = row["scores"][AVERAGE]
        diff = avg.get("diff_to_first")
        if diff is None:
            tail = ["–", "–", "–"]
        else:
            spread = "" if diff["sd"] is None else f" ± {diff['sd']:.1f}"
            tail = [("–" if diff["mean"] is None else f"{diff['mean']:+.1f}{spread}"),
                    "–" if diff["below"] is None else f"{diff['below']} of {len(data['seeds'])}",
                    _signed(avg.get("paper_diff_to_first"))]
        lines.append(f"| {row['label']} | " + " | ".join(cols + tail) + " |")
    if any(r["scores"][AVERAGE].get("paper_is_its_average") for r in data["rows"]):
        lines += ["", "The paper's average and Δ are over its own tasks: our columns are "
                  "not in its table."]
    lines += table_files.note_lines(data)
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: str) -> str:
    """Our mean average per cell with its standard deviation as an error bar, beside
    the paper's average (PNG, written whole)."""
    avg = [r["scores"][AVERAGE] for r in data["rows"]]
    return table_files.bar_chart(
        data, [a["mean"] or 0.0 for a in avg], [a["paper"] or 0.0 for a in avg],
        f"ours ({data['our_split']}, {len(data['seeds'])} seeds)", path,
        err=[a["sd"] or 0.0 for a in avg])


def write(tables: dict[int, dict[str, Any]], output_dir: str) -> dict[str, Any]:
    """DIR/table<N>.json / .md / .png over the seeds' tables; prints the Markdown."""
    return table_files.write(summarise(tables), output_dir, markdown, plot)
