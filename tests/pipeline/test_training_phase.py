"""A training phase in-process: SIGTERM stops it at a step boundary with a checkpoint
and exit code 75, a truncated latest checkpoint falls back to the previous kept one, a
resume inside an epoch skips the batches already trained on, and each way the resumed
phase ends with the weights of an uninterrupted one; with length-bucketed batches
(masked losses) the train step is traced at most once per bucket, across epochs and
resumes, and XLA sees at most one shape per bucket; a diverging phase stops at the
step it diverged, keeping its last finite checkpoint; an undefined dev metric never
selects a checkpoint; a stop at a step due a dev evaluation is evaluated on resume, so
the resumed phase selects among the same evaluations."""
from __future__ import annotations

import os
import shutil
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.config import BertConfig
from tinybert_tf.data import buckets
from tinybert_tf.distill import Distiller, LossTerm, make_terms
from tinybert_tf.models import BertModel
from tinybert_tf.pipeline.training import loop
from tinybert_tf.pipeline.training.loop import (
    PREEMPTED_EXIT_CODE,
    Diverged,
    Phase,
    Preempted,
    run_phase,
)
from tinybert_tf.pipeline.training.task_input import epoch_rows

STEPS_PER_EPOCH, EPOCHS, BATCH, SEQ = 3, 2, 4, 12
BOUNDARIES = buckets.bucket_boundaries(SEQ, 3)  # 4, 8, 12
ROWS = STEPS_PER_EPOCH * BATCH + 2  # 2 rows left out of each epoch
_rng = np.random.default_rng(7)
LENGTHS = _rng.integers(2, SEQ + 1, ROWS)
IDS = _rng.integers(5, 40, (ROWS, SEQ)).astype(np.int32)


def _config(vocab_size: int, hidden: int) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_layers=2, num_heads=2,
                      intermediate_size=2 * hidden, max_position_embeddings=32,
                      hidden_dropout=0.0, attention_dropout=0.0)


def _dataset(epoch: int) -> tf.data.Dataset:
    """The epoch's length-grouped batches of random rows (pipeline/training/task_input.py), each
    cut to its length bucket."""
    order = epoch_rows(ROWS, BATCH, seed=3, epoch=epoch, lengths=LENGTHS)
    return _padded(order).map(lambda b: buckets.trim(b, BOUNDARIES, SEQ))


def _padded(order: np.ndarray) -> tf.data.Dataset:
    mask = (np.arange(SEQ)[None, :] < LENGTHS[order, None]).astype(np.int32)
    x = {"input_word_ids": IDS[order] * mask, "input_mask": mask, "input_type_ids": 0 * mask}
    return tf.data.Dataset.from_tensor_slices(x).batch(BATCH, drop_remainder=True)


def _phase(directory: str, *, max_steps: int = 0, jit: bool = False, evaluate=None,
           eval_every: int = 0, lr: float = 1e-2, terms=None, bucketed: bool = True,
           **kwargs) -> Phase:
    """The same freshly initialised phase every call (seeded models, constant rate).
    `bucketed=False`: every batch padded to SEQ (one shape, one trace: the tests of
    what does not depend on the batches' shapes)."""
    keras.utils.set_random_seed(0)
    teacher = BertModel(_config(40, 16))
    student = BertModel(_config(40, 8))
    distiller = Distiller(student=student, teacher=teacher,
                          terms=terms or make_terms("embd,attn,hidn", mask_padding=True))
    distiller.compile(optimizer=keras.optimizers.SGD(lr) if lr > 1 else
                      keras.optimizers.Adam(lr), jit_compile=jit)
    padded = lambda epoch: _padded(epoch_rows(ROWS, BATCH, seed=3, epoch=epoch))  # noqa: E731
    return Phase("phase", directory, distiller, distiller.checkpoint_items(),
                 _dataset if bucketed else padded,
                 STEPS_PER_EPOCH, EPOCHS, max_steps=max_steps, evaluate=evaluate,
                 eval_every=eval_every, **kwargs)


def _run(phase: Phase, **kwargs):
    return run_phase(phase, tf.distribute.get_strategy(), verbose=0, **kwargs)


