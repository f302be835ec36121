"""Tiny models, data and flag values for the end-to-end pipeline tests, and pipeline
runs shared by every test of a session (see tests/conftest.py)."""
from __future__ import annotations

import atexit
import csv
import dataclasses
import fcntl
import json
import os
import random
import re
import shutil
import string
import subprocess
import sys
import tempfile
import traceback
import types
import unicodedata
from typing import Any, Callable

from tinybert_tf.startup import KERAS_OPTIONAL_IMPORTS  # imports no TensorFlow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The first line of a script a test runs in a fresh process as a server would (TensorFlow
# and tensorflow-text, not our package): what keras imports only because it is installed
# (scikit-learn, which the tests' reference checks need, and matplotlib; 1-2 s of every
# process's start) looks missing, as on a serving image. tinybert_tf.startup hides the
# same modules while the bin/ tools load TensorFlow; the tests start the tools as they are.
SERVER_SCRIPT_HEAD = "import sys; sys.modules.update({})\n".format(
    ", ".join(f"{name}=None" for name in KERAS_OPTIONAL_IMPORTS))

GOOD = ["good", "great", "fun"]
BAD = ["bad", "awful", "boring"]
FILLER = ["the", "movie", "film", "plot", "story", "actor", "is", "was", "very", "a"]


def sentence(rng: random.Random, positive: bool) -> str:
    words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]
    words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if positive else BAD))
    return " ".join(words)


