"""bin/export on a saved model directory, its errors, and bin/benchmark --quick."""
import json
import os
import re
import types

import keras
import numpy as np
import pytest

from tinybert_tf.config import BertConfig
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import load_model, save_model
from tinybert_tf.tasks import TaskConfig, resolve_task

from numerics import assert_parity_agrees
from pipeline_helpers import keras_reference, load_tool
from pipeline_helpers import run_tool as helpers_run_tool


def run_tool(name, capsys, *args):
    """`pipeline_helpers.run_tool` with what it printed: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = helpers_run_tool(name, *args)
    out, err = capsys.readouterr()
    return types.SimpleNamespace(returncode=code, stdout=out, stderr=err)


def model_dir(tmp_path, tiny_vocab, head):
    vocab = list(dict.fromkeys(tiny_vocab))  # conftest's TINY_VOCAB repeats a few tokens
    keras.utils.set_random_seed(7)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_layers=2, num_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    kwargs = {"num_labels": 2, "label_names": ["neg", "pos"]} if head == "classifier" else {}
    model = BertModel(config, head=head, vocab=vocab, **kwargs)
    return save_model(model, str(tmp_path / f"model_{head}"))


@pytest.mark.numerics
def test_bin_export_writes_export_dir_for_polarity(tmp_path, tiny_vocab, capsys):
    src = model_dir(tmp_path, tiny_vocab, "classifier")
    out = tmp_path / "out"
    # --output_dir a folder of other files too (a home folder): files named like the
    # temporaries of a killed writer are the user's outside OUT/export (both were
    # deleted); one inside it is the export's own.
    theirs = [out / "notes" / ".draft.txt.tmp-k2j4x", out / ".data.csv.old-x1y2"]
    ours = out / "export" / ".model_float32.tflite.tmp-k2j4x"
    for path in (*theirs, ours):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
        os.utime(path, (1, 1))  # made long before the export: a dead writer's if ours
    proc = run_tool("export", capsys, f"--model_dir={src}", f"--output_dir={out}",
                    "--max_seq_len=16", "--export_formats=float32", "--export_latency_runs=2",
                    "--task=polarity")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out / "export")) == ["model_float32.tflite", "parity.json"]
    assert all(path.read_text() == "x" for path in theirs)
    parity = json.loads((out / "export" / "parity.json").read_text())
    assert parity["task"] == "polarity" and parity["max_seq_len"] == 16
    assert parity["num_examples"] > 0 and parity["metric_name"] == "accuracy"
    assert parity["formats"]["float32"]["max_abs_diff"] < 1e-4
    assert "float32" in proc.stdout and "max|Δ|" in proc.stdout  # the printed table


def load_bin_export():
    """bin/export as a module, to call its run() in-process."""
    return load_tool("export")


@pytest.mark.parametrize("head,args,message", [
    ("classifier", ["--export_formats=float32,onnx"], "unknown export format 'onnx'"),
    # Before --task or the task's head check: bin/export exports task models.
    (None, [], "has no task head (an encoder); bin/export exports task models"),
    ("classifier", ["--representative_examples=0"], "--representative_examples"),
])
def test_bin_export_errors(tmp_path, tiny_vocab, head, args, message):
    from tinybert_tf.export import ExportError
    tool = load_bin_export()
    src = model_dir(tmp_path, tiny_vocab, head)
    out = tmp_path / "out"
    tool.FLAGS(["bin/export", f"--model_dir={src}", f"--output_dir={out}",
                "--max_seq_len=16", "--task=polarity", *args])
    try:
        with pytest.raises(ExportError, match=re.escape(message)) as err:
            tool.run()
        assert re.search(r"--[a-z_]+", str(err.value))  # names the flag at fault
    finally:
        tool.FLAGS.unparse_flags()
    assert not (out / "export" / "parity.json").exists()


def test_an_export_folder_no_export_made_is_refused_before_writing(tmp_path, tiny_vocab):
    """--output_dir=~ with a folder ~/export of the user's: the export wrote among its
    files, overwrote its parity.json and deleted its hf/ (a format not asked for)."""
    from tinybert_tf.export import ExportError
    tool = load_bin_export()
    src = model_dir(tmp_path, tiny_vocab, "classifier")
    theirs = tmp_path / "home" / "export"
    (theirs / "hf").mkdir(parents=True)
    (theirs / "hf" / "notes.txt").write_text("mine")
    (theirs / "parity.json").write_text('{"mine": 1}')
    before = sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*"))
    tool.FLAGS(["bin/export", f"--model_dir={src}", f"--output_dir={theirs.parent}",
                "--max_seq_len=16", "--task=polarity", "--export_formats=float32"])
    try:
        with pytest.raises(ExportError, match=rf"^--output_dir={re.escape(str(theirs.parent))}: "
                           r".*export holds parity\.json, which no export made: .*Choose an "
                           r"--output_dir whose export/ is new or an earlier export's\.$"):
            tool.run()
    finally:
        tool.FLAGS.unparse_flags()
    assert sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*")) == before
    assert (theirs / "parity.json").read_text() == '{"mine": 1}'
    # An earlier export's folder, even one cut short before its parity.json, is an export.
    ours = tmp_path / "run" / "export"
    (ours / "serving" / "1").mkdir(parents=True)
    (ours / "model_float32.tflite").write_bytes(b"x")
    (ours / ".model_int8.tflite.tmp-123").write_bytes(b"x")
    assert tool.foreign_export_entries(str(ours)) == []
    (ours / "report.pdf").write_bytes(b"x")
    assert tool.foreign_export_entries(str(ours)) == ["report.pdf"]


def test_bin_export_refuses_an_existing_serving_version_before_exporting(tmp_path, tiny_vocab):
    from tinybert_tf.export import ExportError
    tool = load_bin_export()
    src = model_dir(tmp_path, tiny_vocab, "classifier")
    served = tmp_path / "out" / "export" / "serving" / "1"
    served.mkdir(parents=True)
    (served / "saved_model.pb").write_bytes(b"served")
    tool.FLAGS(["bin/export", f"--model_dir={src}", f"--output_dir={tmp_path / 'out'}",
                "--max_seq_len=16", "--serving_version=1"])
    try:
        with pytest.raises(ExportError, match=r"--serving_version=1: .*serving/1 exists.*\(2\)"):
            tool.run()
    finally:
        tool.FLAGS.unparse_flags()
    assert (served / "saved_model.pb").read_bytes() == b"served"
    assert sorted(os.listdir(tmp_path / "out" / "export")) == ["serving"]


def test_a_serving_version_below_the_latest_is_published_with_a_warning(tmp_path, tiny_vocab,
                                                                        capsys):
    """TF Serving serves the highest version by default: a lower one is not what it
    serves, and the tool says so."""
    src = model_dir(tmp_path, tiny_vocab, "classifier")
    serving = tmp_path / "out" / "export" / "serving"
    (serving / "3").mkdir(parents=True)
    (serving / "3" / "saved_model.pb").write_bytes(b"served")
    proc = run_tool("export", capsys, f"--model_dir={src}", f"--output_dir={tmp_path / 'out'}",
                    "--max_seq_len=16", "--export_formats=saved_model", "--serving_version=2",
                    "--export_latency_runs=1", "--task=polarity")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"bin/export: warning: --serving_version=2 is below {serving / '3'}: TF Serving's "
            "default version policy (latest) keeps serving that one. Drop the flag to "
            "publish 4, the next after it.") in proc.stderr
    assert (serving / "2" / "saved_model.pb").is_file()
    assert (serving / "3" / "saved_model.pb").read_bytes() == b"served"


def test_an_output_dir_inside_the_model_directory_is_refused_before_writing(tmp_path,
                                                                            tiny_vocab, capsys):
    """Exports written into the model's folder changed the model a pipeline recorded, so
    its next run trained the stage again."""
    src = model_dir(tmp_path, tiny_vocab, "classifier")
    before = sorted(os.listdir(src))
    proc = run_tool("export", capsys, f"--model_dir={src}", f"--output_dir={src}/out",
                    "--export_formats=float32", "--task=polarity")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"bin/export: error: --output_dir={src}/out: inside --model_dir={src}; the export "
        "would be written into the model directory (and a pipeline that made the model "
        "would find it changed and train it again). Choose an --output_dir outside it, "
        "e.g. the run's folder.")
    assert sorted(os.listdir(src)) == before
    # Another model's folder (a run's fine-tuned teacher, say) is refused the same way;
    # a folder whose config.json is no model's is not.
    other = model_dir(tmp_path / "other", tiny_vocab, "classifier")
    before = sorted(os.listdir(other))
    proc = run_tool("export", capsys, f"--model_dir={src}", f"--output_dir={other}/x",
                    "--export_formats=float32", "--task=polarity")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"bin/export: error: --output_dir={other}/x: inside the model directory {other} "
        "(tinybert_tf format); what is written there would change that model")
    assert sorted(os.listdir(other)) == before
    plain = tmp_path / "project"
    plain.mkdir()
    (plain / "config.json").write_text('{"editor": "vim"}')
    proc = run_tool("export", capsys, f"--model_dir={src}", f"--output_dir={plain}/out",
                    "--export_formats=float32", "--task=polarity", "--max_seq_len=16",
                    "--export_latency_runs=1")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.numerics
def test_bin_benchmark_quick(tmp_path, capsys):
    out = tmp_path / "bench"
    proc = run_tool("benchmark", capsys, "--quick", "--benchmark_formats=keras,float32",
                    f"--benchmark_output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "benchmark.json").read_text())
    teacher, student = report["models"]
    assert set(teacher["runtimes"]) == {"keras", "float32"}
    assert teacher["params"] > student["params"] > 0
    assert report["ratios"]["params"] == pytest.approx(teacher["params"] / student["params"])
    for m in report["models"]:
        for rt in m["runtimes"].values():
            assert set(rt["latency_ms"]) == {"1", "2"}
            assert all(v > 0 for v in rt["latency_ms"].values())
            assert 0.0 <= rt["agreement"] <= 1.0  # labels as Keras's on the timed inputs
        assert m["runtimes"]["keras"]["agreement"] == 1.0
        # Seeded weights keep every timed input far from a tie (float32 TFLite's logits
        # are within 1e-4 of Keras's), so float32 agrees on every one.
        assert m["label_margin"] > 1e-3, m["label_margin"]
        assert m["runtimes"]["float32"]["agreement"] == 1.0
    assert (out / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "paper: 7.5x smaller" in proc.stdout


@pytest.mark.numerics
def test_bin_benchmark_takes_model_directories_and_short_names(tmp_path, tiny_vocab):
    """The demo's teacher and student as they are: `--benchmark_models=minilm-l6,
    OUTPUT/task/model` (only presets and JSON files were taken)."""
    from tinybert_tf.config import ConfigError
    tool = load_tool("benchmark")
    src = model_dir(tmp_path, tiny_vocab, "classifier")
    config = tool.model_config(src + "/")
    assert (config.hidden_size, config.num_layers) == (32, 2)
    teacher = tool.model_config("minilm-l6")
    assert (teacher.hidden_size, teacher.num_layers, teacher.num_heads) == (384, 6, 12)
    assert tool._label(src + "/") == src  # whole: a path cut at its start names no folder
    with pytest.raises(ConfigError, match=r"^--benchmark_models: unknown model config "
                       r"'nope': .*or a model directory\.$"):
        tool.model_config("nope")


def test_the_benchmark_table_names_long_model_paths_whole_and_in_line():
    """Two run folders' students end in the same 21 characters: the table named both
    "...inetune_teacher/model" and shifted the columns of names over 18 characters."""
    from tinybert_tf.export.benchmark import format_report

    def model(name):
        timing = {"latency_ms": {"1": 2.0}, "throughput": {"1": 500.0}, "agreement": 1.0}
        return {"name": name, "params": 4e6, "flops": 1e9, "runtimes": {"keras": timing}}

    names = ["runs/first/finetune_teacher/model", "runs/second/finetune_teacher/model"]
    report = {"seq_len": 48, "threads": 2, "models": [model(n) for n in names],
              "ratios": {"params": 1.0, "flops": 1.0, "latency": {"keras": {"1": 1.0}}}}
    rows = [line for line in format_report(report).splitlines()
            if line.startswith("runs/") and "keras" in line]
    assert [row.split()[0] for row in rows] == names
    assert len({row.index("keras") for row in rows}) == 1
    header = format_report(report).splitlines()[2]
    assert header.index("runtime") == rows[0].index("keras")


def test_bin_export_writes_hugging_face_and_keras_hub_directories(tmp_path, tiny_vocab,
                                                                   capsys):
    """The format table's model-directory rows through the tool: each directory loads
    back (our readers) and gives the model's probabilities."""
    vocab = list(dict.fromkeys(tiny_vocab))
    keras.utils.set_random_seed(8)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_layers=2, num_heads=4,
                        intermediate_size=64, max_position_embeddings=64,
                        hidden_act="gelu_tanh")  # keras-hub's GELU
    src = save_model(BertModel(config, head="classifier", label_names=["neg", "pos"],
                               vocab=vocab), str(tmp_path / "model"))
    out = tmp_path / "out"
    proc = run_tool("export", capsys, f"--model_dir={src}", f"--output_dir={out}",
                    "--max_seq_len=16", "--export_formats=hf,keras_hub", "--export_latency_runs=2",
                    "--task=polarity")
    assert proc.returncode == 0, proc.stderr[-3000:]
    parity = json.loads((out / "export" / "parity.json").read_text())
    want, _ = keras_reference(src, resolve_task(TaskConfig(task="polarity")), 16)
    for fmt, path in (("hf", "hf"), ("keras_hub", "keras_hub")):
        row = parity["formats"][fmt]
        assert row["path"] == path, (fmt, row)
        assert_parity_agrees(row, want, 1e-4, name=fmt)
    hf_config = json.loads((out / "export" / "hf" / "config.json").read_text())
    assert hf_config["architectures"] == ["BertForSequenceClassification"]
    assert hf_config["id2label"] == {"0": "neg", "1": "pos"}


def test_a_model_directory_format_is_timed_without_tracing_at_each_call(tmp_path, tiny_vocab,
                                                                       monkeypatch):
    """The hf row's batch-1 latency times the loaded model: its calls run one traced
    function, not a new trace each (the row read 130 ms against Keras's 3 ms when every
    timed call traced the model again)."""
    from tinybert_tf.export import formats as fmts
    from tinybert_tf.export.common import INPUT_NAMES

    src = model_dir(tmp_path, tiny_vocab, "classifier")
    path = str(tmp_path / "hf")
    fmts.export_hf(load_model(src), path)
    task = resolve_task(TaskConfig(task="polarity")).type
    inputs = {k: np.ones((3, 16), np.int32) for k in INPUT_NAMES}
    ctx = fmts.ExportContext(load_model(src), task, 16, False, ["a"] * 3, None, inputs)
    runs = []
    call = BertModel.call
    monkeypatch.setattr(BertModel, "call", lambda self, *a, **k: runs.append(1) or
                        call(self, *a, **k))
    loaded = fmts.FORMATS["hf"].load(ctx, path)
    loaded.predict()
    loaded.one()
    traced = len(runs)  # Python runs the model's call only while tracing
    for _ in range(3):
        loaded.one()
    loaded.predict()
    assert traced >= 1 and len(runs) == traced


# --- label identity -----------------------------------------------------------------------

def _export_in_process(tool, *args):
    tool.FLAGS(["bin/export", *args])
    try:
        return tool.run()
    finally:
        tool.FLAGS.unparse_flags()


def test_exports_name_the_models_labels_in_its_own_order(tmp_path, tiny_vocab, capsys):
    """A model whose outputs are [pos, neg] (the task's are [neg, pos]): every export
    names them in the model's order, and the dev metric reads them by name."""
    import numpy as np

    from tinybert_tf.export.tflite_metadata import read_metadata
    from tinybert_tf.models.checkpoint import load_model, load_tokenizer
    from tinybert_tf.tasks import TaskConfig, resolve_task
    vocab = list(dict.fromkeys(tiny_vocab))
    keras.utils.set_random_seed(7)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_layers=1, num_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    model = BertModel(config, head="classifier", label_names=["pos", "neg"], vocab=vocab)
    src = save_model(model, str(tmp_path / "model"))
    tool = load_bin_export()
    parity = _export_in_process(tool, f"--model_dir={src}", f"--output_dir={tmp_path / 'o'}",
                                "--task=polarity", "--max_seq_len=16",
                                "--export_formats=float32", "--export_latency_runs=1")
    assert parity["labels"] == ["pos", "neg"]
    meta = read_metadata(str(tmp_path / "o" / "export" / "model_float32.tflite"))
    assert meta.files["labels.txt"].decode().split() == ["pos", "neg"]
    # The metric, independently: the model's argmax read by its names against the gold names.
    task = resolve_task(TaskConfig(task="polarity"))
    dev = task.examples("dev")
    x = load_tokenizer(src, 16)([ex.text_a for ex in dev], max_seq_len=16)
    predicted = np.argmax(load_model(src)(x, training=False)["logits"].numpy(), -1)
    gold = [task.type.label_names[ex.label] for ex in dev]
    want = np.mean([["pos", "neg"][p] == g for p, g in zip(predicted, gold)])
    assert parity["formats"]["float32"]["metric"] == pytest.approx(want)
    assert parity["formats"]["keras"]["metric"] == pytest.approx(want)
    # Other names than the task's: refused before anything is written.
    other = save_model(BertModel(config, head="classifier", label_names=["spam", "ham"],
                                 vocab=vocab), str(tmp_path / "other"))
    from tinybert_tf.export import ExportError
    with pytest.raises(ExportError, match=r"has the labels \['spam', 'ham'\] but task "
                       r"polarity has \['neg', 'pos'\]"):
        _export_in_process(tool, f"--model_dir={other}", f"--output_dir={tmp_path / 'p'}",
                           "--task=polarity", "--export_formats=float32")
    assert not (tmp_path / "p").exists()


def test_bin_export_reads_the_task_and_length_the_model_records(tmp_path, tiny_vocab, capsys):
    from tinybert_tf.export import ExportError
    from tinybert_tf.tasks import TaskConfig
    vocab = list(dict.fromkeys(tiny_vocab))
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_layers=1, num_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    model = BertModel(config, head="classifier", label_names=["neg", "pos"], vocab=vocab)
    bare = save_model(model, str(tmp_path / "bare"))
    tool = load_bin_export()
    # No --task and no record: refused, not scored on the demo's polarity set.
    with pytest.raises(ExportError, match=r"--task is required: .*bare does not record the "
                       r"task it was trained on"):
        _export_in_process(tool, f"--model_dir={bare}", f"--output_dir={tmp_path / 'o'}")
    # A general stage's model (no head, no task): named as what it is, not asked for --task.
    encoder = save_model(BertModel(config, vocab=vocab), str(tmp_path / "general"),
                         metadata={"stage": "general"})
    with pytest.raises(ExportError, match=r"general: has no task head \(an encoder, the "
                       r"general stage's output\); bin/export exports task models"):
        _export_in_process(tool, f"--model_dir={encoder}", f"--output_dir={tmp_path / 'g'}")
    recorded = save_model(model, str(tmp_path / "recorded"), metadata={
        "task": TaskConfig(task="polarity").to_record(), "max_seq_len": 24})
    parity = _export_in_process(tool, f"--model_dir={recorded}", f"--output_dir={tmp_path / 'a'}",
                                "--export_formats=float32", "--export_latency_runs=1")
    assert parity["task"] == "polarity" and parity["max_seq_len"] == 24
    capsys.readouterr()
    parity = _export_in_process(tool, f"--model_dir={recorded}", f"--output_dir={tmp_path / 'b'}",
                                "--export_formats=float32", "--export_latency_runs=1",
                                "--max_seq_len=32")
    assert parity["max_seq_len"] == 32
    err = capsys.readouterr().err
    assert "warning: --max_seq_len=32 but" in err and "was trained at 24" in err
    # A length the model cannot take: its error alone, naming the flag (no warning first).
    with pytest.raises(ExportError, match=r"^--max_seq_len=65: must be an integer in \[3, 64\] "
                       r"\(the model's max_position_embeddings\)\.$"):
        _export_in_process(tool, f"--model_dir={recorded}", f"--output_dir={tmp_path / 'd'}",
                           "--max_seq_len=65")
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "d").exists()
    # An explicit --serving_version=0 is refused, not published as version 1.
    with pytest.raises(ExportError, match=r"--serving_version=0: must be a positive integer"):
        _export_in_process(tool, f"--model_dir={recorded}", f"--output_dir={tmp_path / 'c'}",
                           "--serving_version=0")


@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o022, 0o644, 0o755),
                                                     (0o027, 0o640, 0o750)])
def test_every_file_of_a_hugging_face_export_gets_the_umasks_usual_mode(
        tmp_path, tiny_vocab, mask, file_mode, dir_mode):
    """safetensors writes model.safetensors owner-only (0600); published, it has the mode
    of the other files, what `open` gives under the umask."""
    from tinybert_tf.models.checkpoint import load_model
    from tinybert_tf.models.hf_io import export_hf
    model = load_model(model_dir(tmp_path, tiny_vocab, "classifier"))
    old = os.umask(mask)
    try:
        out = export_hf(model, str(tmp_path / "hf"))
    finally:
        os.umask(old)
    modes = {name: os.stat(os.path.join(out, name)).st_mode & 0o777
             for name in os.listdir(out)}
    assert "model.safetensors" in modes and "config.json" in modes
    assert modes == {name: file_mode for name in modes}, {k: oct(v) for k, v in modes.items()}
    assert os.stat(out).st_mode & 0o777 == dir_mode


@pytest.mark.parametrize("value,message", [
    ("99999999999999999999", "--serving_version=99999999999999999999: too large; TF "
                             "Serving's versions are int64, at most 9223372036854775807"),
    ("0", "--serving_version=0: must be a positive integer"),
])
def test_a_serving_version_out_of_range_names_the_limit_and_the_help_agrees(
        tmp_path, tiny_vocab, value, message):
    from tinybert_tf.export import ExportError
    tool = load_bin_export()
    src = model_dir(tmp_path, tiny_vocab, "classifier")
    with pytest.raises(ExportError, match=re.escape(message)):
        _export_in_process(tool, f"--model_dir={src}", f"--output_dir={tmp_path / 'out'}",
                           "--task=polarity", f"--serving_version={value}")
    assert not (tmp_path / "out").exists()
    help_text = tool.FLAGS["serving_version"].help
    assert "Unset: the next free one" in help_text and "0 and an existing version are errors" \
        in help_text and "2**63 - 1" in help_text
    assert "0: the next free one" not in help_text


def test_a_float_model_as_quantized_model_dir_names_that_flag_and_what_it_expects(
        tmp_path, tiny_vocab):
    from tinybert_tf.export import ExportError
    tool = load_bin_export()
    src = model_dir(tmp_path, tiny_vocab, "classifier")
    with pytest.raises(ExportError) as err:
        _export_in_process(tool, f"--model_dir={src}", f"--output_dir={tmp_path / 'out'}",
                           "--task=polarity", "--export_formats=float32",
                           f"--quantized_model_dir={src}")
    message = str(err.value)
    assert message.startswith(f"--quantized_model_dir={src} is a float model"), message
    assert "must be the quantize stage's fake-quantised copy of the student (OUTPUT/" \
        "quantize/model)" in message and "drop it to export the float model alone" in message
    assert "quantized=" not in message and f"--model_dir={src}" not in message
    assert not (tmp_path / "out" / "export" / "parity.json").exists()


def test_a_serving_model_name_is_used_as_given_and_a_bad_one_refused_before_writing(
        tmp_path, tiny_vocab):
    """TF Serving's model names are case-sensitive (/v1/models/NAME): `MyModel` must not
    become `mymodel`; a name it cannot take is refused, with nothing published."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from tinybert_tf.export import ExportError
    tool = load_bin_export()
    src = model_dir(tmp_path, tiny_vocab, "classifier")
    out = tmp_path / "out"
    _export_in_process(tool, f"--model_dir={src}", f"--output_dir={out}", "--task=polarity",
                       "--export_formats=saved_model", "--export_latency_runs=1",
                       "--serving_model_name=MyModel")
    config = text_format.Parse((out / "export" / "serving" / "models.config").read_text(),
                               model_server_config_pb2.ModelServerConfig())
    assert [(c.name, c.base_path) for c in config.model_config_list.config] == [
        ("MyModel", "/models/MyModel")]
    bad = tmp_path / "bad"
    with pytest.raises(ExportError, match=re.escape(
            "--serving_model_name='my model/x': use letters, digits, '_', '.' or '-'")):
        _export_in_process(tool, f"--model_dir={src}", f"--output_dir={bad}",
                           "--task=polarity", "--export_formats=saved_model",
                           "--serving_model_name=my model/x")
    assert not bad.exists()
