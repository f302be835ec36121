"""The prediction phase with and without the teacher cache, on the demo's shapes.

Teacher: the embedded all-MiniLM-L6-v2 (6 layers, 384 wide) with a 2-label head;
student: minilm_1l_384d (the demo student); seq 48, batch 32 (configs/demo.cfg).
Times one prediction-phase step recomputing the teacher (`teacher_logits`
absent) and one reading cached logits from the batch, the one-off cost of
caching (the teacher's forward pass per example at the evaluation batch), and
projects the phase's time for the demo's 2 epochs and the paper's 3 on 20x
augmented data. Also prints what caching the teacher's intermediate outputs
(for the intermediate phase) would take per example at 2 bytes a value.

Usage: python benchmarks/bench_teacher_cache.py [--steps 10]   (about 1 minute)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tinybert_tf.config import get_config  # noqa: E402
from tinybert_tf.distill import Distiller, create_optimizer  # noqa: E402
from tinybert_tf.distill.terms import PredictionTerm  # noqa: E402
from tinybert_tf.models import BertModel  # noqa: E402
from tinybert_tf.models.checkpoint import load_model  # noqa: E402
from tinybert_tf.tasks import task_type  # noqa: E402


def _median_step(distiller: Distiller, batch, steps: int) -> float:
    distiller.train_on_batch(*batch)  # trace
    distiller.train_on_batch(*batch)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        distiller.train_on_batch(*batch)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def intermediate_bytes(t_cfg, student_layers: int, seq: int, dtype_bytes: int = 2) -> dict:
    """Bytes per example of the teacher outputs the intermediate phase reads: the
    mapped hidden states (embeddings + one per student layer) and attention maps."""
    hidden = (student_layers + 1) * seq * t_cfg.hidden_size * dtype_bytes
    attention = student_layers * t_cfg.num_heads * seq * seq * dtype_bytes
    return {"hidden": hidden, "attention": attention, "total": hidden + attention}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq", type=int, default=48)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--eval_batch", type=int, default=64)
    parser.add_argument("--rows", type=int, default=3360,
                        help="training rows of the phase (demo: 160 sentences x 21)")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    teacher = load_model("minilm-l6", head="classifier", num_labels=2,
                         label_names=["neg", "pos"])
    s_cfg = get_config("minilm_1l_384d").replace(vocab_size=teacher.bert_config.vocab_size)
    student = BertModel(s_cfg, head="classifier", num_labels=2, label_names=["neg", "pos"],
                        vocab=teacher.vocab)
    distiller = Distiller(student=student, teacher=teacher,
                          terms=[PredictionTerm(task=task_type("polarity"))])
    distiller.compile(optimizer=create_optimizer(5e-4, 1000))

    rng = np.random.default_rng(0)
    b, L = args.batch, args.seq
    lengths = rng.integers(L // 3, L + 1, (b, 1))
    mask = (np.arange(L)[None, :] < lengths).astype(np.int32)
    x = {"input_word_ids": rng.integers(1000, 20000, (b, L)).astype(np.int32) * mask,
         "input_mask": mask, "input_type_ids": np.zeros_like(mask)}
    y = rng.integers(0, 2, (b,)).astype(np.int32)
    full = _median_step(distiller, (x, y), args.steps)
    logits = teacher(x, training=False)["logits"].numpy()
    cached = _median_step(distiller, (dict(x, teacher_logits=logits), y), args.steps)

    forward = tf.function(lambda z: teacher(z, training=False)["logits"])
    xe = {k: np.concatenate([v, v])[:args.eval_batch] for k, v in x.items()}
    forward(xe).numpy()
    start = time.perf_counter()
    for _ in range(args.steps):
        forward(xe).numpy()
    per_example = (time.perf_counter() - start) / args.steps / args.eval_batch

    print(f"cpu cores: {os.cpu_count()}  tf {tf.__version__}  seq {L}, batch {b}")
    print(f"prediction step, teacher recomputed: {full * 1e3:8.1f} ms")
    print(f"prediction step, cached logits:      {cached * 1e3:8.1f} ms  "
          f"({full / cached:.2f}x faster)")
    print(f"caching: teacher forward {per_example * 1e3:.2f} ms per example "
          f"(eval batch {args.eval_batch}), logits {2 * 4} bytes per example")
    steps = args.rows // b
    for epochs in (2, 3):
        plain = epochs * steps * full
        with_cache = args.rows * per_example + epochs * steps * cached
        print(f"phase of {epochs} epochs over {args.rows} rows: {plain:7.1f} s recomputing, "
              f"{with_cache:7.1f} s with the cache ({plain / with_cache:.2f}x)")
    demo = intermediate_bytes(teacher.bert_config, s_cfg.num_layers, L)
    base = intermediate_bytes(get_config("bert_base_uncased"), 4, 128)
    print(f"intermediate outputs at 2 bytes/value: demo (minilm-l6 -> 1 layer, seq {L}) "
          f"{demo['total'] / 1e3:.0f} kB/example (hidden {demo['hidden'] / 1e3:.0f}, "
          f"attention {demo['attention'] / 1e3:.0f}); BERT-base -> TinyBERT4, seq 128: "
          f"{base['total'] / 1e6:.2f} MB/example")
    print(f"to beat recomputing here, a cache must be read at >= "
          f"{demo['total'] / per_example / 1e6:.0f} MB/s per core-pair (demo shapes)")


if __name__ == "__main__":
    main()
