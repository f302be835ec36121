"""Flagfiles: nested ones resolve against the including file, errors name file and line;
a value that starts with `~/` is the home folder's."""
from __future__ import annotations

import os

import pytest

from tinybert_tf.cli.flagfiles import FlagfileError, expand_flagfiles
from tinybert_tf.export import ExportError, check_formats
from tinybert_tf.pipeline.main import main, parse_command


def write(path, text: str, bom: bool = False) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return str(path)


def test_a_nested_flagfile_is_found_next_to_the_file_that_names_it(tmp_path, monkeypatch):
    write(tmp_path / "cfg" / "common.cfg", "# shared\n--seed=7\n\n// absl comment\n--a=1\n")
    top = write(tmp_path / "cfg" / "task.cfg", "--flagfile=common.cfg\n  --b=2  \n")
    monkeypatch.chdir(tmp_path)  # not the folder of the flagfiles
    assert expand_flagfiles(["prog", f"--flagfile={top}", "--c=3"]) == \
        ["prog", "--seed=7", "--a=1", "--b=2", "--c=3"]
    # The two-argument form, as absl accepts it; arguments after -- stay as they are.
    assert expand_flagfiles(["prog", "--flagfile", "cfg/task.cfg", "--", "--flagfile=x"]) == \
        ["prog", "--seed=7", "--a=1", "--b=2", "--", "--flagfile=x"]


def test_a_nested_path_written_for_the_current_folder_still_works(tmp_path, monkeypatch):
    write(tmp_path / "configs" / "common.cfg", "--seed=7\n")
    write(tmp_path / "configs" / "task.cfg", "--flagfile=configs/common.cfg\n")
    monkeypatch.chdir(tmp_path)
    assert expand_flagfiles(["prog", "--flagfile=configs/task.cfg"]) == ["prog", "--seed=7"]


def test_a_byte_order_mark_is_dropped(tmp_path):
    top = write(tmp_path / "bom.cfg", "--seed=7\n", bom=True)
    assert expand_flagfiles(["prog", f"--flagfile={top}"]) == ["prog", "--seed=7"]


def test_a_flagfile_saved_as_utf16_names_its_encoding_and_the_fix(tmp_path):
    """Windows Notepad's "Unicode" is UTF-16 with a byte-order mark."""
    path = tmp_path / "win.cfg"
    path.write_bytes("--seed=7\n".encode("utf-16"))
    with pytest.raises(FlagfileError, match=r"win\.cfg: not UTF-8 text .*save the flagfile as "
                       r"UTF-8: the file is UTF-16 \(its byte-order mark says so\): re-encode "
                       r"it, e\.g\. iconv -f UTF-16 -t UTF-8"):
        expand_flagfiles(["prog", f"--flagfile={path}"])


def test_a_value_starting_with_the_home_folder_is_expanded(tmp_path, monkeypatch):
    """The shell leaves `--output_dir=~/runs` as it is (it expands `~` only at a word's
    start), and the run wrote into a folder named `~` in the current one."""
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    home = str(tmp_path / "me")
    top = write(tmp_path / "run.cfg", "--teacher=~/models/bert\n--corpus=~/a.txt,b.txt,~/c\n")
    assert expand_flagfiles(["prog", f"--flagfile={top}", "--output_dir=~/runs/x",
                             "--serving_model_name=~x", "--labels=a,~b", "-o=~"]) == [
        "prog", f"--teacher={home}/models/bert", f"--corpus={home}/a.txt,b.txt,{home}/c",
        f"--output_dir={home}/runs/x", "--serving_model_name=~x", "--labels=a,~b",
        f"-o={home}"]


def test_a_missing_nested_flagfile_names_the_file_and_line_that_named_it(tmp_path):
    top = write(tmp_path / "task.cfg", "--seed=1\n--flagfile=gone.cfg\n")
    with pytest.raises(FlagfileError, match=r"Unable to open flagfile gone\.cfg \(named at "
                       r".*task\.cfg:2\): no such file .*gone\.cfg"):
        expand_flagfiles(["prog", f"--flagfile={top}"])


