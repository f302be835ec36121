"""TinyBERT data augmentation (Algorithm 1) of a task's training file.

  bin/augment --task=SST-2 --data_dir=glue/SST-2 --output=aug/SST-2/train_aug.tsv \
      --mlm_model=bert-base-uncased-dir --word_vectors=glove.6B.300d.txt

Algorithm 1 needs both --mlm_model and --word_vectors; --augment_fallback lets
word vectors (trained on --corpus when --word_vectors is empty, and cached)
serve every word instead. Re-running after an interruption resumes;
--shard=i/n splits the work. Prints a JSON summary (examples, rows written,
words, examples/s, mode).

--output is a new file (one of the task's own data files is refused: the augmented
rows would replace it). One writer per --output: the file is locked while it is
written (`.NAME.lock` next to it, naming host, pid, start and shard); a second
writer is refused, a dead one's lock taken over. Each shard needs its own --output: a file (or an
interrupted partial file) of another shard is refused, with the way to join
the shards: `cat train_aug.tsv.shard0 train_aug.tsv.shard1 > train_aug.tsv`
(shard 0 alone writes the header). Exit codes as every bin/ tool: 0 done; 2 an
error of the command, its data or its environment, one line `bin/augment: error:
...` naming the flag or file and the fix; 1 an internal error; 130 interrupted.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Union

from absl import logging

from tinybert_tf import files, plugins
from tinybert_tf.augment.augmenter import (
    CHUNK_SIZE,
    AugmentError,
    augment_source,
    parse_shard,
)
from tinybert_tf.cli import tool as cli
from tinybert_tf.files import read_json
from tinybert_tf.models.checkpoint import (
    SHORT_NAMES,
    CheckpointError,
    inside_model_dir_error,
    vocab_tokens,
)
from tinybert_tf.pipeline import flags as tflags
from tinybert_tf.pipeline.run.lock import FileLock
from tinybert_tf.tasks import TaskConfig, resolve_task

tflags.define_augment_tool_flags()
FLAGS = tflags.FLAGS


def _join_hint(output: str, shards: int) -> str:
    name = os.path.basename(output)
    parts = " ".join(f"{name}.shard{i}" for i in range(min(shards, 3)))
    more = " ..." if shards > 3 else ""
    return (f"Give each shard its own --output (e.g. --output={output}.shard0 for --shard=0/"
            f"{shards}), then concatenate them in shard order: `cat {parts}{more} > {name}` "
            "(shard 0 alone writes the header).")


def _sidecar(output: str) -> str:
    """Records a finished --output file: which shard wrote it, from what and with which
    settings (`augment_source`'s `done_record`)."""
    return os.path.join(os.path.dirname(output), f".{os.path.basename(output)}.shard")


def check_output_owner(output: str, shard: str) -> None:
    """Refuse an --output written (fully or partly) by another shard, or by an unsharded
    run when this one is sharded (and the reverse): the augmenter would start it over."""
    what = shard or "the whole task"
    made_by = None
    progress = read_json(output + ".progress.json", default=None, error=AugmentError)
    if os.path.exists(output):
        record = read_json(_sidecar(output), default=None, error=AugmentError)
        if record is None and progress is None:
            raise AugmentError(
                f"--output={output}: the file exists and no bin/augment run wrote it (it "
                f"has no {os.path.basename(_sidecar(output))} record beside it): the "
                "augmented rows would replace it. Give a new file, or delete this one to "
                "write there.")
        made_by = record.get("shard", "") if isinstance(record, dict) else ""
    if isinstance(progress, dict) and "shard" in progress.get("identity", {}):
        i, n = progress["identity"]["shard"]
        made_by = "" if n == 1 else f"{i}/{n}"
    if made_by is None or made_by == shard:
        return
    other = f"shard {made_by}" if made_by else "an unsharded run (the whole task)"
    n = int((shard or made_by).split("/")[1])
    raise AugmentError(f"--output={output} holds the output of {other}, and this run augments "
                       f"{what}: writing it would destroy that output. {_join_hint(output, n)} "
                       "Delete the file (and its .partial/.progress.json) to redo it.")


def output_lock(output: str, shard: str) -> FileLock:
    """The lock that makes this run the only writer of `output`."""
    path = os.path.join(os.path.dirname(output), f".{os.path.basename(output)}.lock")
    hint = (_join_hint(output, int(shard.split("/")[1])) if shard else
            "One writer per output file: wait for it to finish, or give another --output.")
    return FileLock(path, f"--output={output}", extra={"shard": shard} if shard else None,
                    hint=hint)


def run() -> None:
    """Check the flags, then augment the task into --output (locked) and print the stats."""
    plugins.load(FLAGS.plugins)  # a task or data source they register is a --task
    if not FLAGS.output:
        raise cli.UsageError("--output is required: the augmented file to write (e.g. "
                             "--output=aug/train_aug.tsv).")
    missing = [f"--{f}" for f in ("mlm_model", "word_vectors") if not FLAGS[f].value]
    if missing and not FLAGS.augment_fallback:
        raise cli.UsageError(
            f"Algorithm 1 needs {' and '.join(missing)} (an MLM model for single-piece words, "
            "GloVe vectors for the rest); or pass --augment_fallback to let word vectors "
            "trained on --corpus serve every word.")
    if FLAGS.seed < 0:
        raise cli.UsageError(f"--seed={FLAGS.seed}: must be >= 0.")
    if FLAGS.vocab and not FLAGS.mlm_model:  # it was ignored, even when missing
        raise cli.UsageError(f"--vocab={FLAGS.vocab}: only --mlm_model's vocab is checked "
                             "against it; without --mlm_model it would be ignored: drop it, "
                             "or give --mlm_model.")
    vocab = _vocab() if FLAGS.vocab else None
    tflags.check_tool_ranges(FLAGS)
    output = os.path.abspath(FLAGS.output)
    cache = FLAGS.vector_cache or os.path.join(os.path.dirname(output), "vectors")
    if os.path.isdir(output):
        raise AugmentError(f"--output={output}: is a folder; give the file to write "
                           "(e.g. train_aug.tsv inside it).")
    shard = FLAGS.shard or ""
    if shard:
        i, n = parse_shard(shard)
        shard = "" if n == 1 else f"{i}/{n}"
    task = resolve_task(TaskConfig.from_flags(FLAGS))
    check_output_format(output, task.source.augmented_name)
    check_output_is_not_an_input(output, task.source.input_paths())
    inside = inside_model_dir_error(output, "--output")
    if inside:
        raise AugmentError(inside)
    with output_lock(output, shard):
        check_output_owner(output, shard)
        stats = augment_source(
            task.source, output, mlm_model=FLAGS.mlm_model or None,
            word_vectors=FLAGS.word_vectors or None, corpus=FLAGS.corpus or None,
            num_aug=FLAGS.num_aug, replace_prob=FLAGS.replace_prob,
            num_candidates=FLAGS.num_candidates, seed=FLAGS.seed, shard=shard or None,
            batch_size=FLAGS.augment_batch_size, vector_cache_dir=cache,
            vocab=vocab, vocab_limit=FLAGS.vector_vocab_limit, done_record=_sidecar(output))
    if stats["reused"]:
        print(f"bin/augment: {output} is already augmented from this input with these "
              f"settings (recorded in {_sidecar(output)}); kept. Delete it to augment again.",
              file=sys.stderr, flush=True)
    if shard and not stats["examples"]:  # more shards than chunks of the task's examples
        print(f"bin/augment: warning: --shard={shard} holds no example: the task's training "
              f"set makes fewer chunks of {CHUNK_SIZE} examples than {shard.split('/')[1]} "
              "shards, so this shard's output holds no row (the shards' outputs still "
              "concatenate to the whole); use fewer shards.", file=sys.stderr)
    print(json.dumps(stats, indent=1))


def _vocab() -> Union[str, list[str]]:
    """--vocab: the file as given, or the tokens of a model directory or short name."""
    if files.isfile(FLAGS.vocab):
        return FLAGS.vocab  # its path names it in a vocab mismatch
    if not files.exists(FLAGS.vocab) and FLAGS.vocab.lower() not in SHORT_NAMES:
        raise cli.UsageError(f"--vocab={FLAGS.vocab}: file not found; give the task "
                             "tokenizer's vocab.txt (the teacher's), its model directory "
                             "or a model's short name (minilm-l6).")
    try:
        return vocab_tokens(FLAGS.vocab)
    except CheckpointError as e:
        raise cli.UsageError(f"--vocab={FLAGS.vocab}: {e}") from None


def check_output_format(output: str, augmented_name: str) -> None:
    """The output is written in the task data's own format (CSV stays CSV): its name must
    carry that format's extension, or it would read back as another format."""
    want = os.path.splitext(augmented_name)[1].lower()
    name = os.path.basename(output)
    # ".shardN" joins: train_aug.csv.shard1 is a part of train_aug.csv.
    base = name.split(".shard")[0] if ".shard" in name else name
    got = os.path.splitext(base)[1].lower()
    if got != want:
        stem = os.path.splitext(base)[0] or "train_aug"
        raise AugmentError(
            f"--output={output}: the task's data is written back in its own format "
            f"({want[1:].upper()}, as {augmented_name}), so "
            f"{f'a file named *{got}' if got else 'a file without an extension'} would read "
            f"back wrongly; name it {stem}{want}.")


def check_output_is_not_an_input(output: str, inputs: list[str]) -> None:
    """The augmented file replaces --output when complete: never one of the task's own
    data files (it overwrote the training file it was made from)."""
    for path in inputs:
        if files.canonical(path) == files.canonical(output):
            raise AugmentError(f"--output={output}: is the task's data file {path}, which "
                               "the augmented rows would replace; give a new file, e.g. "
                               f"{os.path.join(os.path.dirname(output), 'train_aug')}"
                               f"{os.path.splitext(output)[1]}.")


def main(argv: list[str]) -> int:
    """bin/augment with its flags parsed: the exit code (tinybert_tf.cli.tool)."""
    logging.set_verbosity(logging.WARNING)
    return cli.guard("bin/augment", run)


def entry_point() -> None:
    """`bin/augment`: the tool on sys.argv; exits with its code."""
    sys.exit(cli.run_tool("bin/augment", main, sys.argv, FLAGS, __doc__))