def write_task(directory: str, train: int = 24, dev: int = 8, seed: int = 0,
               test: int = 0) -> str:
    """An SST-2-layout task whose label is readable from one word (and `test` unlabelled
    rows in GLUE's test.tsv layout: index, sentence)."""
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    for name, n in (("train.tsv", train), ("dev.tsv", dev)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n")
            for i in range(n):
                label = i % 2
                f.write(f"{sentence(rng, bool(label))}\t{label}\n")
    if test:
        with open(os.path.join(directory, "test.tsv"), "w", encoding="utf-8") as f:
            f.write("index\tsentence\n")
            for i in range(test):
                f.write(f"{i}\t{sentence(rng, bool(i % 2))}\n")
    return directory


def write_corpus(path: str, docs: int = 12, seed: int = 1) -> str:
    """BERT-format text: one sentence per line, blank line between documents."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(docs):
            for _ in range(rng.randint(3, 6)):
                f.write(sentence(rng, rng.random() < 0.5) + " .\n")
            f.write("\n")
    return path


# --- own data (CSV, JSON lines, TSV, CoNLL) ------------------------------------------------

# Fast settings of the own-data runs: a random student (no general stage), one teacher
# epoch, few timing repeats; each run adds what it exercises.
FAST = dict(data_dir="", general_model="none", teacher_epochs=1, latency_runs=1,
            export_latency_runs=1, export_formats=["saved_model", "float32"])
NER_TAGS = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]


def write_reviews_csv(path, n: int, seed: int) -> str:
    """text,label,id with string labels; commas and quotes force CSV quoting."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, lineterminator="\r\n")
        w.writerow(["id", "text", "label"])
        for i in range(n):
            positive = i % 2 == 1
            text = sentence(rng, positive)
            if i % 3 == 0:
                text = f'{text}, "{rng.choice(GOOD if positive else BAD)}"'
            w.writerow([f"r{i}", text, "positive" if positive else "negative"])
    return str(path)


def write_pairs_jsonl(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    names = ["contradiction", "entailment", "neutral"]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            a, b = rng.random() < 0.5, rng.random() < 0.5
            label = "neutral" if i % 3 == 0 else names[int(a == b)]
            f.write(json.dumps({"premise": sentence(rng, a), "hypothesis": sentence(rng, b),
                                "label": label, "source": "test"}) + "\n")
    return str(path)


def write_scores_tsv(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("sentence\tscore\n")
        for i in range(n):
            positive = i % 2 == 0
            score = (4.0 if positive else 1.0) + rng.random()
            f.write(f"{sentence(rng, positive)}\t{score:.2f}\n")
    return str(path)


def ner_sentence(rng: random.Random) -> tuple[list[str], list[str]]:
    """PER = actor [cat], LOC = plot [mat]; other words O, some capitalised, some
    multi-piece (movies, playing)."""
    words, tags = [], []
    for _ in range(rng.randint(3, 7)):
        r = rng.random()
        if r < 0.2:
            words += ["actor", "cat"][: rng.randint(1, 2)]
        elif r < 0.35:
            words += ["plot", "mat"][: rng.randint(1, 2)]
        else:
            words.append(rng.choice(FILLER[:8] + GOOD + ["movies", "playing"]))
            tags.append("O")
            continue
        kind = "PER" if words[len(tags)] == "actor" else "LOC"
        tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(words) - len(tags) - 1)
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    return words, tags


def write_conll(path, n: int, seed: int) -> str:
    """CoNLL-2003 layout: word POS chunk tag, -DOCSTART- lines, blank lines between."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("-DOCSTART- -X- -X- O\n\n")
        for _ in range(n):
            words, tags = ner_sentence(rng)
            f.write("".join(f"{w} NN I-NP {t}\n" for w, t in zip(words, tags)) + "\n")
    return str(path)


# (vocab, sizes, head, seed, labels) -> a directory write_teacher filled in this process.
_TEACHERS: dict = {}


def write_teacher(directory: str, vocab, hidden=32, layers=2, heads=4, dropout=0.1,
                  head=None, seed=3, label_names=None, positions=64) -> str:
    """A random tiny BERT directory; `head` with `label_names` (default "0", "1");
    `positions`: its position table (max_position_embeddings).

    Built once per process for each set of arguments, in a private folder; every call
    copies those files (the same weights: the model is seeded with `seed`)."""
    import keras

    from tinybert_tf.config import BertConfig
    from tinybert_tf.models import BertModel
    from tinybert_tf.models.checkpoint import save_model

    keras.utils.set_random_seed(seed)
    key = (tuple(vocab), hidden, layers, heads, dropout, head, seed,
           None if label_names is None else tuple(label_names), positions)
    if key in _TEACHERS:
        shutil.copytree(_TEACHERS[key], directory, dirs_exist_ok=True)
        return directory
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_layers=layers,
                        num_heads=heads, intermediate_size=2 * hidden,
                        max_position_embeddings=positions, hidden_dropout=dropout,
                        attention_dropout=dropout)
    kwargs = {"head": head}
    if head in ("classifier", "token_classifier"):
        names = list(label_names or ["0", "1"])
        kwargs.update(num_labels=len(names), label_names=names)
    # Built in a private folder that no test sees (a test may damage its copy).
    private = tempfile.mkdtemp(prefix="tiny_teacher_")
    atexit.register(shutil.rmtree, private, True)
    built = save_model(BertModel(config, vocab=vocab, **kwargs), os.path.join(private, "m"))
    _TEACHERS[key] = built
    shutil.copytree(built, directory, dirs_exist_ok=True)
    return directory


def write_student_config(path: str, vocab_size: int, dropout=0.1, layers=1) -> str:
    """A 16-wide student of `layers` layers. One by default: every layer map of a
    pipeline test is then the uniform map onto the 2-layer tiny teacher's top layer, and
    the runs trace and train a smaller graph (docs/measurements.md). A test of a map or of
    what two student layers do asks for `layers=2`."""
    from tinybert_tf.config import BertConfig
    config = BertConfig(vocab_size=vocab_size, hidden_size=16, num_layers=layers, num_heads=4,
                        intermediate_size=32, max_position_embeddings=64,
                        hidden_dropout=dropout, attention_dropout=dropout)
    with open(path, "w", encoding="utf-8") as f:
        f.write(config.to_json())
    return path


def flag_values(**overrides) -> types.SimpleNamespace:
    """Every pipeline flag at its default, then `overrides`."""
    from tinybert_tf.pipeline import flags as tb_flags
    fv = tb_flags.distill_flags()
    values = {name: fv[name].default for name in fv}
    unknown = set(overrides) - set(values)
    assert not unknown, f"not pipeline flags: {unknown}"
    values.update(overrides)
    return types.SimpleNamespace(**values)


def argv(ns: types.SimpleNamespace) -> list[str]:
    """The command line (after the program name) for flag values `ns`."""
    out = []
    for name, value in sorted(vars(ns).items()):
        if value is None or name in ("flagfile", "undefok"):
            continue
        if isinstance(value, bool):
            out.append(f"--{name}" if value else f"--no{name}")
        elif isinstance(value, (list, tuple)):
            out.append(f"--{name}={','.join(str(v) for v in value)}")
        else:
            out.append(f"--{name}={value}")
    return out


def run(ns: types.SimpleNamespace) -> dict:
    """The pipeline in-process, as `bin/distill` runs it, for flag values `ns`."""
    from tinybert_tf.pipeline.main import run_argv
    return run_argv(["bin/distill", *argv(ns)])


def tiny_flags(tmp, vocab, **overrides) -> types.SimpleNamespace:
    """Flags for a seconds-long run of every stage on tiny models and data.

    Training steps are traced, as in a real run. (`--run_eagerly` was tried here: with
    models that build in 0.2 s, the eager steps cost more than the traces they save;
    test_recipes, test_task_phases and test_stage_reuse took 275 s eager and 241 s
    traced on the 2-core AMD host, test_pipeline, test_export_artifacts and
    test_faults 279 s and 282 s.)

    The teacher computes in float32 on every host (`--teacher_precision=auto` picks
    bfloat16 where the CPU has AVX512-BF16, and the tests that compare two ways of
    training, eager and traced, cached and recomputed, agree to float32 rounding
    only); a test of the bfloat16 teacher asks for it."""
    base = dict(
        output_dir=str(tmp / "out"), task="sst-2",
        data_dir=write_task(str(tmp / "task")),
        corpus=write_corpus(str(tmp / "corpus.txt")),
        teacher=write_teacher(str(tmp / "teacher"), vocab),
        student_config=write_student_config(str(tmp / "student.json"), len(vocab)),
        general_max_seq_len=32, general_batch_size=4, general_epochs=1,
        teacher_epochs=2, teacher_lr=1e-3, teacher_batch_size=4,
        num_aug=2, word_vectors="", max_seq_len=24, task_batch_size=4,
        intermediate_epochs=1, intermediate_lr=1e-3, pred_epochs=1, pred_lr=1e-3,
        checkpoint_every=3, latency_runs=1, export_latency_runs=1, eval_batch_size=8,
        export_formats=["saved_model", "float32"], representative_examples=8,
        augment_fallback=True, teacher_precision="float32",
    )
    base.update(overrides)
    return flag_values(**base)


def write_flagfile(ns: types.SimpleNamespace, path: str) -> str:
    """absl flagfile for `ns` (for bin/distill in a subprocess)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(argv(ns)) + "\n")
    return path


def distill_command(flagfile: str, *extra: str) -> list[str]:
    return [sys.executable, os.path.join(REPO, "bin", "distill"), f"--flagfile={flagfile}",
            *extra]


def run_distill(flagfile: str, *extra: str, env=None, timeout=300) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    return subprocess.run(distill_command(flagfile, *extra), capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


def keras_reference(model_dir: str, task, length: int):
    """What export parity compares every format with: the Keras model of `model_dir`
    on the dev split of `task` (a `tasks.Task`), in the export space
    (`task.type.tflite_output`: probabilities for classifiers) [N, ...], and the
    packed dev inputs with the task's extras (e.g. `word_index` for token tasks)."""
    from tinybert_tf.export.common import keras_outputs
    from tinybert_tf.models.checkpoint import load_model, load_tokenizer

    dev = task.examples(task.dev_splits[0])
    model = load_model(model_dir)
    inputs = task.type.export_inputs(
        load_tokenizer(model, length), [ex.text_a for ex in dev],
        [ex.text_b for ex in dev] if task.is_pair else None, length)
    return keras_outputs(model, task.type, inputs), inputs


def parity_reference(ns: types.SimpleNamespace):
    """`keras_reference` of a finished run's export: its task student on its dev set."""
    from tinybert_tf.pipeline.main import parse_argv
    from tinybert_tf.tasks import resolve_task

    task = resolve_task(parse_argv(["bin/distill", *argv(ns)]).task)
    length = read_json(os.path.join(ns.output_dir, "export", "parity.json"))["max_seq_len"]
    return keras_reference(os.path.join(ns.output_dir, "task", "model"), task, length)


def load_weights(model_dir: str) -> dict:
    from safetensors.numpy import load_file
    return load_file(os.path.join(model_dir, "model.safetensors"))


def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# --- SQuAD ---------------------------------------------------------------------------------

SQUAD_FIXTURES = os.path.join(REPO, "tests", "fixtures", "squad")
SQUAD_V1 = os.path.join(SQUAD_FIXTURES, "dev-v1.1.json")
SQUAD_V2 = os.path.join(SQUAD_FIXTURES, "dev-v2.0.json")
# Small windows so the fixture's contexts need several (BERT: 384 / 128 / 64).
SQUAD_SIZES = dict(max_seq_len=64, doc_stride=32, max_query_len=16)


def squad_vocab() -> list[str]:
    """Specials, letters and every word of the SQuAD fixtures: a few pieces per word."""
    from tinybert_tf.data import squad
    from tinybert_tf.tokenizer import SPECIAL_TOKENS

    words = []
    for path in (SQUAD_V1, SQUAD_V2):
        for ex in squad.read_squad(path, "1.1" if path == SQUAD_V1 else "2.0"):
            for text in (ex.question, ex.context):
                text = unicodedata.normalize("NFD", text.lower())
                text = "".join(c for c in text if unicodedata.category(c) != "Mn")
                words += re.findall(r"\w+", text)
    letters = list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
    digits = list(string.digits) + [f"##{d}" for d in string.digits]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert set(SPECIAL_TOKENS) <= set(specials)
    return list(dict.fromkeys(specials + list(string.punctuation) + letters + digits + words))


def write_squad_corpus(path: str) -> str:
    """The SQuAD fixtures' contexts, five times: Word2Vec neighbours for --augment_fallback."""
    from tinybert_tf.data import squad

    with open(path, "w", encoding="utf-8") as f:
        for _ in range(5):
            for p in (SQUAD_V1, SQUAD_V2):
                for ex in squad.read_squad(p, "1.1" if p == SQUAD_V1 else "2.0"):
                    f.write(ex.context + "\n\n")
    return path


def squad_flags(tmp, vocab, **overrides) -> types.SimpleNamespace:
    """Flags for a tiny SQuAD v2.0 run of every stage from a random teacher."""
    base = dict(task="squad2.0", data_dir="", train_file=SQUAD_V2, validation_file=SQUAD_V2,
                **SQUAD_SIZES,
                general_model="none", teacher=write_teacher(str(tmp / "teacher"), vocab),
                corpus=write_squad_corpus(str(tmp / "squad_corpus.txt")), teacher_epochs=3,
                teacher_lr=3e-3, pred_epochs=2, eval_batch_size=16, num_aug=2,
                export_formats=["saved_model", "float32"], export_latency_runs=1)
    base.update(overrides)
    return tiny_flags(tmp, vocab, **base)


# --- shared runs ----------------------------------------------------------------------------

def shared_folder(tmp_path_factory, name: str, build: Callable[[Any], Any]) -> tuple[Any, Any]:
    """(folder, what `build(folder)` returned), built once per test session.

    The folder lies under the base temp folder every pytest-xdist worker of the session
    shares; the first worker to ask builds it under a file lock, the others wait for it
    and reuse it. `build` returns something JSON can hold. A failed build is recorded,
    so the other workers fail at once with its error instead of building it again.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' basetemps are popen-gw0, popen-gw1, ... in it
    root = root / "shared"
    root.mkdir(exist_ok=True)
    folder, done, failed = root / name, root / f"{name}.json", root / f"{name}.failed"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failed.exists():
            raise RuntimeError(f"shared folder {name!r} failed to build in another worker:\n"
                               + failed.read_text())
        if not done.exists():
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            try:
                result = build(folder)
            except BaseException:
                failed.write_text(traceback.format_exc()[-5000:])
                raise
            done.write_text(json.dumps(result, default=_plain))
        return folder, json.loads(done.read_text())


def _plain(value):
    """JSON for numpy scalars (a run's results hold some)."""
    return value.item() if hasattr(value, "item") else str(value)


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """A finished pipeline run: its flag values and what `run` returned per stage.

    Read-only: a test that runs the pipeline on it again first takes a `copy`.
    """
    ns: types.SimpleNamespace
    results: dict
    folder: Any  # pathlib.Path holding the run's inputs and `ns.output_dir`

    def __getattr__(self, name: str):
        """The run's flag values read as attributes: `run.output_dir`, `run.train_file`."""
        if name.startswith("__") or name == "ns":
            raise AttributeError(name)
        return getattr(self.ns, name)

    def copy(self, dest, **overrides) -> types.SimpleNamespace:
        """Flag values for a copy of the finished output folder at `dest` (plus
        `overrides`): the pipeline finds its stages done there, as in the original."""
        shutil.copytree(self.ns.output_dir, dest, symlinks=True)
        return with_flags(self.ns, output_dir=str(dest), **overrides)


def with_flags(ns: types.SimpleNamespace, **overrides) -> types.SimpleNamespace:
    """A copy of flag values `ns` with `overrides`."""
    return type(ns)(**{**vars(ns), **overrides})


def shared_run(tmp_path_factory, name: str,
               make_flags: Callable[[Any], types.SimpleNamespace]) -> PipelineRun:
    """The pipeline run with flag values `make_flags(folder)`, once per session
    (`shared_folder`)."""
    def build(folder):
        ns = make_flags(folder)
        return {"flags": vars(ns), "results": run(ns)}

    folder, data = shared_folder(tmp_path_factory, name, build)
    return PipelineRun(types.SimpleNamespace(**data["flags"]), data["results"], folder)


# --- bin/ tools and scripts in this process -------------------------------------------------

def load_script(path: str) -> types.ModuleType:
    """The script at `path` (benchmarks/, tools/, examples/) as a module: its imports and
    definitions run, its `main` not."""
    import importlib.util
    name = os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(f"script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_tool(name: str) -> types.ModuleType:
    """bin/NAME's module, tinybert_tf.tools.NAME, so a test runs its `main` here instead of
    paying a fresh TensorFlow import in a subprocess. Loaded anew when a test before has
    loaded it: conftest removed the flags it defined then."""
    import importlib
    import sys
    module = sys.modules.get(f"tinybert_tf.tools.{name}")
    if module is None:
        return importlib.import_module(f"tinybert_tf.tools.{name}")
    return importlib.reload(module)


def run_tool(name: str, *args: str) -> int:
    """The exit code of `bin/NAME ARGS...` run in this process as its `__main__` runs it
    (help, flag parsing, errors as one line on stderr); its flags are reset afterwards."""
    from tinybert_tf.cli import tool as cli
    tool = load_tool(name)
    try:
        return cli.run_tool(f"bin/{name}", tool.main, [f"bin/{name}", *args], tool.FLAGS,
                            tool.__doc__)
    finally:
        tool.FLAGS.unparse_flags()


# --- the quickstart flagfile ----------------------------------------------------------------

QUICKSTART = os.path.join(REPO, "configs", "quickstart_text_classification.cfg")


def quickstart_argv(tmp, vocab) -> list[str]:
    """bin/distill's command line for the quickstart flagfile as shipped, with toy models
    (a 2-layer 32-wide teacher, a 1-layer student of its width: --init_from_teacher copies
    into it), the review CSVs and step caps on the command line."""
    from tinybert_tf.config import BertConfig
    student = BertConfig(vocab_size=len(vocab), hidden_size=32, num_layers=1, num_heads=4,
                         intermediate_size=64, max_position_embeddings=64)
    (tmp / "student.json").write_text(student.to_json(), encoding="utf-8")
    return ["bin/distill", f"--flagfile={QUICKSTART}",
            f"--train_file={write_reviews_csv(tmp / 'train.csv', 24, 0)}",
            f"--validation_file={write_reviews_csv(tmp / 'dev.csv', 8, 1)}",
            f"--output_dir={tmp / 'out'}",
            f"--teacher={write_teacher(str(tmp / 'teacher'), vocab)}",
            f"--student_config={tmp / 'student.json'}",
            f"--corpus={write_corpus(str(tmp / 'corpus.txt'))}",
            "--general_max_seq_len=32", "--general_batch_size=4", "--general_max_steps=2",
            "--teacher_batch_size=4", "--teacher_max_steps=3", "--max_seq_len=24",
            "--task_batch_size=4", "--task_max_steps=2", "--num_aug=1", "--checkpoint_every=2",
            "--latency_runs=1", "--export_latency_runs=1"]


def argv_flag_values(argv: list[str]) -> types.SimpleNamespace:
    """Every pipeline flag's value for a bin/distill command line (flagfiles expanded)."""
    from tinybert_tf.cli.flagfiles import expand_flagfiles
    from tinybert_tf.pipeline import flags as tb_flags
    fv = tb_flags.distill_flags()
    fv(expand_flagfiles(argv))
    return types.SimpleNamespace(**{name: fv[name].value for name in fv})


def shared_argv_run(tmp_path_factory, name: str,
                    make_argv: Callable[[Any], list[str]]) -> PipelineRun:
    """The pipeline run of the command line `make_argv(folder)` (run as given, flagfiles
    and all), once per session (`shared_folder`); `.ns` holds every flag's value."""
    def build(folder):
        from tinybert_tf.pipeline.main import run_argv
        command = make_argv(folder)
        return {"flags": vars(argv_flag_values(command)), "results": run_argv(command)}

    folder, data = shared_folder(tmp_path_factory, name, build)
    return PipelineRun(types.SimpleNamespace(**data["flags"]), data["results"], folder)


def parse(name: str, monkeypatch, tmp_path=None):
    """The flag values `bin/distill --flagfile=configs/NAME` would run with, parsed from
    outside the repository: nested flagfiles resolve against the including file."""
    # Imported here: this module is imported by conftest before TensorFlow is set up.
    from tinybert_tf.cli.flagfiles import expand_flagfiles
    from tinybert_tf.pipeline import flags as tb_flags

    monkeypatch.chdir(tmp_path or "/")
    values = tb_flags.distill_flags()  # a fresh FlagValues: the process-wide FLAGS stay as is
    values(expand_flagfiles(
        ["bin/distill", f"--flagfile={os.path.join(REPO, 'configs', name)}"]))
    return values
