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

Heads: when a loss term of the general stage (the `--recipe`'s terms, e.g.
`--loss_terms`) compares attention heads one to one with the teacher's
(`LossTerm.compares_teacher_heads`: TinyBERT's `attn`, MiniLM v1's `minilm_att`
and `minilm_val`), every candidate gets the teacher's head count (read from its
config, no weights): a LAYERSxHIDDEN shape takes it, its hidden size rounded to
the nearest multiple (128 -> 132 for 12 heads), feed-forward 4H; a shape or table
row that names another count is excluded, its candidate row saying why.

Layers: `--layer_mapping` maps every student layer onto a teacher layer, so a
candidate it refuses cannot be trained: under uniform, top or bottom one with more
layers than the teacher (`--teacher`, and `--task_teacher` when given), under an
explicit list one with another count than the list names. Such a candidate is
excluded (not measured), its row saying why, as a head-count exclusion is.

Teacher layers copied (`--init_from_teacher`, or a recipe that always copies them,
e.g. `--recipe=distilbert`): the student needs the teacher's width and heads and at
most its feed-forward units (each copied layer keeps its units of largest weight
norm, distill/distilbert.py). With the default candidates, whose widths are not the
teacher's, the grid is the teacher's own: 1..N layers of its width and heads, each
with its feed-forward size or 3/4, 1/2 or 1/4 of it (`InitRule.grid`); a given shape
or table row that breaks the rule is excluded, its row saying why.

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
from tinybert_tf.distill.mapping import STRATEGIES, layer_map
from tinybert_tf.export.benchmark import random_inputs, synthetic_vocab
from tinybert_tf.export.formats import FORMATS
from tinybert_tf.files import save_png
from tinybert_tf.models.checkpoint import inspect_model
from tinybert_tf.models.encoder import BertModel
from tinybert_tf.pipeline.settings.configs import DEFAULT_CANDIDATES
from tinybert_tf.pipeline.training.recipes import get_recipe
from tinybert_tf.timing import median_ms

AUTO = "auto"
# --latency_runtime -> the export table's format that is timed.
RUNTIMES = {"tflite_float32": "float32", "tflite_dynamic_int8": "dynamic_int8",
            "tflite_int8": "int8", "saved_model": "saved_model"}
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


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A shape to choose from: its latency (None: not measured), the H/64 shape it was
    `given` as and why it was `adjusted`, or why it is `excluded` from the choice."""

    shape: Shape
    latency_ms: Optional[float] = None
    given: Optional[Shape] = None
    adjusted: str = ""
    excluded: str = ""

    def row(self, budget_ms: float, chosen: bool) -> dict[str, Any]:
        """The candidate's entry of the plan's `candidates`."""
        ms = self.latency_ms
        row = {"shape": self.shape.as_dict(), "name": self.shape.name,
               "params": self.shape.transformer_params,
               "latency_ms": None if ms is None else round(ms, 4),
               "within_budget": None if ms is None else ms <= budget_ms, "chosen": chosen}
        row.update({k: v for k, v in (("adjusted", self.adjusted),
                                      ("excluded", self.excluded)) if v})
        return row


def excluded_for(candidates: Sequence[Candidate], why: str) -> int:
    """How many of `candidates` a rule whose reason is `why` excluded."""
    return sum(c.excluded.endswith(why) for c in candidates)


def none_left(m) -> str:
    """The start of a rule's error when it leaves no candidate of `m` (`ModelsConfig`)."""
    return (f"--latency_table={m.latency_table}: no row" if m.latency_table
            else "--latency_candidates: no shape")


