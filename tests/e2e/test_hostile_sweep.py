"""A hostile user's sweep: bad flags, missing files, bad configs, damaged or busy output
folders. Each case ends in `distill: error: ...` naming the flag or file, exit status 2,
no traceback, nothing trained or recorded; each message is asserted. Cases run
`main` in-process (what bin/distill
runs; a subprocess per case would re-import TensorFlow), mostly as dry runs; two run
bin/distill itself."""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tinybert_tf.pipeline.main import main
from tinybert_tf.pipeline.run.lock import FileLock

from pipeline_helpers import argv, run, run_distill, tiny_flags, write_flagfile, write_teacher

STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
               "sentence1", "sentence2", "score"]


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_vocab):
    tmp = tmp_path_factory.mktemp("sweep")
    teacher = write_teacher(str(tmp / "task_teacher"), tiny_vocab, head="classifier")
    (tmp / "empty_corpus.txt").write_text("\n\n")
    (tmp / "a_file").write_text("x")
    stsb = tmp / "stsb"
    stsb.mkdir()
    for name, score in (("train.tsv", "7.0"), ("dev.tsv", "2.5")):
        rows = ["\t".join(STSB_HEADER)] + [
            "\t".join(["0", "g", "f", "y", "0", "s", "s", "a cat", "a dog", "3.2"]),
            "\t".join(["1", "g", "f", "y", "1", "s", "s", "the film", "a movie", score])]
        (stsb / name).write_text("\n".join(rows) + "\n")
    reviews = tmp / "reviews"
    reviews.mkdir()
    for name, n in (("train.csv", 240), ("dev.csv", 8)):
        (reviews / name).write_text("text,title,label\n" + "".join(
            f"a good film number {i},title {i},{'pos' if i % 2 else 'neg'}\n"
            for i in range(n)))
    return tmp, tiny_flags(tmp, tiny_vocab, task_teacher=teacher, general_model="none",
                           dry_run=True, stages=["task"], use_augmented=False)


# Own-data flags for the base fixture's reviews CSV files.
_OWN = dict(task="text_classification", data_dir="", train_file="{tmp}/reviews/train.csv",
            validation_file="{tmp}/reviews/dev.csv", stages=["task"])


def _teacher_with_extra_token(tmp, vocab):
    path = write_teacher(str(tmp / "extra_token_teacher"), vocab, head="classifier")
    with open(os.path.join(path, "vocab.txt"), "a", encoding="utf-8") as f:
        f.write("zebra\n")
    return path


def _setup_unfinished_general(tmp, out, vocab):
    write_teacher(str(out / "general" / "model"), vocab)
    (out / "run_config.json").write_text("{}")
    return {"general_model": str(out / "general" / "model")}


