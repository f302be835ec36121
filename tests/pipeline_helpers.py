"""Tiny models, data and flag values for the end-to-end pipeline tests."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


def write_teacher(directory: str, vocab, hidden=32, layers=2, heads=4, dropout=0.1,
                  head=None, seed=3, label_names=None) -> str:
    """A random tiny BERT directory; `head` with `label_names` (default "0", "1")."""
    import keras

    from tinybert_tf.config import BertConfig
    from tinybert_tf.models import BertModel
    from tinybert_tf.models.checkpoint import save_model

    keras.utils.set_random_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_layers=layers,
                        num_heads=heads, intermediate_size=2 * hidden,
                        max_position_embeddings=64, hidden_dropout=dropout,
                        attention_dropout=dropout)
    kwargs = {"head": head}
    if head in ("classifier", "token_classifier"):
        names = list(label_names or ["0", "1"])
        kwargs.update(num_labels=len(names), label_names=names)
    save_model(BertModel(config, vocab=vocab, **kwargs), directory)
    return directory


def write_student_config(path: str, vocab_size: int, dropout=0.1) -> str:
    from tinybert_tf.config import BertConfig
    config = BertConfig(vocab_size=vocab_size, hidden_size=16, num_layers=2, num_heads=4,
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
    """Flags for a seconds-long run of every stage on tiny models and data."""
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
        checkpoint_every=3, latency_runs=2, eval_batch_size=8,
        export_formats=["saved_model", "float32"], representative_examples=8,
        augment_fallback=True,
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


def load_weights(model_dir: str) -> dict:
    from safetensors.numpy import load_file
    return load_file(os.path.join(model_dir, "model.safetensors"))


def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
