"""A stage is reused only when what it was made from is unchanged (its settings, the
stages it read, the absolute paths and content of its input files, its published
artefacts), found before anything runs; nothing is deleted before every check has
passed, nothing a run did not make, and no published TF Serving version."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.models.checkpoint import load_model, save_model
from tinybert_tf.pipeline import stage_io
from tinybert_tf.pipeline.main import parse_argv
from tinybert_tf.pipeline.preflight import PreflightError
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.run.state import OutputDirError, RunState
from tinybert_tf.pipeline.stages import stage_names
from tinybert_tf.tasks.catalog import resolve_task

from augment_helpers import tiny_vectors
from pipeline_helpers import argv, run, tiny_flags, write_task, write_teacher


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_vocab):
    """Flags whose augment stage runs in seconds (given word vectors), a task teacher."""
    tmp = tmp_path_factory.mktemp("reuse")
    vectors = str(tmp / "vectors.txt")
    tiny_vectors().save_word2vec_format(vectors, binary=False)
    teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="classifier")
    return tiny_flags(tmp, tiny_vocab, word_vectors=vectors, task_teacher=teacher,
                      general_model="none", use_augmented=False)


def _with(ns, **changes):
    return type(ns)(**{**vars(ns), **changes})


def _context(ns) -> Context:
    config = parse_argv(["bin/distill", *argv(ns)])
    return Context(config, resolve_task(config.task), RunState(config.run.output_dir),
                   tf.distribute.get_strategy())


def _finished_task_stage(ns, teacher_dir: str) -> Context:
    """OUTPUT/task as a finished task stage of `ns` would leave it (its model: a copy of
    `teacher_dir`), without training one."""
    ctx = _context(ns)
    state = ctx.state
    state.write_config(ctx.config.results())
    save_model(load_model(teacher_dir), state.work_path("task", "model"))
    state.mark_done("task", {}, ctx.config.stage_settings("task"),
                    stage_io.upstream_fingerprints(ctx, "task"),
                    stage_io.reads_of(ctx, "task", record=True), stage_io.outputs_of(ctx, "task"))
    return ctx


def test_changed_labels_or_another_data_path_redo_the_stage_saying_why(base, tmp_path,
                                                                       capsys):
    data = write_task(str(tmp_path / "data"))
    ns = _with(base, output_dir=str(tmp_path / "out"), data_dir=data, stages=["augment"])
    run(ns)
    done = json.load(open(tmp_path / "out" / "augment" / "stage_done.json"))
    assert done["reads"]["data"][0]["path"] == os.path.realpath(os.path.join(data, "dev.tsv"))
    capsys.readouterr()
    run(ns)
    assert "== augment: done already, skipped" in capsys.readouterr().out
    # Every training label flipped: same size, same path.
    train = os.path.join(data, "train.tsv")
    lines = open(train).read().splitlines()
    flipped = [lines[0]] + [t[:-1] + str(1 - int(t[-1])) for t in lines[1:]]
    open(train, "w").write("\n".join(flipped) + "\n")
    run(ns)
    out = capsys.readouterr().out
    assert "== augment: its data input changed since it was made" in out
    assert out.index("it runs again") < out.index("== augment\n")  # said before it runs
    # The same relative --data_dir seen from another folder is other data.
    shutil.copytree(data, tmp_path / "elsewhere" / "data")
    relative = _with(ns, data_dir="data", output_dir=str(tmp_path / "out2"))
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        run(relative)
        os.chdir(tmp_path / "elsewhere")
        capsys.readouterr()
        run(relative)
    finally:
        os.chdir(cwd)
    assert "its data input is now read from another path" in capsys.readouterr().out


def test_an_input_reached_through_a_link_is_the_same_input_and_a_copy_is_not(tmp_path):
    """A second checkout with the first one's virtual environment linked in reads the
    embedded teacher from inside the link: the same files, so no stage runs again."""
    from tinybert_tf.pipeline.run.state import _reads_diff, read_facts

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\ngood\t1\n")
    os.symlink(data, tmp_path / "link")
    real = read_facts({"data": [str(data / "train.tsv")]})
    linked = read_facts({"data": [str(tmp_path / "link" / "train.tsv")]})
    assert real["data"][0]["path"] == os.path.realpath(data / "train.tsv")
    assert linked == real and _reads_diff(real, linked) is None
    shutil.copytree(data, tmp_path / "copy")
    copied = read_facts({"data": [str(tmp_path / "copy" / "train.tsv")]})
    assert copied["data"][0]["content"] == real["data"][0]["content"]
    assert "is now read from another path" in _reads_diff(real, copied)


def _copy_with_new_mtimes(src, dst) -> None:
    """`cp -r` without -p: the content, every file with another mtime."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    for folder, _, names in os.walk(dst):
        for name in names:
            os.utime(os.path.join(folder, name), ns=(10**18, 10**18))