@dataclasses.dataclass(frozen=True)
class HeadRule:
    """The general stage's `terms` (chosen by `flag`) compare attention heads one to
    one with the teacher's: every candidate needs the teacher's `heads`."""

    heads: int
    terms: tuple[str, ...]
    flag: str

    @property
    def why(self) -> str:
        verb = "compares" if len(self.terms) == 1 else "compare"
        return (f"{self.flag} {', '.join(self.terms)} {verb} the teacher's {self.heads} "
                "heads one to one")

    def fit(self, text: str, where: str = "--latency_candidates") -> Candidate:
        """`text` under the rule: LAYERSxHIDDEN takes the teacher's heads, its hidden
        size rounded to the nearest multiple of them (halves up), feed-forward 4H; a
        shape that names its heads keeps them (and is excluded if they differ)."""
        plain = parse_shape(text, where)
        if len(text.strip().lower().split("x")) > 2:
            return self.check(Candidate(plain))
        a = self.heads
        hidden = a * max(1, (2 * plain.hidden + a) // (2 * a))
        shape = Shape(plain.layers, hidden, a, 4 * hidden)
        if shape == plain:
            return Candidate(shape)
        return Candidate(shape, given=plain, adjusted=(
            f"{plain.layers}x{plain.hidden} takes the teacher's {a} heads (not "
            f"{plain.heads}), hidden {plain.hidden} -> {hidden} = {a} x {hidden // a}, "
            f"feed-forward {4 * hidden}: {self.why}"))

    def check(self, candidate: Candidate) -> Candidate:
        """`candidate`, excluded (with the reason) when its head count is not the teacher's."""
        if candidate.shape.heads == self.heads:
            return candidate
        return dataclasses.replace(candidate,
                                   excluded=f"{candidate.shape.heads} heads; {self.why}")

    def nothing_left(self, m) -> str:
        """The error when every candidate of `m` (`ModelsConfig`) is excluded."""
        a = self.heads
        if m.latency_table:
            where = f"--latency_table={m.latency_table}: no row has the teacher's {a} heads"
            fix = f"add rows of {a}-head shapes (hidden a multiple of {a})"
        else:
            where = (f"--latency_candidates: every shape names a head count other than the "
                     f"teacher's {a}")
            fix = f"write the shapes LAYERSxHIDDEN (they then take {a} heads) or LxHx{a}"
        return (f"{where}, and {self.why}; {fix}, or train without "
                f"{', '.join(self.terms)} (e.g. --recipe=minilm_v2, whose minilm_rel takes "
                "any head count).")

    def note(self, candidates: Sequence[Candidate]) -> str:
        """What the rule did to `candidates`, for the reason."""
        text = f"; every candidate has the teacher's {self.heads} heads ({self.why})"
        widths = sorted({(c.given.hidden, c.shape.hidden) for c in candidates
                         if c.given is not None and c.given.hidden != c.shape.hidden})
        if any(c.adjusted for c in candidates):
            text += (f": LAYERSxHIDDEN shapes took them, hidden sizes rounded to multiples "
                     f"of {self.heads}")
            text += f" ({', '.join(f'{a} -> {b}' for a, b in widths)})" if widths else ""
        excluded = excluded_for(candidates, self.why)
        if excluded:
            text += f"; {excluded} with another head count excluded"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"heads": self.heads, "terms": list(self.terms), "flag": self.flag}


def head_rule(config) -> Optional[HeadRule]:
    """The `HeadRule` of the run's general stage (config: `PipelineConfig`), or None: its
    terms take any head count, or the recipe, its terms or the teacher cannot be read
    (preflight then reports that)."""
    try:
        recipe = get_recipe(config.general.recipe)
        terms = recipe.terms(config)
    except ValueError:
        return None
    names = tuple(t.name for t in terms if t.compares_teacher_heads)
    if not names:
        return None
    try:  # the teacher's config.json alone, as preflight reads it
        heads = inspect_model(config.models.teacher).config.num_heads
    except (ValueError, OSError):  # CheckpointError and ConfigError are ValueErrors
        return None
    return HeadRule(heads, names, recipe.terms_flag(config))


