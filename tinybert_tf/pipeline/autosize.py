"""A student sized to a latency budget (`--student_config=auto`).

Before general distillation the run picks the student's shape (layers, hidden
size, heads, feed-forward size) from a grid of candidates (`--latency_candidates`;
default: the 24 BERT miniatures of Turc et al. 2019, L in {2..12} x H in
{128, 256, 512, 768}, H/64 heads, 4H feed-forward). Each candidate's latency
is measured on this machine, on the runtime the student will ship on
(`--latency_runtime`), by exporting a random-weight model (2-class classifier)
with the export table's own code and timing it at `--latency_batch` x
`--latency_seq_len` (the median of timed calls, `tinybert_tf.timing`); or it is
read from `--latency_table`, latencies measured on the target device.

Rule: among the candidates within `--latency_budget_ms`, the one with the most
parameters in its transformer layers (embeddings excluded: their cost is a
lookup), ties to the deeper, then the faster (docs/pipeline.md gives the
evidence). The choice, every candidate and the reason go into the plan
(`student`, `candidates`), `OUTPUT/auto_student/` (config.json, sizing.json,
latency.png) and report.json.

Table format (CSV, `#` comments and blank lines ignored), header then one row
per shape: `layers,hidden,heads,intermediate,latency_ms`.
"""
from __future__ import annotations

import dataclasses
import json
import posixpath
import tempfile
from typing import Any, Optional, Sequence

import numpy as np

from tinybert_tf import files
from tinybert_tf.config import BertConfig
from tinybert_tf.export.benchmark import random_inputs, synthetic_vocab
from tinybert_tf.export.formats import FORMATS
from tinybert_tf.models.encoder import BertModel
from tinybert_tf.pipeline.report import save_png
from tinybert_tf.timing import median_ms

AUTO = "auto"
# --latency_runtime -> the export table's format that is timed.
RUNTIMES = {"tflite_float32": "float32", "tflite_dynamic_int8": "dynamic_int8",
            "tflite_int8": "int8", "saved_model": "saved_model"}
# Turc et al. 2019 ("Well-Read Students Learn Better"): the 24 BERT miniatures.
DEFAULT_CANDIDATES = tuple(f"{n}x{h}" for n in (2, 4, 6, 8, 10, 12)
                           for h in (128, 256, 512, 768))
TABLE_COLUMNS = ("layers", "hidden", "heads", "intermediate", "latency_ms")
FOLDER = "auto_student"


@dataclasses.dataclass(frozen=True)
class Shape:
    """A student shape; `transformer_params` counts its transformer layers only."""

    layers: int
    hidden: int
    heads: int
    intermediate: int

    @property
    def name(self) -> str:
        return f"{self.layers}x{self.hidden}x{self.heads}x{self.intermediate}"

    @property
    def transformer_params(self) -> int:
        h, i = self.hidden, self.intermediate
        per_layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h  # Q,K,V,O; FFN; 2 LN
        return self.layers * per_layer

    def config(self, base: BertConfig) -> BertConfig:
        return base.replace(num_layers=self.layers, hidden_size=self.hidden,
                            num_heads=self.heads, intermediate_size=self.intermediate)

    def as_dict(self) -> dict[str, int]:
        return {"layers": self.layers, "hidden": self.hidden, "heads": self.heads,
                "intermediate": self.intermediate}