@pytest.fixture
def small_limits(monkeypatch):
    """Files over 1 KiB count as large (fingerprinted by size, mtime and 64-byte edges)."""
    monkeypatch.setattr(files, "FULL_HASH_LIMIT", 1024)
    monkeypatch.setattr(files, "EDGE_BYTES", 64)


def test_a_large_file_copied_with_a_new_mtime_matches_its_record_and_an_edit_does_not(
        tmp_path, small_limits, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    weights = bytes(range(256)) * 16  # 4 KiB: a large file here
    (model / "weights.bin").write_bytes(weights)
    (model / "config.json").write_text("{}")
    recorded = {p: files.recorded_fingerprint(str(p)) for p in (model, model / "weights.bin")}
    for path, fp in recorded.items():
        quick, whole = fp.split(":")
        assert quick == files.content_fingerprint(str(path)) and whole != quick
    _copy_with_new_mtimes(model, tmp_path / "copy")
    copy = tmp_path / "copy"
    assert files.content_fingerprint(str(copy)) != recorded[model].split(":")[0]
    assert files.same_content(str(copy), recorded[model])
    assert files.same_content(str(copy / "weights.bin"), recorded[model / "weights.bin"])
    # One byte in the middle, beyond both edges: another content.
    edited = bytearray(weights)
    edited[2000] ^= 1
    (copy / "weights.bin").write_bytes(bytes(edited))
    assert not files.same_content(str(copy), recorded[model])
    assert not files.same_content(str(copy / "weights.bin"), recorded[model / "weights.bin"])
    assert not files.same_content(str(tmp_path / "nothing"), recorded[model])
    # Large files totalling more than CONTENT_HASH_LIMIT keep only size, mtime and edges:
    # there a copy counts as a change.
    monkeypatch.setattr(files, "CONTENT_HASH_LIMIT", 2048)
    quick_only = files.recorded_fingerprint(str(model))
    assert quick_only == files.content_fingerprint(str(model))
    _copy_with_new_mtimes(model, tmp_path / "copy2")
    assert not files.same_content(str(tmp_path / "copy2"), quick_only)


def test_a_run_folder_copied_without_its_mtimes_reuses_its_stages_until_a_model_changes(
        base, tmp_path, small_limits):
    """`cp -r` of a finished run, and a teacher copied back in place (a re-download, a
    reinstalled package): the same content with new mtimes, so nothing runs again."""
    teacher = tmp_path / "teacher"
    shutil.copytree(base.task_teacher, teacher)
    ns = _with(base, output_dir=str(tmp_path / "out"), stages=["task"],
               task_teacher=str(teacher))
    _finished_task_stage(ns, base.task_teacher)
    shutil.rmtree(teacher)
    _copy_with_new_mtimes(base.task_teacher, teacher)
    _copy_with_new_mtimes(tmp_path / "out", tmp_path / "copied")
    copied = _context(_with(ns, output_dir=str(tmp_path / "copied")))
    record = copied.state.record("task")
    assert all(":" in fp for fp in record["outputs"].values())  # the model is large here
    assert ":" in record["reads"]["task_teacher"][0]["content"]
    assert stage_io.reuse_problem(copied, "task") is None
    # The copied student's weights edited (same size, new mtime): the stage is stale.
    weights = max((os.path.join(d, n) for d, _, names in os.walk(copied.student_path())
                   for n in names), key=os.path.getsize)
    data = bytearray(open(weights, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(weights, "wb").write(bytes(data))
    assert "task/model changed since the stage finished" in stage_io.reuse_problem(copied,
                                                                                  "task")


def test_a_hand_deleted_model_is_found_before_anything_runs_or_is_deleted(base, tmp_path):
    ns = _with(base, output_dir=str(tmp_path / "out"), stages=["task"],
               export_formats=["float32"])
    ctx = _finished_task_stage(ns, base.task_teacher)
    export = tmp_path / "out" / "export"
    (export / "serving" / "1").mkdir(parents=True)
    (export / "serving" / "1" / "saved_model.pb").write_text("the only export")
    shutil.rmtree(ctx.student_path())
    for stages, overwrite in ((["evaluate"], False), (["export"], True)):
        with pytest.raises(PreflightError, match=r"task/model: missing, although the task stage "
                           r"is marked done .*add task to --stages, or run --stages=task "
                           r"--overwrite"):
            run(_with(ns, stages=stages, overwrite=overwrite))
    assert (export / "serving" / "1" / "saved_model.pb").read_text() == "the only export"
    # A model changed by hand is as stale as a deleted one.
    _finished_task_stage(ns, base.task_teacher)
    with open(os.path.join(ctx.student_path(), "config.json"), "a") as f:
        f.write(" ")
    with pytest.raises(PreflightError, match=r"evaluate reads the output of task, which is "
                       r"stale \(its output .*task/model changed since the stage finished\)"):
        run(_with(ns, stages=["evaluate"]))


def test_the_dry_runs_plan_says_which_done_stages_a_run_would_redo(base, tmp_path):
    """--overwrite deletes every named stage's folder: the plan said "reused" for a done
    stage that the run then started over."""
    ns = _with(base, output_dir=str(tmp_path / "out"), stages=["task"])
    _finished_task_stage(ns, base.task_teacher)
    assert run(_with(ns, dry_run=True))["reuse"] == {"task": "reused"}
    assert run(_with(ns, dry_run=True, overwrite=True))["reuse"] == {
        "task": "runs again: --overwrite starts it over"}
    # A dry run deletes nothing.
    assert os.path.isfile(tmp_path / "out" / "task" / "stage_done.json")


def test_an_output_dir_inside_a_folder_the_run_reads_is_refused_before_writing(base, tmp_path):
    """Everything under a folder input is fingerprinted: a run writing into its teacher's
    folder found the teacher changed at every re-run and redid the stage."""
    teacher = str(tmp_path / "teacher")
    shutil.copytree(base.task_teacher, teacher)
    out = os.path.join(teacher, "runs", "r1")
    with pytest.raises(PreflightError) as info:
        run(_with(base, output_dir=out, task_teacher=teacher, stages=["task"]))
    assert f"--output_dir={out}: inside {teacher}, the task teacher the task stage reads" \
        in str(info.value) and f"Choose an --output_dir outside {teacher}." in str(info.value)
    assert not os.path.exists(os.path.join(teacher, "runs"))
    # Another run's model, which this run does not read, is refused too: that run would
    # find its model changed and train it again.
    out = os.path.join(teacher, "r2")
    with pytest.raises(PreflightError) as info:
        run(_with(base, output_dir=out, stages=["task"]))
    assert (f"--output_dir={out}: inside the model directory {teacher} (tinybert_tf format); "
            "what is written there would change that model") in str(info.value)
    assert not os.path.exists(out)


def test_a_redo_keeps_published_serving_versions_and_a_user_folder_is_never_deleted(
        base, tmp_path):
    state = RunState(str(tmp_path / "out"))
    for rel in ("export/serving/1/saved_model.pb", "export/model_float32.tflite",
                "export/parity.json", "task/model/config.json"):
        os.makedirs(os.path.dirname(state.path(rel)), exist_ok=True)
        open(state.path(rel), "w").write("x")
    # Not a run's folder (no run_config.json, no stage records): nothing is deleted,
    # also where another project's folder holds a checkpoint or records named like
    # ours (`--output_dir=~/projects`) ...
    for rel in ("bert/run1/ckpt/checkpoint", "bert/stage_done.json",
                "bert/run1/phase_done.json"):
        os.makedirs(os.path.dirname(state.path(rel)), exist_ok=True)
        open(state.path(rel), "w").write("{}")
    (tmp_path / "out" / ".lock").write_text("another program's lock\n")
    assert not state.made_by_a_run()
    state.reset(["export", "task"])
    assert os.path.isfile(state.path("export/parity.json"))
    # ... and no run writes into it.
    (tmp_path / "out" / "report.json").write_text("{\"mine\": 1}")
    with pytest.raises(PreflightError, match=r"holds .*task, .*export, .*report\.json that no "
                       r"bin/distill run made .*choose a new or empty folder"):
        run(_with(base, output_dir=state.output_dir, stages=["export"], overwrite=True))
    assert (tmp_path / "out" / "report.json").read_text() == "{\"mine\": 1}"
    # A run's folder: the stage goes, its published versions stay.
    state.write_config({})
    state.reset(["export"], keep=[state.path("export", "serving")])
    assert sorted(os.listdir(state.path("export"))) == ["serving"]
    assert open(state.path("export/serving/1/saved_model.pb")).read() == "x"
    # Redoing export keeps the report it only adds to; redoing a stage the report is
    # made from drops it (`StageFolder.remakes_report`).
    assert os.path.isfile(state.path("report.json"))
    state.reset(["task"])
    assert not os.path.exists(state.path("report.json"))
    assert not os.path.exists(state.path("task"))


def test_a_stale_export_publishes_the_next_version_next_to_the_first(base, tmp_path, capsys):
    data = write_task(str(tmp_path / "data"))
    ns = _with(base, output_dir=str(tmp_path / "out"), data_dir=data,
               stages=["export"], export_formats=["saved_model"])
    _finished_task_stage(_with(ns, stages=["task"]), base.task_teacher)
    run(ns)
    served = tmp_path / "out" / "export" / "serving"
    first = (served / "1" / "saved_model.pb").read_bytes()
    with open(os.path.join(data, "dev.tsv"), "a") as f:
        f.write("a good film\t1\n")
    # The task stage read the data too: it is stale, and is redone first when named.
    with pytest.raises(PreflightError, match=r"export reads the output of task, which is stale"):
        run(ns)
    _finished_task_stage(_with(ns, stages=["task"]), base.task_teacher)
    capsys.readouterr()
    run(ns)
    assert "== export: made from an earlier output of task; it runs again" in \
        capsys.readouterr().out
    assert sorted(os.listdir(served)) == ["1", "2", "models.config"]
    assert (served / "1" / "saved_model.pb").read_bytes() == first  # never rewritten
    assert files.content_fingerprint(str(served / "2")) != "missing"


def test_a_hand_deleted_serving_version_redoes_the_export_saying_why(base, tmp_path, capsys):
    ns = _with(base, output_dir=str(tmp_path / "out"), stages=["export"],
               export_formats=["saved_model"])
    _finished_task_stage(_with(ns, stages=["task"]), base.task_teacher)
    run(ns)
    served = tmp_path / "out" / "export" / "serving"
    done = json.load(open(tmp_path / "out" / "export" / "stage_done.json"))
    assert done["outputs"][os.path.join("export", "serving", "1")] == "exists"
    shutil.rmtree(served / "1")  # the only version, deleted by hand
    capsys.readouterr()
    run(ns)
    out = capsys.readouterr().out
    assert (f"== export: its output {served / '1'} is missing (deleted since the stage "
            "finished); it runs again") in out
    assert (served / "1" / "saved_model.pb").is_file()
    capsys.readouterr()
    run(ns)
    assert "== export: done already, skipped" in capsys.readouterr().out


def test_a_flag_only_a_stage_that_never_ran_reads_does_not_refuse_the_folder(base, tmp_path,
                                                                            capsys):
    """run_config.json written by a run of augment alone: a later run changing only
    --teacher_lr (read by finetune_teacher, which never ran there) is not refused; one
    changing augment's --num_aug is."""
    ns = _with(base, output_dir=str(tmp_path / "out"), stages=["augment"], num_aug=2)
    run(ns)
    capsys.readouterr()
    run(_with(ns, teacher_lr=0.5))
    assert "== augment: done already, skipped" in capsys.readouterr().out
    with pytest.raises(OutputDirError, match=r"different config \(--num_aug: 2 there, 3 now"):
        run(_with(ns, num_aug=3))


def test_the_config_guard_weighs_only_the_settings_of_the_stages_that_ran(base, tmp_path):
    """A folder where only finetune_teacher ran takes another --num_aug (augment's), but
    not another --teacher_lr (finetune_teacher's)."""
    config = parse_argv(["bin/distill", *argv(_with(base, output_dir=str(tmp_path)))])
    state = RunState(str(tmp_path))
    state.write_config(config.results())
    state.mark_done("finetune_teacher", {}, config.stage_settings("finetune_teacher"), {})
    stage_flags = {s: list(config.stage_settings(s)) for s in stage_names()}
    changed = {**config.results(), "num_aug": config.augment.num_aug + 1}
    state.check_config(changed, False, stage_flags)
    with pytest.raises(OutputDirError, match="--teacher_lr"):
        state.check_config({**config.results(), "teacher_lr": 0.5}, False, stage_flags)
