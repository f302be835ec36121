"""report.json, the printed summary table and the loss-curve PNG (through
`tinybert_tf.files`: the PNG is drawn into memory and written whole, so a
gs:// or ram:// output folder works)."""
from __future__ import annotations

import json
import posixpath
from typing import Any

from tinybert_tf import files
from tinybert_tf.data.metrics import is_defined
from tinybert_tf.files import save_png


def build_report(task: str, teacher: dict[str, Any], student: dict[str, Any],
                 primary_metric: str, max_seq_len: int,
                 quantized: dict[str, Any] | None = None) -> dict[str, Any]:
    """The DESIGN.md report: both models' facts and the student/teacher ratios.

    ratios.params / ratios.flops: how many times smaller the student is;
    ratios.speedup: teacher latency / student latency (batch 1, this machine);
    ratios.retained: student metric / teacher metric on `primary_metric`.
    quantized: the quantize stage's int8 fake-quantised student (its Keras
    simulation, not timed: the int8 file's latency is in parity.json);
    `quantized_student` and ratios.quantized_retained (its metric / the float
    student's) are added.
    An undefined dev metric (NaN, e.g. Pearson of one example) is null, named in
    `notes`; `retained` is then null too, never a ratio of undefined values.
    """
    notes = []
    models = {"teacher": teacher, "student": student, "quantized student": quantized}
    for who, facts in list(models.items()):
        undefined = [k for k, v in facts["dev"].items()
                     if not is_defined(v)] if facts is not None else []
        if undefined:
            models[who] = dict(facts, dev={k: (v if is_defined(v) else None)
                                           for k, v in facts["dev"].items()})
            notes.append(f"{who} dev {', '.join(undefined)} undefined (NaN: e.g. a "
                         "correlation of fewer than two dev examples or of constant values)")
    teacher, student, quantized = models.values()
    t_metric = teacher["dev"].get(primary_metric)
    s_metric = student["dev"].get(primary_metric)
    retained = (s_metric / t_metric) if is_defined(t_metric) and is_defined(s_metric) \
        and t_metric else None
    out = {
        "task": task,
        "max_seq_len": max_seq_len,
        "primary_metric": primary_metric,
        "teacher": teacher,
        "student": student,
        "ratios": {
            "params": teacher["params"] / student["params"],
            "flops": teacher["flops"] / student["flops"],
            "speedup": teacher["latency_ms"] / student["latency_ms"],
            "retained": retained,
        },
        **({"notes": notes} if notes else {}),
    }
    if quantized is not None:
        q_metric = quantized["dev"].get(primary_metric)
        out["quantized_student"] = quantized
        out["ratios"]["quantized_retained"] = (
            q_metric / s_metric if is_defined(s_metric) and is_defined(q_metric)
            and s_metric else None)
    return out


def ratio_words(ratio: float, better: str, worse: str) -> str:
    """teacher/student `ratio` in words from the student's side: 4.0 -> "4.0x smaller",
    0.25 -> "4.0x larger" (never "0.2x smaller"), about 1 -> "about the same"."""
    if not ratio or ratio != ratio or ratio in (float("inf"), float("-inf")):
        return "-"
    if f"{ratio:.1f}" == "1.0" and f"{1 / ratio:.1f}" == "1.0":
        return "about the same"
    return f"{ratio:.1f}x {better}" if ratio > 1 else f"{1 / ratio:.1f}x {worse}"


def summary_table(report: dict[str, Any]) -> str:
    """A fixed-width table of the report for the terminal."""
    t, s, r = report["teacher"], report["student"], report["ratios"]
    metric = report["primary_metric"]
    rows = [
        ("", "teacher", "student", "ratio"),
        ("params (M)", f"{t['params'] / 1e6:.2f}", f"{s['params'] / 1e6:.2f}",
         ratio_words(r["params"], "smaller", "larger")),
        (f"GFLOPs @ seq {report['max_seq_len']}", f"{t['flops'] / 1e9:.3f}",
         f"{s['flops'] / 1e9:.3f}", ratio_words(r["flops"], "fewer", "more")),
        ("latency b=1 (ms)", f"{t['latency_ms']:.2f}", f"{s['latency_ms']:.2f}",
         ratio_words(r["speedup"], "faster", "slower")),
    ]
    for name in t["dev"]:
        tv, sv = t["dev"][name], s["dev"].get(name)
        ratio = (f"{100 * r['retained']:.1f}% retained"
                 if name == metric and r.get("retained") is not None else "")
        rows.append((f"dev {name}", _value(tv), _value(sv), ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"== {report['task']}: student vs teacher =="]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    q = report.get("quantized_student")
    if q is not None:
        value = q["dev"].get(metric)
        kept = r.get("quantized_retained")
        lines.append(f"int8 student (quantize stage, Keras simulation): dev {metric} "
                     + ("-" if value is None else f"{value:.4f}")
                     + ("" if kept is None else f" ({100 * kept:.1f}% of the float student)"))
    lines += [f"note: {n}" for n in report.get("notes", [])]
    return "\n".join(lines)


def _value(v) -> str:
    return f"{v:.4f}" if is_defined(v) else "undefined"


def load_histories(output_dir: str) -> dict[str, list[dict[str, float]]]:
    """Every phase's history.jsonl under output_dir, keyed "stage/phase"."""
    out = {}
    for path in files.glob(posixpath.join(output_dir, "*", "*", "history.jsonl")):
        stage = posixpath.basename(posixpath.dirname(posixpath.dirname(path)))
        phase = posixpath.basename(posixpath.dirname(path))
        rows = []
        for line in files.read_text(path).splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # blank, or cut by a crash mid-write
        if rows:
            out[f"{stage}/{phase}"] = rows
    return out


def _plain(formatter: type) -> type:
    """`formatter` (a matplotlib log-axis formatter) labelling the same ticks with plain
    numbers (0.69245, 2e-05) instead of mathtext (6.9245x10^-1): as readable, and the
    plot draws in a third of the time."""
    class Plain(formatter):
        def __call__(self, x, pos=None):
            return f"{x:.6g}" if super().__call__(x, pos) else ""
    return Plain


def plot_loss_curves(output_dir: str, path: str) -> str:
    """One panel per phase with every `*loss` series against the step; PNG. Written even
    with no history in `output_dir` (a panel saying so): it is one of the evaluate
    stage's outputs, which a re-run checks for."""
    histories = load_histories(output_dir)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    plain = _plain(ticker.LogFormatterSciNotation)
    panels = max(len(histories), 1)
    width, height = 4.5 * panels, 3.6  # inches
    fig, axes = plt.subplots(1, panels, figsize=(width, height), squeeze=False)
    # Margins in inches, not fitted to the labels (tight_layout measured each of them:
    # half the plot's time, paid at every run's evaluate stage).
    fig.subplots_adjust(left=0.65 / width, right=1 - 0.15 / width, bottom=0.5 / height,
                        top=1 - 0.35 / height, wspace=0.85 * panels / (width - 0.8))
    if not histories:
        axes[0][0].text(0.5, 0.5, f"no training history in\n{output_dir}", ha="center",
                        va="center")
        axes[0][0].set_axis_off()
    for ax, (name, rows) in zip(axes[0], histories.items()):
        keys = sorted({k for row in rows for k in row if k.endswith("loss")})
        for key in keys:
            pts = [(row["step"], row[key]) for row in rows if key in row]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=key)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain())
        ax.yaxis.set_minor_formatter(plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
        ax.legend(fontsize=7)
    return save_png(fig, path, tight=False)