def parse_shape(text: str, where: str = "--latency_candidates") -> Shape:
    """"LxH" (H/64 heads, 4H feed-forward, BERT's ratios), "LxHxA" or "LxHxAxI"."""
    parts = text.strip().lower().split("x")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if not 2 <= len(numbers) <= 4 or min(numbers) < 1:
        raise ValueError(f"{where}: {text!r} is not a shape; write LAYERSxHIDDEN[xHEADS"
                         "[xFFN]] with positive integers, e.g. 4x256 or 4x312x12x1200.")
    layers, hidden = numbers[:2]
    heads = numbers[2] if len(numbers) > 2 else max(1, hidden // 64)
    ffn = numbers[3] if len(numbers) > 3 else 4 * hidden
    if hidden % heads:
        raise ValueError(f"{where}: {text!r}: {heads} heads do not divide hidden size "
                         f"{hidden}.")
    return Shape(layers, hidden, heads, ffn)


def read_table(path: str) -> list[tuple[Shape, float]]:
    """The latency table (module docstring); errors name path:line."""
    if not files.isfile(path):
        raise FileNotFoundError(f"--latency_table={path}: no such file.")
    rows: list[tuple[Shape, float]] = []
    header: Optional[list[str]] = None
    for no, line in enumerate(files.read_text(path).splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        cells = [c.strip() for c in text.split(",")]
        if header is None:
            header = [c.lower() for c in cells]
            if sorted(header) != sorted(TABLE_COLUMNS):
                raise ValueError(f"{path}:{no}: the header must name the columns "
                                 f"{','.join(TABLE_COLUMNS)}, got {text!r}.")
            continue
        if len(cells) != len(header):
            raise ValueError(f"{path}:{no}: {len(cells)} values for {len(header)} columns "
                             f"({','.join(header)}).")
        row = dict(zip(header, cells))
        try:
            dims = [int(row[c]) for c in TABLE_COLUMNS[:4]]
            ms = float(row["latency_ms"])
        except ValueError:
            raise ValueError(f"{path}:{no}: layers, hidden, heads, intermediate must be "
                             f"integers and latency_ms a number, got {text!r}.") from None
        if min(dims) < 1 or not ms > 0 or dims[1] % dims[2]:
            raise ValueError(f"{path}:{no}: sizes must be positive, heads must divide "
                             f"hidden and latency_ms must be > 0, got {text!r}.")
        rows.append((Shape(*dims), ms))
    if not rows:
        raise ValueError(f"{path}: no latency rows; write the header "
                         f"{','.join(TABLE_COLUMNS)} and one row per shape.")
    return rows


def measure(shape: Shape, runtime: str, seq_len: int, batch: int, runs: int = 10,
            base: Optional[BertConfig] = None, work_dir: Optional[str] = None) -> float:
    """Median ms of one call of `shape` (random weights) exported for `runtime`."""
    config = shape.config(base or BertConfig()).replace(
        max_position_embeddings=max(seq_len, (base or BertConfig()).max_position_embeddings))
    model = BertModel(config, head="classifier", num_labels=2,
                      vocab=synthetic_vocab(config.vocab_size), name="bert")
    inputs = random_inputs(config, batch, seq_len)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        fn = FORMATS[RUNTIMES[runtime]].timer(model, tmp, seq_len, batch)
        return median_ms(lambda: _block(fn(inputs)), runs, warmup=1, budget_s=10.0)


def _block(out: Any) -> Any:
    for v in (out.values() if isinstance(out, dict) else [out]):
        np.asarray(v)
    return out


@dataclasses.dataclass
class Sizing:
    """The choice and its evidence (what the plan, sizing.json and report.json show)."""

    request: dict[str, Any]
    candidates: list[dict[str, Any]]
    student: dict[str, Any]
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"request": self.request, "student": self.student,
                "candidates": self.candidates, "reason": self.reason}


def choose(measured: Sequence[tuple[Shape, float]], budget_ms: float,
           request: dict[str, Any]) -> Sizing:
    """Apply the rule (module docstring) to (shape, latency_ms) pairs."""
    if not budget_ms > 0:
        raise ValueError("--student_config=auto needs --latency_budget_ms > 0: the latency "
                         "one call may take on --latency_runtime.")
    within = [(s, ms) for s, ms in measured if ms <= budget_ms]
    if not within:
        fastest, ms = min(measured, key=lambda p: p[1])
        raise ValueError(
            f"--latency_budget_ms={budget_ms:g}: no candidate fits; the fastest, "
            f"{fastest.name}, takes {ms:.3g} ms on {request['runtime']} (batch "
            f"{request['batch']}, {request['seq_len']} tokens). Raise the budget or add "
            "smaller shapes to --latency_candidates (or to --latency_table).")
    best, best_ms = max(within, key=lambda p: (p[0].transformer_params, p[0].layers, -p[1]))
    rows = [{"shape": s.as_dict(), "name": s.name, "params": s.transformer_params,
             "latency_ms": round(ms, 4), "within_budget": ms <= budget_ms,
             "chosen": s == best and ms == best_ms} for s, ms in measured]
    reason = (f"{best.name} has the most transformer-layer parameters "
              f"({best.transformer_params:,}) of the {len(within)} of {len(measured)} "
              f"candidates within {budget_ms:g} ms ({best_ms:.3g} ms on "
              f"{request['runtime']})")
    return Sizing(request, rows, {**best.as_dict(), "name": best.name,
                                  "params": best.transformer_params,
                                  "latency_ms": round(best_ms, 4)}, reason)


def size_student(models_config, base: Optional[BertConfig] = None,
                 log=print) -> Sizing:
    """Measure (or read) every candidate and choose (models_config: `ModelsConfig`)."""
    m = models_config
    if m.latency_runtime not in RUNTIMES:
        raise ValueError(f"--latency_runtime={m.latency_runtime}: use one of "
                         f"{', '.join(RUNTIMES)}.")
    request = _request(m)
    if not m.latency_budget_ms > 0:
        choose([], m.latency_budget_ms, request)  # raises the budget error
    if m.latency_table:
        measured = read_table(m.latency_table)
    else:
        shapes = [parse_shape(c) for c in m.latency_candidates]
        if not shapes:
            raise ValueError("--latency_candidates: empty; name at least one shape.")
        measured = []
        for shape in shapes:
            ms = measure(shape, m.latency_runtime, m.latency_seq_len, m.latency_batch,
                         base=base)
            log(f"[auto student] {shape.name:<18} {ms:9.3f} ms on {m.latency_runtime}")
            measured.append((shape, ms))
    return choose(measured, m.latency_budget_ms, request)


def plot(sizing: Sizing, path: str) -> str:
    """Latency against transformer-layer parameters, the budget line, the choice; PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for fits, colour, label in ((True, "tab:green", "within budget"),
                                (False, "tab:grey", "over budget")):
        pts = [c for c in sizing.candidates if c["within_budget"] == fits]
        ax.scatter([c["params"] / 1e6 for c in pts], [c["latency_ms"] for c in pts],
                   c=colour, label=label, s=22)
    chosen = sizing.student
    ax.scatter([chosen["params"] / 1e6], [chosen["latency_ms"]], marker="*", s=180,
               c="tab:red", label=f"chosen {chosen['name']}")
    ax.axhline(sizing.request["budget_ms"], color="tab:red", linestyle="--",
               label=f"budget {sizing.request['budget_ms']:g} ms")
    ax.set_xlabel("transformer-layer parameters (M)")
    ax.set_ylabel(f"latency (ms), {sizing.request['runtime']}")
    ax.set_title(f"batch {sizing.request['batch']}, {sizing.request['seq_len']} tokens")
    ax.legend(fontsize=7)
    return save_png(fig, path)


def write(sizing: Sizing, folder: str, base: BertConfig) -> str:
    """config.json (the chosen student), sizing.json and latency.png under `folder`;
    returns the config path (what --student_config then names)."""
    files.makedirs(folder)
    shape = Shape(**{k: sizing.student[k] for k in ("layers", "hidden", "heads",
                                                     "intermediate")})
    config_path = posixpath.join(folder, "config.json")
    files.write_text_atomic(config_path, shape.config(base).to_json())
    files.write_text_atomic(posixpath.join(folder, "sizing.json"),
                            json.dumps(sizing.as_dict(), indent=1))
    plot(sizing, posixpath.join(folder, "latency.png"))
    return config_path


def report_entry(output_dir: str) -> dict[str, Any]:
    """report.json's `student_sizing` (OUTPUT/auto_student/sizing.json: the chosen shape,
    every candidate, the reason) when this run chose its student, else nothing."""
    path = posixpath.join(output_dir, FOLDER, "sizing.json")
    return {"student_sizing": json.loads(files.read_text(path))} if files.isfile(path) else {}


def resolve(config, log=print):
    """`config` (a `PipelineConfig`) with --student_config=auto replaced by the chosen
    shape's OUTPUT/auto_student/config.json, and the `Sizing` (None when not auto).

    A sizing.json of the same request (flags) is reused, not measured again: a re-run
    (or the run after its --dry_run) keeps the student it chose.
    """
    m = config.models
    if m.student_config != AUTO:
        return config, None
    folder = posixpath.join(config.run.output_dir, FOLDER)
    sizing = _reuse(folder, m) or size_student(m, log=log)
    log(f"[auto student] {sizing.reason}")
    path = write(sizing, folder, BertConfig())
    models = dataclasses.replace(m, student_config=path)
    return dataclasses.replace(config, models=models), sizing


def _request(m) -> dict[str, Any]:
    return {"budget_ms": m.latency_budget_ms, "runtime": m.latency_runtime,
            "seq_len": m.latency_seq_len, "batch": m.latency_batch,
            "table": m.latency_table or None,
            "candidates": None if m.latency_table else list(m.latency_candidates)}


def _reuse(folder: str, m) -> Optional[Sizing]:
    path = posixpath.join(folder, "sizing.json")
    if not files.isfile(path):
        return None
    data = json.loads(files.read_text(path))
    if data.get("request") != _request(m):
        return None
    return Sizing(data["request"], data["candidates"], data["student"], data["reason"])
