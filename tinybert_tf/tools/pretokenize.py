"""Pre-tokenise a general corpus into packed TFRecord shards (all cores, progress bar).

  bin/pretokenize --corpus='wiki/*.txt.gz' --vocab=teacher_dir/vocab.txt \
      --output=data/wiki128 --num_shards=64 --max_seq_len=128

Writes PREFIX-00000-of-000NN.tfrecord ... (each atomically) and, last,
PREFIX.json; read them back with --corpus='PREFIX-*.tfrecord' in bin/distill.
One run at a time writes a prefix (`.PREFIX.lock`); it removes the temporaries a
killed run left, and keeps a set made from the same corpus with the same settings.
Prints the metadata as JSON. A bad corpus file (truncated .gz/.bz2, invalid
UTF-8, a cut XML dump) or an empty corpus: one line on stderr naming the file,
exit 2, and no shard or PREFIX.json of this run left behind. Exit codes as every
bin/ tool: 0 done; 2 an error of the command, its data or its environment (one
line `bin/pretokenize: error: ...`); 1 an internal error; 130 interrupted.
"""
from __future__ import annotations

import json
import os
import sys

from tinybert_tf import files
from tinybert_tf.cli import tool as cli
from tinybert_tf.data.pretokenize import check_request, write, written_by
from tinybert_tf.models.checkpoint import inside_model_dir_error
from tinybert_tf.pipeline import flags as tflags
from tinybert_tf.pipeline.run.lock import FileLock
from tinybert_tf.processes import left_by_a_dead_writer

tflags.define_pretokenize_tool_flags()
FLAGS = tflags.FLAGS


def run() -> None:
    """Check the flags, then write the shards and print their metadata."""
    if not FLAGS.vocab:
        raise cli.UsageError("--vocab is required: a vocab.txt or a model directory holding "
                             "one (the student's vocab, i.e. the teacher's).")
    if not FLAGS.output:
        raise cli.UsageError("--output is required: the shard prefix (e.g. "
                             "--output=corpus/wiki128).")
    inside = inside_model_dir_error(FLAGS.output, "--output")
    if inside:
        raise cli.UsageError(inside)
    request = check_request(FLAGS.corpus or None, FLAGS.vocab, FLAGS.output,
                            num_shards=FLAGS.num_shards, max_seq_len=FLAGS.max_seq_len,
                            pack=FLAGS.pack, fmt=FLAGS.corpus_format,
                            num_workers=FLAGS.num_workers, lower_case=FLAGS.lower_case,
                            tfds_data_dir=FLAGS.tfds_data_dir or None)
    prefix = request.output
    lock = FileLock(os.path.join(os.path.dirname(prefix), f".{os.path.basename(prefix)}.lock"),
                    f"--output={FLAGS.output}", hint="One run at a time writes a shard "
                    "prefix: wait for it to finish, or give another --output.")
    with lock:
        removed = remove_dead_writers_temporaries(prefix, lock.acquired_at)
        if removed:
            print(f"bin/pretokenize: removed {len(removed)} temporary file(s) a killed run "
                  f"left: {', '.join(os.path.basename(p) for p in removed)}", file=sys.stderr,
                  flush=True)
        meta = write(request)
    if meta["reused"]:
        print(f"bin/pretokenize: {FLAGS.output}.json records shards made from this corpus "
              "with these settings, and they are all there; kept. Delete "
              f"{FLAGS.output}.json to write them again.", file=sys.stderr, flush=True)
    empty = [s["file"] for s in meta["shards"] if not s["num_sequences"]]
    if empty:  # documents are dealt round-robin: fewer documents than shards
        print(f"bin/pretokenize: warning: {len(empty)} of {len(meta['shards'])} shards hold "
              f"no sequence ({empty[0]}{', ...' if len(empty) > 1 else ''}): the corpus has "
              f"fewer documents than --num_shards={len(meta['shards'])}, and a worker given "
              "only empty shards has nothing to train on; use fewer shards.",
              file=sys.stderr, flush=True)
    print(json.dumps({k: v for k, v in meta.items() if k != "shards"}, indent=2))


def remove_dead_writers_temporaries(prefix: str, before: float) -> list[str]:
    """Remove the shard and PREFIX.json temporaries of `prefix` that a killed run left (a
    shard's can be gigabytes); returns their paths. Called with the prefix's lock held,
    taken at `before`, so no other bin/pretokenize writes them: those of a live process,
    or changed since, are a writer's at work (`processes.left_by_a_dead_writer`)."""
    folder = os.path.dirname(prefix)
    if not files.isdir(folder):
        return []
    ours = written_by(prefix)
    found = [os.path.join(folder, name) for name in sorted(files.listdir(folder))
             if ours.match(name)]
    removed = [path for path in found if left_by_a_dead_writer(path, before)]
    for path in removed:
        files.remove(path)
    return removed


def main(argv: list[str]) -> int:
    """bin/pretokenize with its flags parsed: the exit code (tinybert_tf.cli.tool)."""
    return cli.guard("bin/pretokenize", run,
                     rerun="re-run the same command: it starts over (the shards this run "
                     "wrote are removed)")


def entry_point() -> None:
    """`bin/pretokenize`: the tool on sys.argv; exits with its code."""
    sys.exit(cli.run_tool("bin/pretokenize", main, sys.argv, FLAGS, __doc__))