def _weights(phase: Phase) -> list[np.ndarray]:
    return [v.numpy() for v in phase.model.student.weights]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=1e-6)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    phase = _phase(str(tmp_path_factory.mktemp("ref") / "stage" / "phase"))
    assert _run(phase)["steps"] == STEPS_PER_EPOCH * EPOCHS
    return phase


def _shapes() -> set:
    return {tuple(b["input_word_ids"].shape) for e in range(EPOCHS) for b in _dataset(e)}


def test_bucketed_batches_take_a_few_shapes_and_one_trace_across_epochs(reference):
    shapes = _shapes()
    assert 1 < len(shapes) <= len(BOUNDARIES)  # bucketed: shorter than SEQ, few shapes
    assert {s[1] for s in shapes} <= set(BOUNDARIES)
    assert 1 <= reference.model.train_traces <= len(BOUNDARIES)


@pytest.mark.parametrize("signum,code,said", [
    (signal.SIGTERM, PREEMPTED_EXIT_CODE, "stopped by SIGTERM at step 3"),
    # Ctrl-C: a stop request too, not a KeyboardInterrupt raised wherever the signal lands
    # (one raised in a weakref callback was printed and dropped, and training went on).
    (signal.SIGINT, 130, "interrupted (Ctrl-C) at step 3")], ids=["SIGTERM", "SIGINT"])
def test_sigterm_stops_at_a_step_boundary_and_the_resume_matches(tmp_path, reference, signum,
                                                                 code, said):
    directory = str(tmp_path / "stage" / "phase")
    sent = []
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def evaluate():  # runs inside fit after step 2: the signal arrives mid-phase
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signum)
        return {"metric": 0.0}

    with pytest.raises(Preempted) as stop:
        _run(_phase(directory, evaluate=evaluate, eval_every=2))
    assert stop.value.exit_code == code and stop.value.step == 3
    assert said in str(stop.value) and f"(exit code {code})" in str(stop.value)
    assert os.path.isfile(os.path.join(directory, "ckpt", "ckpt-3.index"))
    # The phase's handlers are gone.
    assert {s: signal.getsignal(s) for s in before} == before

    resumed = _phase(directory)
    assert _run(resumed)["steps"] == STEPS_PER_EPOCH * EPOCHS
    assert resumed.model.train_traces <= len(BOUNDARIES)  # a resume too
    _assert_same(_weights(resumed), _weights(reference))


def _evaluated_phase(directory: str, eval_every: int, best: list) -> Phase:
    """A phase whose dev metric is a function of its student's weights, so a resume
    that evaluates the same steps selects the same one."""
    holder: dict = {}

    def evaluate():
        student = holder["phase"].model.student
        return {"metric": float(-sum(np.abs(v.numpy()).sum() for v in student.weights))}

    phase = _phase(directory, evaluate=evaluate, eval_every=eval_every, bucketed=False,
                   select_metric="metric", on_best=lambda m: best.append(m["metric"]))
    holder["phase"] = phase
    return phase


@pytest.mark.parametrize("eval_every,stop", [(0, STEPS_PER_EPOCH), (1, 2)],
                         ids=["epoch_end", "eval_every"])