@dataclasses.dataclass(frozen=True)
class LayerRule:
    """`--layer_mapping` (`mapping`) maps each student layer onto one of the `layers`
    layers of the teacher named `teacher` (a flag): a candidate it refuses is excluded."""

    mapping: str
    layers: int
    teacher: str

    @property
    def builtin(self) -> bool:
        return self.mapping.strip().lower() in STRATEGIES

    @property
    def why(self) -> str:
        if self.builtin:
            return (f"--layer_mapping={self.mapping.strip().lower()} maps each student layer "
                    f"onto its own layer of the teacher ({self.teacher}), which has "
                    f"{self.layers}")
        count = len([p for p in self.mapping.split(",") if p.strip()])
        return (f"--layer_mapping={self.mapping} names {count} teacher layers, one per "
                "student layer")

    def check(self, candidate: Candidate) -> Candidate:
        """`candidate`, excluded (with the reason) when the mapping refuses its layers."""
        if candidate.excluded:
            return candidate
        try:
            layer_map(self.mapping, candidate.shape.layers, self.layers)
        except ValueError:
            return dataclasses.replace(
                candidate, excluded=f"{candidate.shape.layers} layers; {self.why}")
        return candidate

    def nothing_left(self, m) -> str:
        """The error when the rule (with any head rule) excludes every candidate of `m`."""
        where = none_left(m)
        if self.builtin:
            return (f"{where} left has at most {self.layers} layers, and {self.why}; add "
                    f"shapes of at most {self.layers} layers, or give --layer_mapping an "
                    "explicit list of teacher layers, one per student layer (repeats "
                    "allowed, e.g. 1,2,3,4,5,6,6,6).")
        count = len([p for p in self.mapping.split(",") if p.strip()])
        return (f"{where} left has {count} layers, and {self.why}; add shapes of {count} "
                "layers, or use --layer_mapping=uniform (at most the teacher's "
                f"{self.layers} layers).")

    def note(self, candidates: Sequence[Candidate]) -> str:
        """What the rule excluded from `candidates`, for the reason."""
        excluded = excluded_for(candidates, self.why)
        return f"; {excluded} excluded for their layer count ({self.why})" if excluded else ""

    def as_dict(self) -> dict[str, Any]:
        return {"mapping": self.mapping, "layers": self.layers, "teacher": self.teacher}


def layer_rule(config) -> Optional[LayerRule]:
    """The `LayerRule` of the run (config: `PipelineConfig`): the teacher with the fewest
    layers among `--teacher` and `--task_teacher`; None when no teacher can be read or
    `--layer_mapping` is wrong whatever the student (preflight then reports that)."""
    mapping = config.loss.layer_mapping
    m, found = config.models, []
    teachers = [("--teacher", m.teacher)] + (
        [("--task_teacher", m.task_teacher)] if m.teacher_given else [])
    for flag, path in teachers:
        if not path:
            continue
        try:
            found.append((inspect_model(path).config.num_layers, f"{flag}={path}"))
        except (ValueError, OSError):
            return None
    if not found:
        return None
    layers, teacher = min(found)
    rule = LayerRule(mapping, layers, teacher)
    if not rule.builtin:
        try:  # the list alone (length checked against itself): its values must fit
            layer_map(mapping, len([p for p in mapping.split(",") if p.strip()]), layers)
        except ValueError:
            return None
    return rule


@dataclasses.dataclass(frozen=True)
class InitRule:
    """The general stage copies the teacher's layers into the student (`flag` asks for
    it): a candidate needs the teacher's `hidden` size and `heads` and at most its
    `intermediate` feed-forward units. `layers`: the teacher's, for the grid."""

    hidden: int
    heads: int
    intermediate: int
    layers: int
    flag: str
    # The feed-forward sizes of the grid, as fractions of the teacher's.
    FFN_FRACTIONS = (1.0, 0.75, 0.5, 0.25)

    @property
    def why(self) -> str:
        return (f"{self.flag} copies the teacher's layers ({self.hidden} wide, "
                f"{self.heads} heads, at most its {self.intermediate} feed-forward units)")

    def grid(self) -> list[Candidate]:
        """1..`layers` layers of the teacher's width and heads, each with the teacher's
        feed-forward size and the FFN_FRACTIONS of it (the candidates in place of the
        default ones, none of which has the teacher's width)."""
        ffns = sorted({max(1, round(self.intermediate * f)) for f in self.FFN_FRACTIONS},
                      reverse=True)
        return [Candidate(Shape(n, self.hidden, self.heads, ffn))
                for n in range(1, self.layers + 1) for ffn in ffns]

    def check(self, candidate: Candidate) -> Candidate:
        """`candidate`, excluded (with the reason) when it cannot start from the teacher."""
        s = candidate.shape
        if candidate.excluded:
            return candidate
        if (s.hidden, s.heads) != (self.hidden, self.heads):
            return dataclasses.replace(
                candidate, excluded=f"{s.hidden} wide, {s.heads} heads; {self.why}")
        if s.intermediate > self.intermediate:
            return dataclasses.replace(
                candidate, excluded=f"{s.intermediate} feed-forward units; {self.why}")
        return candidate

    def nothing_left(self, m) -> str:
        """The error when every candidate of `m` (`ModelsConfig`) is excluded."""
        where = none_left(m)
        other = ("train from random weights (--noinit_from_teacher)"
                 if self.flag == "--init_from_teacher" else "use another --recipe")
        return (f"{where} left can start from the teacher, and {self.why}; give shapes "
                f"LAYERSx{self.hidden}x{self.heads}xFFN with FFN <= {self.intermediate} "
                f"(or leave --latency_candidates at its default for the teacher's own "
                f"grid), or {other}.")

    def note(self, candidates: Sequence[Candidate], grid: bool) -> str:
        """What the rule did to `candidates`, for the reason."""
        if grid:
            ffns = sorted({c.shape.intermediate for c in candidates}, reverse=True)
            return (f"; the candidates are the teacher's own shapes, 1-{self.layers} layers "
                    f"x feed-forward {', '.join(map(str, ffns))} ({self.why})")
        excluded = excluded_for(candidates, self.why)
        return f"; {excluded} excluded that cannot start from the teacher ({self.why})" \
            if excluded else ""

    def as_dict(self) -> dict[str, Any]:
        return {"hidden": self.hidden, "heads": self.heads,
                "intermediate": self.intermediate, "layers": self.layers, "flag": self.flag}