# name: (flag changes (values may use {tmp} and {out}), setup(tmp, out) or None,
#        pattern the error must match, text it must not hold)
CASES = {
    "zero general batch": (dict(general_batch_size=0, stages=["general"]), None,
                           r"^--general_batch_size=0: must be > 0\.$", None),
    "negative task batch": (dict(task_batch_size=-4), None,
                            r"^--task_batch_size=-4: must be > 0\.$", "lower"),
    "negative max steps": (dict(general_max_steps=-5, stages=["general"]), None,
                           r"^--general_max_steps=-5: must be >= 0", None),
    "no loss terms": (dict(loss_terms=[], stages=["general", "task"]), None,
                      r"^--loss_terms: no loss term given", None),
    "misspelt stage": (dict(stages=["general", "tsak"]), None,
                       r"^--stages: unknown stage\(s\) tsak; use a comma list", None),
    "no kept checkpoints": (dict(keep_checkpoints=0), None,
                            r"^--keep_checkpoints=0: must be >= 1\.$", None),
    "zero temperature": (dict(temperature=0.0), None, r"^--temperature=0\.0: must be > 0\.$",
                         None),
    "augmentation replacing nothing": (dict(replace_prob=0.0), None,
                                       r"^--replace_prob=0\.0: must be in \(0, 1\] \(0 "
                                       r"replaces no word, .*give --nouse_augmented\)\.$", None),
    "zero accumulation": (dict(grad_accum_steps=0), None,
                          r"^--grad_accum_steps=0: must be >= 1\.$", "ZeroDivision"),
    "words as layer weights": (dict(layer_weights=["a", "1"]), None,
                               r"^--layer_weights=a,1: item 1 \('a'\) must be a number >= 0",
                               "could not convert"),
    "negative general epochs": (dict(general_epochs=-1, stages=["general"]), None,
                                r"^--general_epochs=-1\.0: must be >= 0\.$", "num_train_steps"),
    "zero general epochs": (dict(general_epochs=0, stages=["general"]), None,
                            r"--general_epochs=0: the general stage would train nothing", None),
    "nothing to distil": (dict(pred_epochs=0, task_phases=["prediction"]), None,
                          r"--pred_epochs=0: the prediction phase of --task_phases=prediction "
                          r"would train nothing and leave the task head untrained", None),
    "zero intermediate epochs": (dict(intermediate_epochs=0), None,
                                 r"--intermediate_epochs=0: the intermediate phase .* drop "
                                 r"intermediate from --task_phases", None),
    "missing data dir": (dict(data_dir="/nonexistent", stages=["all"], task_teacher="",
                              dry_run=False), None,
                         r"/nonexistent: task directory not found; --data_dir", None),
    "unknown export format": (dict(export_formats=["onnx"], stages=["all"], task_teacher="",
                                   dry_run=False),
                              None, r"--export_formats: unknown export format 'onnx'", None),
    "uncalibrated int8": (dict(export_formats=["int8"], representative_examples=0,
                               stages=["task", "export"]), None,
                          r"--representative_examples=0: int8 calibrate", None),
    "too long for the teacher": (dict(max_seq_len=100, dry_run=False), None,
                                 r"--max_seq_len=100 exceeds --task_teacher's "
                                 r"max_position_embeddings=64", "Dimensions"),
    "too long for general": (dict(general_max_seq_len=100, stages=["general"]), None,
                             r"--general_max_seq_len=100 exceeds the teacher's", None),
    "evaluate alone": (dict(stages=["evaluate"], task_teacher=""), None,
                       r"evaluate reads the output of finetune_teacher, which is not in "
                       r".*finetune_teacher; add finetune_teacher to --stages", "keras-hub"),
    "task without augment": (dict(stages=["task"], use_augmented=True), None,
                             r"task reads the output of augment, which is not in .*augment; "
                             r"add augment to --stages \(or give --nouse_augmented\)",
                             "--data_dir"),
    "augmented file deleted": (
        dict(stages=["task"], use_augmented=True),
        lambda tmp, out, vocab: (out / "augment").mkdir(parents=True)
        or (out / "augment" / "stage_done.json").write_text('{"stage": "augment"}') and {},
        r"train_aug\.tsv: missing, although the augment stage is marked done .*"
        r"--stages=augment --overwrite", "--data_dir must"),
    "output dir is a file": (dict(output_dir="{tmp}/a_file"), None,
                             r"--output_dir=.*a_file: is a file", None),
    "unknown flag": (dict(), None, r"^Unknown command line flag 'nosuchflag'", None),
    "not a number": (dict(), None, r"^flag --task_batch_size=abc: invalid literal", None),
    "missing flagfile": (dict(), None, r"^Unable to open flagfile.*nonexistent\.cfg",
                         "ERROR::"),
    "unknown task": (dict(task="sst3"), None, r"^--task=sst3: unknown task", None),
    "missing teacher": (dict(teacher="/nonexistent", stages=["general"]), None,
                        r"--teacher=/nonexistent: ", None),
    # ORG/NAME is a Hugging Face hub id: the download advice, not "no such folder".
    "hub id as teacher": (dict(teacher="google/bert_uncased_L-2_H-128_A-2",
                               stages=["general"]), None,
                          r"--teacher=google/bert_uncased_L-2_H-128_A-2: no such folder; .*"
                          r"If .* is a Hugging Face model id \(ORG/NAME\), it needs a "
                          r"download.*snapshot_download", None),
    "missing student config": (dict(student_config="/nonexistent.json", stages=["general"]),
                               None, r"^--student_config: /nonexistent\.json", None),
    "missing corpus": (dict(corpus="/nonexistent.txt", stages=["general"]), None,
                       r"/nonexistent\.txt: no corpus file matches", None),
    "unknown strategy": (dict(strategy="nope"), None, r"^--strategy='nope' is unknown", None),
    "missing plugin": (dict(plugins=["nope_module"]), None,
                       r"^--plugins=nope_module: cannot import it", None),
    "missing word vectors": (dict(word_vectors="/nonexistent.txt", stages=["augment"]), None,
                             r"--word_vectors=/nonexistent\.txt: file not found", None),
    "stray argument": (dict(), None, r"^unexpected arguments: extra; use --flag=value", None),
    "no stages": (dict(stages=[""]), None, r"^--stages: no stage given; use a comma list of "
                  r"general, .* or 'all'\.$", None),
    "quantize without int8": (dict(stages=["task", "quantize"]), None,
                              r"^--stages=task,quantize: the quantize stage makes the int8 "
                              r"export's student, and this run has no int8 in "
                              r"--export_formats=saved_model,float32", None),
    "quantize with an mlm term": (dict(stages=["task", "quantize"], export_formats=["int8"],
                                       quantize_loss_terms=["mlm"]), None,
                                  r"^--quantize_loss_terms: unknown term 'mlm'; use any of "
                                  r"pred, embd, attn, hidn", None),
    "negative quantize steps": (dict(quantize_steps=-1), None,
                                r"^--quantize_steps=-1: must be >= 0", None),
    "bad lock staleness": (dict(lock_stale_minutes=0.0), None,
                           r"^--lock_stale_minutes=0\.0: must be > 0", None),
    "damaged run config": (dict(), lambda tmp, out, vocab: (out.mkdir(), (out / "run_config.json")
                                                            .write_text(""), {})[-1],
                           r"run_config\.json: damaged \(empty\); delete it", None),
    # A folder whose run produced something (a finished phase): a run that failed before
    # producing anything blocks no corrected command (test_recipes).
    "another config": (dict(dry_run=False), lambda tmp, out, vocab: (
        (out / "task" / "intermediate").mkdir(parents=True),
        (out / "task" / "intermediate" / "phase_done.json").write_text("{}"),
        (out / "run_config.json").write_text('{"seed": 1}'), {})[-1],
        r"holds a run with a different config \(--seed: 1 there, 42 now", None),
    "busy output dir": (dict(dry_run=False), None, r"^--output_dir=.* is in use by another run: "
                        r".*pid \d+, started", None),
    "unfinished general model": (dict(stages=["task"]), _setup_unfinished_general,
                                 r"--general_model=.*is the output of the general stage, which "
                                 r"has not finished", None),
    "empty corpus": (dict(dry_run=False, corpus="{tmp}/empty_corpus.txt", stages=["general"]),
                     None, r"empty_corpus\.txt: the corpus holds no text", "batch"),
    "too short a sequence": (dict(max_seq_len=2), None,
                             r"^--max_seq_len=2: must be 0 \(the task's default\) or >= 3 ",
                             None),
    "a vocab of another size": (dict(), lambda tmp, out, vocab: {
        "task_teacher": _teacher_with_extra_token(tmp, vocab)},
        r"extra_token_teacher: the vocab has \d+ tokens but the config says vocab_size=",
        None),
    "fine-tuning a teacher the run ignores": (
        dict(stages=["finetune_teacher", "task"]), None,
        r"--stages=finetune_teacher,task with --task_teacher=.*: the finetune_teacher stage "
        r"fine-tunes --teacher, but the later stages read --task_teacher", None),
    "label column is the text column": (
        dict(_OWN, label_column="text"), None,
        r"^--label_column=text is also --text_column: the label column must hold the labels",
        None),
    "label column of texts": (
        dict(_OWN, label_column="title"), None,
        r"reviews/train\.csv: the labels in column 'title' take 240 different values in 240 "
        r"rows, \['title 0', 'title 1', 'title 2', \.\.\. \(240 in all\)\]: that is text",
        "title 200"),
    "train file is a folder": (dict(_OWN, train_file="{tmp}/reviews"), None,
                               r"^--train_file=.*reviews: is a folder; give the file itself",
                               "extension"),
    # A config's --test_file (td_conll2003.cfg names conll2003/eng.testb): its flag named.
    "test file missing": (dict(_OWN, test_file="{tmp}/gone/test.csv"), None,
                          r"^--test_file=.*gone/test\.csv: file not found; fix the path, or "
                          r"give --test_file= \(empty: no test split\)\.$", None),
    "conll file for a text task": (dict(_OWN, train_file="{tmp}/train.conll"),
                                   lambda tmp, out, vocab: (
                                       (tmp / "train.conll").write_text("EU B-ORG\n"), {})[-1],
                                   r"train\.conll: cannot tell the format from the extension "
                                   r"'\.conll'; .*--data_format=csv\|tsv\|jsonl \(a CoNLL file "
                                   r"of tagged words is read by --task=token_classification\)",
                                   None),
    # absl's float flags take inf and nan: the range check refuses both, by name.
    "infinite learning rate": (dict(pred_lr=float("inf")), None,
                               r"^--pred_lr=inf: must be a finite number > 0\.$", None),
    "nan warm-up": (dict(general_warmup=float("nan")), None,
                    r"^--general_warmup=nan: must be a finite number in \[0, 1\]\.$",
                    "convert float NaN"),
    # Read by token_classification only: a text task ignored it.
    "tag column for a text task": (dict(_OWN, tag_column=1), None,
                                   r"^--tag_column=1: only tasks of type token_classification "
                                   r"read it, and --task=text_classification is "
                                   r"classification", None),
    "negative seed": (dict(seed=-1), None, r"^--seed=-1: must be in \[0, 2\*\*32 - 1\]",
                      "Seed must be"),
    "sts-b score out of range": (dict(task="sts-b", data_dir="{tmp}/stsb",
                                      stages=["finetune_teacher"], task_teacher=""), None,
                                 r"stsb/train\.tsv:3: score '7\.0' in column 10 is outside "
                                 r"sts-b's range \[0, 5\]", None),
}
EXTRA_ARGS = {"unknown flag": ["--nosuchflag=1"], "not a number": ["--task_batch_size=abc"],
              "missing flagfile": ["--flagfile=/nonexistent.cfg"], "stray argument": ["extra"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_command_ends_in_one_named_error_with_exit_code_2(name, base, tmp_path,
                                                                  tiny_vocab, capsys):
    tmp, ns = base
    changes, setup, pattern, absent = CASES[name]
    out = tmp_path / "out"
    values = {k: v.format(tmp=tmp, out=out) if isinstance(v, str) else v
              for k, v in changes.items()}
    values.setdefault("output_dir", str(out))
    if setup is not None:
        values.update(setup(tmp, out, tiny_vocab) or {})
    had_config = (out / "run_config.json").exists()
    lock = None
    if name == "busy output dir":
        lock = FileLock(str(out / ".lock"), f"--output_dir={out}").acquire()
    try:
        # The shared settings in a flagfile, as a user keeps them; the case's typed after.
        base_file = write_flagfile(ns, str(tmp_path / "base.cfg"))
        code = main(["bin/distill", f"--flagfile={base_file}",
                     *argv(type(ns)(**values)), *EXTRA_ARGS.get(name, [])])
    finally:
        if lock is not None:
            lock.release()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("distill: ")]
    assert len(lines) == 1 and lines[0].startswith("distill: error: "), err
    message = err[err.index("distill: error: ") + len("distill: error: "):]
    problems = [m.strip()[2:] for m in message.splitlines()[1:]] or [message.strip()]
    hits = [p for p in problems if re.search(pattern, p)]
    assert len(hits) == 1, problems  # named once, not echoed by later checks
    if absent:
        assert absent not in message, message
    # Refused before anything was trained or recorded (an empty corpus passes the checks:
    # the general stage finds it when it counts the corpus, before its first step).
    if name != "empty corpus":
        assert (out / "run_config.json").exists() == had_config
    assert not (out / "general" / "distill").exists() and not (out / "task" / "model").exists()


def test_a_vocab_with_a_byte_order_mark_is_read_as_the_glue_reader_does(base, tmp_path,
                                                                        tiny_vocab):
    tmp, ns = base
    teacher = write_teacher(str(tmp_path / "bom_teacher"), tiny_vocab, head="classifier")
    vocab = os.path.join(teacher, "vocab.txt")
    with open(vocab, "rb") as f:
        data = f.read()
    with open(vocab, "wb") as f:
        f.write(b"\xef\xbb\xbf" + data)
    plan = main(["bin/distill", *argv(type(ns)(**{**vars(ns), "task_teacher": teacher,
                                                   "output_dir": str(tmp_path / "o")}))])
    assert plan == 0


@pytest.mark.parametrize("extra,pattern", [
    (["--task_batch_size=-4", "--dry_run"], r"--task_batch_size=-4: must be > 0\."),
    (["--flagfile=/nonexistent.cfg"], r"Unable to open flagfile"),
])
def test_bin_distill_itself_exits_2_with_one_error_line(base, tmp_path, extra, pattern):
    tmp, ns = base
    flagfile = write_flagfile(type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "o"),
                                          "dry_run": False}), str(tmp_path / "run.cfg"))
    proc = run_distill(flagfile, *extra, timeout=120)
    assert isinstance(proc, subprocess.CompletedProcess)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("distill: error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and re.search(pattern, errors[0])
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("length", [1, 2])
def test_a_too_short_max_seq_len_is_one_problem_named_as_given(base, tmp_path, length, capsys):
    """The phases' plan packs texts at the length: it is not planned with a refused one,
    which would add a second problem naming a length nobody gave."""
    tmp, ns = base
    bad = type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "o"), "max_seq_len": length})
    assert main(["bin/distill", *argv(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("distill: error: ") == 1 and "problems" not in err, err
    assert f"--max_seq_len={length}: must be 0 (the task's default) or >= 3" in err, err


def test_a_run_that_failed_before_its_first_step_blocks_no_corrected_command(base, tmp_path,
                                                                           capsys):
    tmp, ns = base
    out = tmp_path / "out"
    bad = type(ns)(**{**vars(ns), "output_dir": str(out), "dry_run": False,
                      "corpus": str(tmp / "empty_corpus.txt"), "stages": ["general"]})
    assert main(["bin/distill", *argv(bad)]) == 2
    assert "the corpus holds no text" in capsys.readouterr().err
    assert (out / "run_config.json").exists()  # the checks had passed
    fixed = type(bad)(**{**vars(bad), "corpus": ns.corpus, "dry_run": True})
    assert main(["bin/distill", *argv(fixed)]) == 0, capsys.readouterr().err


def test_a_task_batch_is_compared_with_the_augmented_count_not_the_original(base, tmp_path):
    """24 training rows with --num_aug=2 give up to 72 augmented rows: a batch of 48 fits."""
    tmp, ns = base
    plan = run(type(ns)(**{**vars(ns), "output_dir": str(tmp_path / "o"), "use_augmented": True,
                           "stages": ["augment", "task"], "task_batch_size": 48,
                           "augment_fallback": True}))
    inter = [p for p in plan["phases"] if p["phase"] == "intermediate"][0]
    assert inter["examples"] == 72 and inter["steps_per_epoch"] == 1
    assert "at most 72 rows (the 24 original rows with up to 2 variants each" in inter["note"]


def test_a_bad_tf_config_task_names_the_cluster_and_the_fix():
    from tinybert_tf.pipeline.training.strategy import StrategyError, check_tf_config
    cluster = {"worker": ["host:1", "host:2"]}
    with pytest.raises(StrategyError, match=r"task index 5 of job 'worker', but the cluster lists "
                       r"2 worker task\(s\) \(indexes 0\.\.1\)"):
        check_tf_config({"cluster": cluster, "task": {"type": "worker", "index": 5}})
    with pytest.raises(StrategyError, match=r"task type 'chief' is not a job of the cluster"):
        check_tf_config({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    check_tf_config({"cluster": cluster, "task": {"type": "worker", "index": 1}})


def test_a_typed_flag_no_stage_reads_is_one_warning_in_the_plan_and_on_stderr(base, tmp_path,
                                                                              capsys):
    """The shared settings in a flagfile (which set the quantize stage's flags too), then
    --noquantize and a quantize flag typed: the dry run plans and prints one warning
    naming both, and says nothing of the flagfile's quantize settings."""
    tmp, ns = base
    base_file = write_flagfile(ns, str(tmp_path / "base.cfg"))
    capsys.readouterr()
    code = main(["bin/distill", f"--flagfile={base_file}", f"--output_dir={tmp_path / 'o'}",
                 "--stages=all", "--noquantize", "--quantize_steps=7"])
    out, err = capsys.readouterr()
    assert code == 0, err
    said = [w for w in json.loads(out)["warnings"] if "quantize_steps" in w]
    # Without int8 in --export_formats the stage is skipped too: both switches are named.
    assert "int8" not in ns.export_formats
    formats = f"--export_formats={','.join(ns.export_formats)}"
    assert said == ["--quantize_steps: only the quantize stage reads it, and this run skips "
                    f"that stage ({formats} and --noquantize), so it is ignored: drop it, or "
                    f"drop {formats} and --noquantize."]
    assert err.count("distill: warning: --quantize_steps") == 1
    assert "--quantize_lr" not in err and "--quantize_batch_size" not in err