def test_a_stop_at_an_evaluation_step_is_evaluated_on_resume(tmp_path, monkeypatch,
                                                             eval_every, stop):
    """A SIGTERM stop at a step that is due a dev evaluation saves its checkpoint
    before the evaluation; the resume runs it, so both runs select among the same
    evaluations."""
    best_ref: list = []
    ref = _run(_evaluated_phase(str(tmp_path / "ref" / "phase"), eval_every, best_ref))

    sent = []
    forward = loop._Runner.forward_stop_request

    def stop_before(runner):  # the SIGTERM arrives as step `stop` begins
        if not sent and int(runner.step.numpy()) == stop - 1:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        forward(runner)

    monkeypatch.setattr(loop._Runner, "forward_stop_request", stop_before)
    directory = str(tmp_path / "stopped" / "phase")
    best: list = []
    with pytest.raises(Preempted) as stopped:
        _run(_evaluated_phase(directory, eval_every, best))
    assert stopped.value.step == stop
    monkeypatch.undo()

    resumed = _run(_evaluated_phase(directory, eval_every, best))
    steps = [e["step"] for e in ref["evals"]]
    assert steps == ([STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH] if not eval_every
                     else list(range(1, STEPS_PER_EPOCH * EPOCHS + 1)))
    assert [e["step"] for e in resumed["evals"]] == steps
    assert resumed["best"]["step"] == ref["best"]["step"]
    np.testing.assert_allclose(best, best_ref, rtol=1e-6)


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """A phase stopped after step 4, inside epoch 2 (checkpoints every 2 steps and at
    the end of epoch 1; the last three kept: ckpt-2, ckpt-3, ckpt-4). Tests resume
    copies of its folder."""
    directory = str(tmp_path_factory.mktemp("four") / "stage" / "phase")
    _run(_phase(directory, max_steps=STEPS_PER_EPOCH + 1), checkpoint_every=2,
         keep_checkpoints=3)
    return directory


def _copy(four_steps: str, tmp_path) -> str:
    directory = str(tmp_path / "stage" / "phase")
    shutil.copytree(four_steps, directory)
    return directory


