#!/usr/bin/env python3
"""Where the quantize stage's int8 student loses the float student's answers.

  .venv/bin/python benchmarks/bench_int8_points.py --run=RUN --task=SST-2 \
      --data_dir=../shared/data/glue/SST-2 [--output=int8_points.json]

RUN is a `bin/distill` output folder that went through the quantize stage (its
`task/model` and `quantize/model`). On the task's dev set, the int8 student's Keras
simulation (the trace its int8 TFLite file is converted from) is run again with one
group of activation points left in float (their fake quantisation skipped, every
other tensor as before), and the script prints, per group, the share of dev labels
that agree with the float student's and the task metric: a group whose int8 grid
costs answers gains agreement when left in float. Groups: every activation, the
FFN output with the residual ADD and the centred LayerNorm input after it (where
BERT's outlier dimensions widen the range), attention scores, the other attention
matmuls, every LayerNorm internal, the FFN's first matmul and GELU, the embeddings,
the pooler and head, and each layer alone. Weights stay int8 throughout, so "every
activation" separates what the weights cost from what the activations cost. Also
prints each point's learnt range. Only the dev labels are read.
"""
from __future__ import annotations

import json
import os
import re
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tinybert_tf.startup import use_project_environment  # noqa: E402

use_project_environment()

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("run", None, "A bin/distill output folder with task/model and "
                    "quantize/model.")
flags.DEFINE_string("task", None, "The task (GLUE name or the run's --task).")
flags.DEFINE_string("data_dir", None, "The task's data folder (GLUE layout).")
flags.DEFINE_integer("max_seq_len", 0, "Sequence length; 0: the task's default.")
flags.DEFINE_integer("batch_size", 64, "Dev rows per call.")
flags.DEFINE_string("output", "", "Write the figures here as JSON; empty: print only.")
for _name in ("run", "task", "data_dir"):
    flags.mark_flag_as_required(_name)

# Group name -> regular expression over activation point names.
GROUPS = {
    "every activation": r".",
    "FFN output, residual ADD, centred LayerNorm input":
        r"output\.dense$|output_residual$|output_norm\.centred$",
    "attention scores (and masked)": r"attention\.(masked_)?scores$",
    "attention query, key, value, context, output":
        r"attention\.(query|key|value|context|output)$",
    "every LayerNorm internal": r"_norm\.",
    "FFN first matmul and GELU": r"intermediate\.",
    "embeddings and their LayerNorm": r"^embeddings",
    "pooler and head": r"^(pooler|head)\.",
}


def main(argv: list[str]) -> None:
    del argv
    from tinybert_tf.startup import start_tensorflow
    start_tensorflow()  # no CUDA probe error on a machine without a GPU
    import numpy as np
    import tensorflow as tf

    from tinybert_tf.data import buckets
    from tinybert_tf.models.checkpoint import load_model, load_tokenizer
    from tinybert_tf.tasks.base import predict_rows
    from tinybert_tf.tasks.catalog import TaskConfig, resolve_task

    task = resolve_task(TaskConfig(task=FLAGS.task, data_dir=FLAGS.data_dir))
    max_seq_len = task.max_seq_len(FLAGS.max_seq_len)
    float_model = load_model(os.path.join(FLAGS.run, "task", "model"))
    int8_model = load_model(os.path.join(FLAGS.run, "quantize", "model"))
    ranges = getattr(int8_model, "quant_ranges", None)
    if ranges is None:
        raise SystemExit(f"bench_int8_points.py: {FLAGS.run}/quantize/model is not an int8 "
                         "student; run the quantize stage first.")
    tokenizer = load_tokenizer(float_model, max_seq_len)
    dev = task.examples("dev")
    gold = task.type.gold(dev)

    # One boolean per point, read inside the traced call: one trace for every group.
    left_float: dict[str, tf.Variable] = {}
    quantize = ranges.activation

    def activation(self, name, x, training=None):
        out = quantize(name, x, training)
        if name not in left_float:
            left_float[name] = tf.Variable(False, trainable=False)
        return tf.where(left_float[name], tf.cast(x, out.dtype), out)

    ranges.activation = types.MethodType(activation, ranges)
    # One eager call creates every point's variable before any trace.
    first, _ = next(iter(task.type.dataset(dev[:2], tokenizer, max_seq_len, 2)))
    int8_model(first, training=False)

    def labels(model):
        logits = predict_rows(model, task.type, dev, tokenizer, max_seq_len,
                              FLAGS.batch_size, buckets.bucket_boundaries(max_seq_len, 8))
        return np.asarray(logits).argmax(-1)

    float_labels = labels(float_model)
    primary = task.type.primary_metric

    def measure(members):
        for name in members:
            left_float[name].assign(True)
        try:
            ids = labels(int8_model)
        finally:
            for name in members:
                left_float[name].assign(False)
        return {"agreement": float(np.mean(ids == float_labels)),
                primary: float(task.type.score_labels(ids, gold)[primary]),
                "points": len(members)}

    rows = {"int8 (nothing left float)": measure([])}
    names = sorted(left_float)
    layers = sorted({m.group(0) for n in names if (m := re.match(r"transformer_layer_\d+", n))},
                    key=lambda s: int(s.rsplit("_", 1)[1]))
    groups = {**GROUPS, **{f"{layer} alone": rf"^{layer}\." for layer in layers}}
    for group, pattern in groups.items():
        rows[group] = measure([n for n in names if re.search(pattern, n)])
    float_score = task.type.score_labels(float_labels, gold)[primary]
    print(f"{FLAGS.run}: {len(dev)} dev rows, {len(names)} activation points; float student "
          f"{primary} {float_score:.4f}")
    print(f"{'left in float':52s} {'points':>6s} {'agree':>7s} {primary:>9s}")
    for group, row in rows.items():
        print(f"{group:52s} {row['points']:6d} {100 * row['agreement']:6.1f}% "
              f"{row[primary]:9.4f}")
    point_ranges = {n: [round(float(v), 4) for v in ranges.points[n].numpy()] for n in names}
    print("\nlearnt ranges (min, max):")
    for name, (lo, hi) in point_ranges.items():
        print(f"  {name:55s} {lo:10.3f} {hi:10.3f}")
    if FLAGS.output:
        with open(FLAGS.output, "w") as f:
            json.dump({"run": FLAGS.run, "task": FLAGS.task, "dev_rows": len(dev),
                       "float_metric": float_score, "primary_metric": primary,
                       "groups": rows, "ranges": point_ranges}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
