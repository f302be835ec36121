"""How much each loss term moves when the frozen teacher computes in bfloat16 (or
float16) instead of float32, on a finished demo run's models and data.

Reads OUT/finetune_teacher/model (the task teacher), OUT/task/model (the
student; OUT/general/model when the task stage has not run) and the demo
task's training sentences. Without a finished run, `--pretrained` takes the
embedded pre-trained MiniLM-L6 (with a fresh, seeded classifier head) as the
teacher and the demo's 1-layer student initialised from its layer 6, as the
demo's general stage starts it. It builds the task stage's terms (embd, attn, hidn
with the reference's padding convention and with --mask_padding, and pred),
and for each batch computes every term twice, with the float32 teacher and
with the teacher cast to --dtype (pipeline/settings/precision.py `with_precision`),
with the same student and projections. Prints per term the mean and largest
relative difference |L_low - L_fp32| / L_fp32 over the batches, and the
teacher outputs' own relative error (RMS of the difference / RMS of the value).

Usage:
  python tools/teacher_precision_losses.py --run_dir runs/demo [--dtype bfloat16]
  python tools/teacher_precision_losses.py --pretrained       # about a minute
  python tools/teacher_precision_losses.py --quick      # random tiny models: a smoke test
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tinybert_tf.startup import start_tensorflow, use_project_environment  # noqa: E402

use_project_environment()
start_tensorflow()  # no CUDA probe error on a machine without a GPU

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tinybert_tf.config import BertConfig, get_config  # noqa: E402
from tinybert_tf.data.examples import Example  # noqa: E402
from tinybert_tf.distill import Distiller, make_terms  # noqa: E402
from tinybert_tf.distill.distilbert import init_student_from_teacher  # noqa: E402
from tinybert_tf.distill.mapping import layer_map  # noqa: E402
from tinybert_tf.distill.terms import PredictionTerm  # noqa: E402
from tinybert_tf.models import BertModel  # noqa: E402
from tinybert_tf.models.checkpoint import load_model, load_tokenizer  # noqa: E402
from tinybert_tf.pipeline.main import parse_argv  # noqa: E402
from tinybert_tf.pipeline.settings.precision import with_precision  # noqa: E402
from tinybert_tf.tasks import Classification, resolve_task  # noqa: E402
from tinybert_tf.tokenizer import Tokenizer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _models_and_data(args):
    """(teacher, student, task type, tokenizer, examples, max_seq_len)."""
    if args.quick:
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
            "the", "a", "movie", "film", "good", "bad", "great", "awful", "very", "plot"]
        keras.utils.set_random_seed(0)
        cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_layers=2, num_heads=4,
                         intermediate_size=64, max_position_embeddings=64)
        teacher = BertModel(cfg, head="classifier", num_labels=2, vocab=vocab)
        student = BertModel(cfg.replace(num_layers=1), head="classifier", num_labels=2,
                            vocab=vocab)
        rng = np.random.default_rng(0)
        examples = [Example(str(i), " ".join(rng.choice(vocab[5:], rng.integers(2, 12))), None,
                            i % 2) for i in range(64)]
        return (teacher, student, Classification(["0", "1"]), Tokenizer(vocab, max_seq_len=16),
                examples, 16)
    config = parse_argv(["bin/distill", f"--flagfile={os.path.join(REPO, 'configs', 'demo.cfg')}",
                         f"--output_dir={args.run_dir}"])
    task = resolve_task(config.task)
    length = task.max_seq_len(config.task.max_seq_len)
    if args.pretrained:
        keras.utils.set_random_seed(0)
        teacher = load_model(config.models.teacher, **task.type.head_kwargs())
        student = BertModel(get_config(config.models.student_config,
                                       vocab_size=teacher.bert_config.vocab_size),
                            vocab=teacher.vocab, **task.type.head_kwargs())
        g = layer_map(config.loss.layer_mapping, student.bert_config.num_layers,
                      teacher.bert_config.num_layers)
        init_student_from_teacher(student, teacher, layers=[i - 1 for i in g[1:]])
        return (teacher, student, task.type, load_tokenizer(teacher, length),
                task.examples("train"), length)
    teacher = load_model(os.path.join(args.run_dir, "finetune_teacher", "model"))
    student_dir = os.path.join(args.run_dir, "task", "model")
    if not os.path.isdir(student_dir):
        student_dir = os.path.join(args.run_dir, "general", "model")
    student = load_model(student_dir, **task.type.head_kwargs())
    return (teacher, student, task.type, load_tokenizer(teacher, length),
            task.examples("train"), length)


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(a ** 2)), 1e-30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run_dir", default="runs/demo")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pretrained", action="store_true",
                        help="the embedded pre-trained teacher instead of a finished run")
    parser.add_argument("--quick", action="store_true", help="random tiny models")
    args = parser.parse_args()
    teacher, student, task, tok, examples, length = _models_and_data(args)
    low = with_precision(teacher, args.dtype)
    setups = {
        "reference (padded positions counted)": make_terms("embd,attn,hidn"),
        "--mask_padding": make_terms("embd,attn,hidn", mask_padding=True),
        "prediction": [PredictionTerm(task=task)],
    }
    print(f"teacher {teacher.bert_config.num_layers}x{teacher.bert_config.hidden_size} in "
          f"{args.dtype} vs float32; {len(examples)} rows, batch {args.batch}, seq {length}")
    batches = list(task.dataset(examples, tok, length, args.batch))
    # The teacher's outputs themselves.
    errors: dict[str, list[float]] = {}
    for x, _ in batches:
        a, b = teacher(x, training=False), low(x, training=False)
        mask = x["input_mask"].numpy().astype(bool)
        for key in ("embeddings", "sequence_output", "logits"):
            va, vb = a[key].numpy(), tf.cast(b[key], tf.float32).numpy()
            if va.ndim == 3:
                va, vb = va[mask], vb[mask]
            errors.setdefault(key, []).append(_relative(va, vb))
        sa = np.stack([s.numpy() for s in a["attention_scores"]])
        sb = np.stack([tf.cast(s, tf.float32).numpy() for s in b["attention_scores"]])
        keys = mask[None, :, None, None, :] & mask[None, :, None, :, None]
        errors.setdefault("attention_scores", []).append(
            _relative(sa[np.broadcast_to(keys, sa.shape)], sb[np.broadcast_to(keys, sb.shape)]))
    print("teacher outputs, relative RMS error (real positions):")
    for key, values in errors.items():
        print(f"  {key:<20}{np.mean(values):.2e}")
    print(f"{'terms':<40}{'term':<8}{'mean rel. diff':>16}{'max rel. diff':>16}")
    for name, terms in setups.items():
        keras.utils.set_random_seed(0)
        d32 = Distiller(student=student, teacher=teacher, terms=terms)
        d16 = Distiller(student=student, teacher=low, terms=terms)
        for a, b in zip(d16.projection_variables, d32.projection_variables):
            a.assign(b)
        diffs: dict[str, list[float]] = {}
        for batch in batches:
            l32, l16 = d32.compute_losses(batch), d16.compute_losses(batch)
            for key in l32:
                ref = float(l32[key])
                diffs.setdefault(key, []).append(abs(float(l16[key]) - ref) / max(abs(ref), 1e-30))
        for key, values in diffs.items():
            print(f"{name:<40}{key:<8}{np.mean(values):>16.2e}{np.max(values):>16.2e}")


if __name__ == "__main__":
    main()
