"""ScalarRows writes the same events as eager tf.summary.scalar calls."""
import glob
import os

import tensorflow as tf

from tinybert_tf.pipeline.training.summaries import ScalarRows


def _events(directory):
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for v in event.summary.value:
                value = tf.make_ndarray(v.tensor) if v.HasField("tensor") else v.simple_value
                out.append((event.step, v.tag, float(value)))
    return sorted(out)


def test_rows_match_eager_scalars(tmp_path):
    rows = [(1, {"loss": 2.5, "attn_loss": 1.25}), (2, {"loss": 2.0, "attn_loss": 1.0}),
            (3, {"loss": 1.5, "learning_rate": 1e-4})]  # a new set of names mid-run
    fast = tf.summary.create_file_writer(str(tmp_path / "rows"))
    writer = ScalarRows(fast)
    for step, row in rows:
        writer.write(step, row)
    fast.flush()
    eager = tf.summary.create_file_writer(str(tmp_path / "eager"))
    with eager.as_default():
        for step, row in rows:
            for k, v in row.items():
                tf.summary.scalar(k, v, step=step)
    eager.flush()
    got, want = _events(str(tmp_path / "rows")), _events(str(tmp_path / "eager"))
    assert len(got) == 6
    assert [(s, t) for s, t, _ in got] == [(s, t) for s, t, _ in want]
    for (_, _, a), (_, _, b) in zip(got, want):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b))
    assert len(writer._functions) == 2  # one traced function per set of names
