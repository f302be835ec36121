"""`--task=text_classification | text_regression | token_classification`: your own files.

Each factory pairs a task type with a source of `tinybert_tf.data.file_sources`
built from `TaskConfig` (the flags `--train_file`, `--validation_file`,
`--test_file`, `--data_format`, `--text_column`, `--text_pair_column`,
`--label_column`, `--tag_column`, `--labels`). Building the task reads the
training file (for its label set), so a malformed file fails before anything
runs, with its file and line.

  text_classification    accuracy (primary), macro_f1, f1_<label> per class
  text_regression        pearson, spearman, pearson_spearman_mean (primary)
  token_classification   entity f1 (primary), precision, recall; token accuracy

Sequence lengths by default: 64 single sentences, 128 pairs (the paper's),
128 for token classification (whole sentences in pieces; CoNLL-2003's longest
sentences need more, see configs/td_conll2003.cfg).
"""
from __future__ import annotations

from tinybert_tf.data.examples import DataError
from tinybert_tf.data.file_sources import TabularSource, TokenSource
from tinybert_tf.tasks.catalog import Task, TaskConfig, register_task
from tinybert_tf.tasks.sentence import Classification, Regression
from tinybert_tf.tasks.token import TokenClassification

CLASSIFICATION_METRICS = ("accuracy", "macro_f1", "per_class_f1")


def own_files(config: TaskConfig) -> dict[str, str]:
    """split -> file from --train_file / --validation_file (required) / --test_file."""
    if config.data_dir:
        raise DataError(f"--data_dir={config.data_dir} is for GLUE tasks; --task={config.task} "
                        "reads --train_file and --validation_file: drop --data_dir.")
    missing = [flag for flag, value in (("--train_file", config.train_file),
                                        ("--validation_file", config.validation_file))
               if not value]
    if missing:
        raise DataError(f"--task={config.task} needs {' and '.join(missing)}: your labelled "
                        "training data and the dev data its models are selected and "
                        "evaluated on (docs/data.md, 'Your own data').")
    files = {"train": config.train_file, "dev": config.validation_file}
    if config.test_file:
        files["test"] = config.test_file
    return files


def _tabular(config: TaskConfig, regression: bool) -> TabularSource:
    return _checked(TabularSource(
        own_files(config), config.text_column, config.text_pair_column or None,
        config.label_column, config.data_format or None, labels=list(config.labels) or None,
        regression=regression))


def _checked(source):
    """The source, its --test_file read now: preflight reads train and dev, and a test
    label missing from training is as much an error (file and line named) as a dev one."""
    if "test" in source.splits():
        source.load("test")
    return source


def _sentence_len(pair: bool) -> int:
    return 128 if pair else 64


@register_task("text_classification")
def text_classification(config: TaskConfig) -> Task:
    """Class names from the training file (sorted) or --labels."""
    source = _tabular(config, regression=False)
    if len(source.label_names) < 2:
        raise DataError(f"{config.train_file}: every example has the label "
                        f"{source.label_names[0]!r} (column {config.label_column!r}); a "
                        "classifier needs at least two classes (list them with --labels if "
                        "some never occur in training).")
    pair = bool(config.text_pair_column)
    return Task(config.task.lower(), Classification(source.label_names, CLASSIFICATION_METRICS),
                source, pair, _sentence_len(pair))


@register_task("text_regression")
def text_regression(config: TaskConfig) -> Task:
    """A number per text (or pair) in --label_column."""
    if config.labels:
        raise DataError(f"--labels={','.join(config.labels)}: --task=text_regression predicts "
                        "a number, it has no classes; drop --labels (or use "
                        "--task=text_classification).")
    source = _tabular(config, regression=True)
    pair = bool(config.text_pair_column)
    return Task(config.task.lower(), Regression(), source, pair, _sentence_len(pair))


@register_task("token_classification")
def token_classification(config: TaskConfig) -> Task:
    """Tags per word from CoNLL or JSON lines; --text_column / --label_column, when
    changed from their defaults, name the JSON keys of the words and the tags."""
    if config.text_pair_column:
        raise DataError(f"--text_pair_column={config.text_pair_column}: "
                        "--task=token_classification tags one sentence per example; drop it.")
    tokens_key = config.text_column if config.text_column != "text" else "tokens"
    tags_key = config.label_column if config.label_column != "label" else "tags"
    # IOB2 tags get entity metrics; plain tags (part of speech) token accuracy.
    source = _checked(TokenSource(own_files(config), config.data_format or None,
                                  config.tag_column, labels=list(config.labels) or None,
                                  tokens_key=tokens_key, tags_key=tags_key, scheme="auto"))
    return Task(config.task.lower(), TokenClassification(source.label_names), source,
                is_pair=False, default_max_seq_len=128)