def init_rule(config) -> Optional[InitRule]:
    """The `InitRule` of the run (config: `PipelineConfig`) when its general stage copies
    teacher layers into the student; None when it does not, or the recipe or teacher
    cannot be read (preflight then reports that)."""
    try:
        recipe = get_recipe(config.general.recipe)
        teacher = inspect_model(config.models.teacher).config
        # A student of the teacher's own shape: does the recipe start it from the teacher?
        copies = recipe.init_layers(config, teacher, teacher) is not None
    except (ValueError, OSError):
        return None
    if not copies:
        return None
    return InitRule(teacher.hidden_size, teacher.num_heads, teacher.intermediate_size,
                    teacher.num_layers, recipe.init_flag(config))


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


def choose(candidates: Sequence[Candidate], budget_ms: float, request: dict[str, Any],
           rule: Optional[HeadRule] = None, layers: Optional[LayerRule] = None,
           init: Optional[InitRule] = None, grid: bool = False) -> Sizing:
    """Apply the rule (module docstring) to the measured candidates not excluded."""
    if not budget_ms > 0:
        raise ValueError("--student_config=auto needs --latency_budget_ms > 0: the latency "
                         "one call may take on --latency_runtime.")
    eligible = [c for c in candidates if not c.excluded]
    within = [c for c in eligible if c.latency_ms <= budget_ms]
    if not within:
        fastest = min(eligible, key=lambda c: c.latency_ms)
        raise ValueError(
            f"--latency_budget_ms={budget_ms:g}: no candidate fits; the fastest, "
            f"{fastest.shape.name}, takes {fastest.latency_ms:.3g} ms on {request['runtime']} "
            f"(batch {request['batch']}, {request['seq_len']} tokens). Raise the budget or "
            "add smaller shapes to --latency_candidates (or to --latency_table).")
    best = max(within, key=lambda c: (c.shape.transformer_params, c.shape.layers,
                                      -c.latency_ms))
    rows = [c.row(budget_ms, c is best) for c in candidates]
    shape = best.shape
    reason = (f"{shape.name} has the most transformer-layer parameters "
              f"({shape.transformer_params:,}) of the {len(within)} of {len(eligible)} "
              f"candidates within {budget_ms:g} ms ({best.latency_ms:.3g} ms on "
              f"{request['runtime']})") + (rule.note(candidates) if rule else "") + (
                  layers.note(candidates) if layers else "") + (
                  init.note(candidates, grid) if init else "")
    return Sizing(request, rows, {**shape.as_dict(), "name": shape.name,
                                  "params": shape.transformer_params,
                                  "latency_ms": round(best.latency_ms, 4)}, reason)