def test_truncated_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, reference,
                                                                    four_steps, capsys):
    directory = _copy(four_steps, tmp_path)
    data = os.path.join(directory, "ckpt", "ckpt-4.data-00000-of-00001")
    with open(data, "r+b") as f:  # a save cut short (disk full, killed copy)
        f.truncate(os.path.getsize(data) // 2)

    resumed = _phase(directory)
    assert _run(resumed, checkpoint_every=2, keep_checkpoints=3)["steps"] == 6
    out = capsys.readouterr().out
    assert "ckpt-4 is unreadable or truncated" in out and "resumed from" in out
    assert "ckpt-3 (step 3)" in out  # the newest readable one: the end of epoch 1
    _assert_same(_weights(resumed), _weights(reference))


def test_a_resume_mid_epoch_skips_the_bucketed_batches_already_trained_on(tmp_path, reference,
                                                                         four_steps, capsys):
    directory = _copy(four_steps, tmp_path)
    capsys.readouterr()
    resumed = _phase(directory)
    assert _run(resumed, checkpoint_every=2)["steps"] == STEPS_PER_EPOCH * EPOCHS
    assert f"(step {STEPS_PER_EPOCH + 1})" in capsys.readouterr().out  # inside epoch 2
    _assert_same(_weights(resumed), _weights(reference))


def test_train_step_compiles_at_most_once_per_bucket_under_xla(tmp_path, reference):
    phase = _phase(str(tmp_path / "stage" / "phase"), jit=True)
    _run(phase)
    # One Python trace; XLA compiles once per input shape, at most one per bucket.
    assert 1 <= phase.model.train_traces <= len(BOUNDARIES)
    assert len(_shapes()) <= len(BOUNDARIES)
    _assert_same(_weights(phase), _weights(reference))


# --- divergence and undefined metrics ---------------------------------------------------

def _finite(path: str) -> bool:
    reader = tf.train.load_checkpoint(path)
    return all(np.all(np.isfinite(reader.get_tensor(k))) for k, dtype in
               reader.get_variable_to_dtype_map().items() if dtype.is_floating)


def test_a_diverging_learning_rate_stops_at_its_step_naming_the_flag(tmp_path):
    directory = str(tmp_path / "stage" / "phase")
    phase = _phase(directory, lr=1e9, hint="lower --pred_lr (now 1e+09)", bucketed=False)
    with pytest.raises(Diverged) as info:
        _run(phase, checkpoint_every=1)
    message = str(info.value)
    step = int(message.split("diverged at step ")[1].split()[0])
    assert message.startswith(f"[phase] training diverged at step {step} of 6: ")
    assert "too high a learning rate: lower --pred_lr (now 1e+09)" in message
    assert "nothing was published" in message and "\n" not in message
    kept = tf.train.latest_checkpoint(os.path.join(directory, "ckpt"))
    assert kept is not None and f"{kept}, is kept" in message
    assert int(kept.rsplit("-", 1)[1]) < step and _finite(kept)  # no save after the divergence
    assert not os.path.exists(os.path.join(directory, "phase_done.json"))


class _NaNTerm(LossTerm):
    """A (plugin's) term that returns NaN from its second step on."""

    name = "broken"

    def count(self, inputs):
        return tf.cast(tf.shape(inputs["input_word_ids"])[0], tf.float32)

    def sum(self, inputs, student_outputs, teacher_outputs, projections):
        return tf.math.log(-tf.reduce_sum(student_outputs["embeddings"][:, :1]) ** 2 - 1.0)


def test_a_term_returning_nan_is_named_as_the_cause(tmp_path):
    phase = _phase(str(tmp_path / "stage" / "phase"),
                   terms=[*make_terms("embd"), _NaNTerm()], hint="lower --x_lr",
                   bucketed=False)
    with pytest.raises(Diverged, match=r"at step 1 of 6: the loss is not finite \(broken_loss="
                       r"nan, loss=nan\).*before any update, so the learning rate is not the "
                       r"cause: the loss term\(s\) broken gave non-finite values on finite "
                       r"weights; check that term's code"):
        _run(phase)


def test_an_undefined_dev_metric_never_selects_a_checkpoint(tmp_path):
    values = iter([float("nan"), 0.25, float("nan"), 0.5])
    best = []
    phase = _phase(str(tmp_path / "a" / "phase"), evaluate=lambda: {"pearson": next(values)},
                   eval_every=1, select_metric="pearson", on_best=best.append, max_steps=4,
                   bucketed=False)
    result = _run(phase)
    assert [b["pearson"] for b in best] == [0.25, 0.5] and result["best"]["step"] == 4
    # No defined value at all: the last weights are kept, with a warning, once.
    best.clear()
    phase = _phase(str(tmp_path / "b" / "phase"), evaluate=lambda: {"pearson": float("nan")},
                   select_metric="pearson", on_best=best.append, max_steps=1,
                   bucketed=False)
    assert _run(phase)["best"] is None
    assert len(best) == 1 and np.isnan(best[0]["pearson"])


def test_each_dev_evaluation_is_one_line_of_output(tmp_path, capsys, caplog):
    """bin/distill logs at INFO to stderr: an evaluation printed and logged too showed
    twice."""
    import logging

    values = iter([0.25, 0.5])
    phase = _phase(str(tmp_path / "phase"), evaluate=lambda: {"accuracy": next(values)},
                   eval_every=1, max_steps=2, bucketed=False)
    with caplog.at_level(logging.INFO, logger="tinybert_tf"):
        _run(phase)
    out = capsys.readouterr().out
    assert out.count("[phase] step 1: dev accuracy=0.2500") == 1
    assert out.count("[phase] step 2: dev accuracy=0.5000") == 1
    assert not [r for r in caplog.records if ": dev " in r.getMessage()]


def test_the_report_says_undefined_and_retains_nothing_of_undefined_metrics():
    from tinybert_tf.pipeline.run.report import build_report, summary_table
    facts = {"params": 10, "flops": 10, "latency_ms": 1.0}
    data = build_report("sts-b", {**facts, "dev": {"pearson": float("nan")}},
                        {**facts, "dev": {"pearson": float("nan")}}, "pearson", 24)
    assert data["teacher"]["dev"]["pearson"] is None and data["ratios"]["retained"] is None
    assert "student dev pearson undefined" in data["notes"][1]
    table = summary_table(data)
    assert "undefined  undefined" in table and "retained" not in table


def test_output_to_a_log_file_has_step_lines_not_a_redrawn_bar(tmp_path, capsys):
    """stdout is not a terminal here (pytest captures it): no carriage returns or
    backspaces, and the phase ends with a whole line naming its last step."""
    run_phase(_phase(str(tmp_path / "stage" / "phase"), max_steps=2, bucketed=False),
              tf.distribute.get_strategy(), verbose=1)
    out = capsys.readouterr().out
    assert "\r" not in out and "\b" not in out
    assert "[phase] step 2/2" in out
