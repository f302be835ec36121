"""What bin/reproduce's two kinds of table (one run: `reproduce.write_results`; over
seeds: `seed_tables.write`) write alike: DIR/table<N>.json / .md / .png, the notes
under the Markdown, and the chart of our average beside the paper's per cell."""
from __future__ import annotations

import posixpath
from typing import Any, Callable, Optional, Sequence

from tinybert_tf import files
from tinybert_tf.files import save_png, write_json_atomic


def write(data: dict[str, Any], output_dir: str, markdown: Callable[[dict], str],
          plot: Callable[[dict, str], str]) -> dict[str, Any]:
    """DIR/table<N>.json, .md (`markdown(data)`) and .png (`plot`), each written whole;
    prints the Markdown."""
    base = posixpath.join(output_dir, f"table{data['table']}")
    text = markdown(data)
    write_json_atomic(base + ".json", data)
    files.write_text_atomic(base + ".md", text)
    plot(data, base + ".png")
    print(text, flush=True)
    return data


def not_ours(output_dir: str, number: int) -> Optional[str]:
    """The path of a DIR/table<N>.json / .md / .png that a table of bin/reproduce's would
    replace but that bin/reproduce did not write, or None. `write` writes the JSON
    first, so a .md or .png without a table<N>.json of ours is someone else's."""
    base = posixpath.join(output_dir, f"table{number}")
    if files.exists(base + ".json"):
        found = files.json_object(base + ".json")
        ours = found is not None and found.get("table") == number and "rows" in found
        return None if ours else base + ".json"
    return next((base + ext for ext in (".md", ".png") if files.exists(base + ext)), None)


def note_lines(data: dict[str, Any]) -> list[str]:
    """The rows' notes and the table's, as Markdown list items after a blank line
    (nothing when there are none)."""
    lines = [f"- {r['label']}: {r['note']}" for r in data["rows"] if r["note"]]
    if data["note"]:
        lines.append(f"- {data['note']}")
    return [""] + lines if lines else []


def bar_chart(data: dict[str, Any], ours: Sequence[float], paper: Sequence[float],
              ours_label: str, path: str, err: Optional[Sequence[float]] = None,
              shares: Optional[Sequence[Optional[float]]] = None) -> str:
    """Grouped bars per row of `data`: our average (with `err` as error bars, and each
    of `shares` printed as a percentage above its bar) beside the paper's (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows) + 2), 3.8))
    x = list(range(len(rows)))
    extra = {} if err is None else {"yerr": err, "capsize": 3}
    ax.bar([i - 0.2 for i in x], ours, 0.4, label=ours_label, **extra)
    ax.bar([i + 0.2 for i in x], paper, 0.4, label=f"paper ({data['paper_split']})")
    for i, share in enumerate(shares or ()):
        if share is not None:
            ax.annotate(f"{100 * share:.0f}%", (i - 0.2, ours[i]), ha="center",
                        va="bottom", fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels([r["label"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("average score")
    ax.set_title(f"Table {data['table']}: {data['title']}", fontsize=9)
    ax.legend(fontsize=8)
    return save_png(fig, path)