def size_student(models_config, base: Optional[BertConfig] = None,
                 log=print, heads: Optional[HeadRule] = None,
                 layers: Optional[LayerRule] = None,
                 init: Optional[InitRule] = None) -> Sizing:
    """Measure (or read) every candidate and choose (models_config: `ModelsConfig`;
    `heads`: the general stage's `HeadRule`, `layers`: the run's `LayerRule`, `init`:
    its `InitRule`, if any)."""
    m = models_config
    if m.latency_runtime not in RUNTIMES:
        raise ValueError(f"--latency_runtime={m.latency_runtime}: use one of "
                         f"{', '.join(RUNTIMES)}.")
    request = _request(m, heads, layers, init)
    if not m.latency_budget_ms > 0:
        choose([], m.latency_budget_ms, request)  # raises the budget error
    grid = init is not None and not m.latency_table and \
        tuple(m.latency_candidates) == DEFAULT_CANDIDATES
    if m.latency_table:
        candidates = [Candidate(s, ms) for s, ms in read_table(m.latency_table)]
        if heads is not None:
            candidates = [heads.check(c) for c in candidates]
    elif grid:
        candidates = init.grid()
    else:
        candidates = [heads.fit(text) if heads is not None else Candidate(parse_shape(text))
                      for text in m.latency_candidates]
        if not candidates:
            raise ValueError("--latency_candidates: empty; name at least one shape.")
        # Rounded widths may meet (4x128 and 4x132 both give 4x132x12x528): measure once.
        unique: dict[Shape, Candidate] = {}
        for c in candidates:
            unique.setdefault(c.shape, c)
        candidates = list(unique.values())
    if heads is not None and all(c.excluded for c in candidates):
        raise ValueError(heads.nothing_left(m))
    if init is not None:
        candidates = [init.check(c) for c in candidates]
        if all(c.excluded for c in candidates):
            raise ValueError(init.nothing_left(m))
    if layers is not None:
        candidates = [layers.check(c) for c in candidates]
        if all(c.excluded for c in candidates):
            raise ValueError(layers.nothing_left(m))
    for i, c in enumerate(candidates):
        if c.latency_ms is None and not c.excluded:
            ms = measure(c.shape, m.latency_runtime, m.latency_seq_len, m.latency_batch,
                         base=base)
            log(f"[auto student] {c.shape.name:<18} {ms:9.3f} ms on {m.latency_runtime}")
            candidates[i] = dataclasses.replace(c, latency_ms=ms)
    return choose(candidates, m.latency_budget_ms, request, heads, layers, init, grid)


def plot(sizing: Sizing, path: str) -> str:
    """Latency against transformer-layer parameters, the budget line, the choice; PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    measured = [c for c in sizing.candidates if c["latency_ms"] is not None]
    for kind, colour, marker, label in (("fits", "tab:green", "o", "within budget"),
                                        ("over", "tab:grey", "o", "over budget"),
                                        ("excluded", "tab:grey", "x", "excluded")):
        pts = [c for c in measured if ("excluded" if c.get("excluded") else
                                       "fits" if c["within_budget"] else "over") == kind]
        if pts:
            ax.scatter([c["params"] / 1e6 for c in pts], [c["latency_ms"] for c in pts],
                       c=colour, marker=marker, label=label, s=22)
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
    rule, layers, init = head_rule(config), layer_rule(config), init_rule(config)
    sizing = _reuse(folder, m, rule, layers, init) or size_student(
        m, log=log, heads=rule, layers=layers, init=init)
    log(f"[auto student] {sizing.reason}")
    path = write(sizing, folder, BertConfig())
    models = dataclasses.replace(m, student_config=path)
    return dataclasses.replace(config, models=models), sizing


def _request(m, rule: Optional[HeadRule] = None, layers: Optional[LayerRule] = None,
             init: Optional[InitRule] = None) -> dict[str, Any]:
    """What the choice depends on: the --latency_* flags, the general stage's head rule,
    the layer rule and the init rule (another recipe, --loss_terms, --layer_mapping,
    --init_from_teacher or teacher may change the candidates)."""
    return {"budget_ms": m.latency_budget_ms, "runtime": m.latency_runtime,
            "seq_len": m.latency_seq_len, "batch": m.latency_batch,
            "table": m.latency_table or None,
            "candidates": None if m.latency_table else list(m.latency_candidates),
            "teacher_heads": rule.as_dict() if rule is not None else None,
            "teacher_layers": layers.as_dict() if layers is not None else None,
            "teacher_init": init.as_dict() if init is not None else None}


def _reuse(folder: str, m, rule: Optional[HeadRule], layers: Optional[LayerRule] = None,
           init: Optional[InitRule] = None) -> Optional[Sizing]:
    path = posixpath.join(folder, "sizing.json")
    if not files.isfile(path):
        return None
    data = json.loads(files.read_text(path))
    if data.get("request") != _request(m, rule, layers, init):
        return None
    return Sizing(data["request"], data["candidates"], data["student"], data["reason"])