def test_flagfiles_that_include_each_other_are_refused(tmp_path):
    write(tmp_path / "a.cfg", "--flagfile=b.cfg\n")
    write(tmp_path / "b.cfg", "--flagfile=a.cfg\n")
    with pytest.raises(FlagfileError, match=r"include each other .*a\.cfg -> .*b\.cfg -> "
                       r".*a\.cfg"):
        expand_flagfiles(["prog", f"--flagfile={tmp_path / 'a.cfg'}"])


def test_bin_distill_reports_a_bad_nested_flagfile_in_one_line(tmp_path, capsys):
    top = write(tmp_path / "task.cfg", "--flagfile=missing.cfg\n")
    code = main(["bin/distill", f"--flagfile={top}", f"--output_dir={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("distill: ")] == [
        ln for ln in err.splitlines() if ln.startswith("distill: error: Unable to open "
                                                       "flagfile missing.cfg (named at ")]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("line,fix", [
    ('--output_dir="runs/x"', "the quotes would be part of the value; write "
                              "--output_dir=runs/x."),
    ("--output_dir='runs/x'", "write --output_dir=runs/x."),
    ("--output_dir=runs/x  # the run's folder", "the comment would be part of it; put the "
                                                "comment on a line of its own."),
])
def test_a_flagfile_line_in_a_shells_habits_names_its_line_not_a_folder_with_quotes(
        tmp_path, line, fix):
    """absl takes quotes and a trailing comment as part of the value: such a run wrote
    into a folder named `"runs` (or `runs/x  # the run's folder`)."""
    cfg = write(tmp_path / "run.cfg", f"--seed=1\n# a comment line\n{line}\n")
    with pytest.raises(FlagfileError) as err:
        expand_flagfiles(["prog", f"--flagfile={cfg}"])
    assert str(err.value).startswith(f"{cfg}:3: {line}: ") and str(err.value).endswith(fix)
    # Quotes inside a value, an apostrophe, a '#' not after a space: values as written.
    ok = write(tmp_path / "ok.cfg", "--labels=it's,\"a\"b\n--text_column=col#1\n")
    assert expand_flagfiles(["prog", f"--flagfile={ok}"]) == [
        "prog", "--labels=it's,\"a\"b", "--text_column=col#1"]


# --- a flag typed on the command line that no stage of the run reads ---

@pytest.mark.parametrize("typed,named,switch", [
    (["--noquantize", "--quantize_steps=50"], "--quantize_steps: only the quantize stage",
     "--noquantize"),
    (["--export_formats=float32", "--quantize_lr=1e-4"], "--quantize_lr: only the quantize",
     "--export_formats=float32"),
    (["--task_teacher=t", "--teacher_epochs=2"], "--teacher_epochs: only the finetune_teacher",
     "--task_teacher=t"),
    (["--general_model=g", "--init_from_teacher"], "--init_from_teacher: only the general",
     "--general_model=g"),
    (["--nouse_augmented", "--num_aug=3"], "--num_aug: only the augment stage",
     "--nouse_augmented"),
    # Run options: read by one stage (read_by=), not part of its output.
    (["--nouse_augmented", "--augment_batch_size=64"], "--augment_batch_size: only the "
     "augment stage", "--nouse_augmented"),
    (["--general_model=g", "--input_sharding=exact"], "--input_sharding: only the general",
     "--general_model=g"),
])
def test_a_typed_flag_that_only_a_skipped_stage_reads_is_named_with_the_switch(
        typed, named, switch, tmp_path):
    config, warnings = parse_command(["bin/distill", f"--output_dir={tmp_path / 'out'}",
                                      *typed])
    assert len(warnings) == 1 and warnings[0].startswith(named), warnings
    assert f"skips that stage ({switch}), so it is ignored" in warnings[0], warnings[0]
    assert warnings[0].endswith(f"drop it, or drop {switch}."), warnings[0]
    assert config.run.stages == ("all",)


def test_export_format_names_are_read_in_any_case_as_task_names_are(tmp_path):
    """`--export_formats=SAVED_MODEL,Int8` is the registered saved_model,int8: the quantize
    stage (run for int8) reads --quantize_lr, and run_config.json records one spelling."""
    config, warnings = parse_command(["bin/distill", f"--output_dir={tmp_path / 'out'}",
                                      "--export_formats=SAVED_MODEL,Int8, float32",
                                      "--quantize_lr=1e-4"])
    assert config.export.formats == ("saved_model", "int8", "float32")
    assert warnings == []
    assert check_formats(["HF", "hf", "Float16 "]) == ("hf", "float16")
    with pytest.raises(ExportError, match="unknown export format 'ONNX'"):
        check_formats(["ONNX"])


@pytest.mark.parametrize("typed,said", [
    (["--pkd_lr=1e-4"], "--pkd_lr: only the pkd phase of the task stage reads it, and "
     "--task_phases=intermediate,prediction has none, so it is ignored: drop it, or add pkd"),
    (["--task_phases=prediction", "--intermediate_epochs=5"], "--intermediate_epochs: only "
     "the intermediate phase of the task stage reads it, and --task_phases=prediction has "
     "none"),
    (["--alpha_ce=2"], "--alpha_ce: only --recipe=distilbert reads it, and this run's "
     "general stage has --recipe=tinybert, so it is ignored"),
])
def test_a_typed_flag_of_a_phase_or_recipe_the_run_does_not_use_is_named(typed, said, tmp_path):
    """A phase kind's epochs and learning-rate flags, and a recipe's own flags, are read
    only when --task_phases lists the kind or --recipe names the recipe."""
    _, warnings = parse_command(["bin/distill", f"--output_dir={tmp_path / 'out'}", *typed])
    assert len(warnings) == 1 and warnings[0].startswith(said), warnings
    for used in (["--task_phases=pkd,prediction", "--pkd_lr=1e-4"],
                 ["--recipe=distilbert", "--alpha_ce=2"]):
        assert parse_command(["bin/distill", f"--output_dir={tmp_path / 'out'}", *used])[1] \
            == [], used


def test_a_flagfiles_setting_of_a_stage_the_command_line_skips_is_taken_quietly(tmp_path):
    """demo.cfg sets the quantize and augment stages' flags; the documented
    `--flagfile=configs/demo.cfg --noquantize` must say nothing of them. Nor of a typed
    flag at its default, nor of any flag when --stages names the stages (a re-run
    repeats the whole command)."""
    cfg = write(tmp_path / "q.cfg", "--quantize_steps=50\n--num_aug=3\n--teacher_epochs=2\n")
    out = f"--output_dir={tmp_path / 'out'}"
    for argv in ([f"--flagfile={cfg}", "--noquantize", "--nouse_augmented", "--task_teacher=t"],
                 ["--noquantize", "--quantize_steps=300"],
                 ["--stages=task,evaluate", "--noquantize", "--quantize_steps=50"]):
        config, warnings = parse_command(["bin/distill", out, *argv])
        assert config.quantize.enabled is False and warnings == [], argv


def test_a_typed_setting_read_only_under_another_flags_value_is_named(tmp_path):
    """`when=(flag, value)` settings: --tpu only with --strategy=tpu, the cache budget only
    with --teacher_cache; the warning holds under an explicit --stages too."""
    out = f"--output_dir={tmp_path / 'out'}"
    _, warnings = parse_command(["bin/distill", out, "--tpu=grpc://10.0.0.2:8470",
                                 "--stages=task"])
    assert warnings == ["--tpu: read only with --strategy=tpu, and this run has "
                        "--strategy=default, so it is ignored: drop it, or give "
                        "--strategy=tpu."]
    _, warnings = parse_command(["bin/distill", out, "--noteacher_cache",
                                 "--teacher_cache_budget_gb=2"])
    assert warnings == ["--teacher_cache_budget_gb: read only with --teacher_cache, and this "
                        "run has --noteacher_cache, so it is ignored: drop it, or give "
                        "--teacher_cache."]
    assert parse_command(["bin/distill", out, "--teacher_cache_budget_gb=2"])[1] == []
