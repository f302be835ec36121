"""The paper's recipes with real-world teachers and configs: teacher label order by name,
explicit augmentation inputs, effective batches, DistilBERT's soft targets and packing,
stale stages, no decay without gradient, cased students, hard labels, the dry run."""
from __future__ import annotations

import json
import os
import shutil

import keras
import numpy as np
import pytest

from tinybert_tf.config import BertConfig
from tinybert_tf.models import BertModel
from tinybert_tf.models.checkpoint import load_model, save_model
from tinybert_tf.models.hf_io import export_hf
from tinybert_tf.pipeline.main import main, parse_argv, run_argv
from tinybert_tf.pipeline.preflight import PreflightError, resolve_stages
from tinybert_tf.pipeline.preflight.collect import Checks
from tinybert_tf.pipeline.run.context import Context
from tinybert_tf.pipeline.stages import common, finetune_teacher, general, stage_names
from tinybert_tf.pipeline.training.phases import plan_phase, task_phase_specs

from numerics import NOISE, decided
from pipeline_helpers import REPO, argv, load_weights, read_json, run, tiny_flags

MNLI = os.path.join(REPO, "tests", "fixtures", "glue", "MNLI")
HF_ORDER = ["entailment", "neutral", "contradiction"]  # run_glue.py's MNLI order
OUR_ORDER = ["contradiction", "entailment", "neutral"]


def _config(vocab, **changes) -> BertConfig:
    base = dict(vocab_size=len(vocab), hidden_size=32, num_layers=2, num_heads=4,
                intermediate_size=64, max_position_embeddings=64)
    return BertConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def hf_mnli_teacher(tmp_path_factory, tiny_vocab):
    """A Hugging Face BertForSequenceClassification directory in HF's MNLI label order."""
    keras.utils.set_random_seed(21)
    model = BertModel(_config(tiny_vocab), vocab=tiny_vocab, head="classifier",
                      label_names=HF_ORDER)
    return export_hf(model, str(tmp_path_factory.mktemp("hf") / "mnli_teacher"))


def _mnli_flags(tmp, vocab, teacher, **overrides):
    return tiny_flags(tmp, vocab, stages=["task", "evaluate"], task="mnli", data_dir=MNLI,
                      task_teacher=teacher, general_model="none", use_augmented=False,
                      task_batch_size=2, max_seq_len=32, intermediate_epochs=1,
                      pred_epochs=1, **overrides)


@pytest.mark.numerics
def test_hf_teacher_in_its_own_label_order_is_matched_by_name(mnli_run):
    """On the session's MNLI run (conftest.mnli_run), whose task teacher is a Hugging Face
    directory in HF's label order."""
    ns = mnli_run.ns
    report = read_json(os.path.join(ns.output_dir, "report.json"))
    # Independently: the raw teacher's logits, columns picked by name into our order.
    from tinybert_tf.models.checkpoint import load_tokenizer
    from tinybert_tf.tasks import TaskConfig, resolve_task
    raw = load_model(ns.task_teacher)
    assert raw.label_names == HF_ORDER
    task = resolve_task(TaskConfig(task="mnli", data_dir=MNLI))
    dev = task.examples("dev_matched")
    tok = load_tokenizer(raw, 32)
    x = tok([e.text_a for e in dev], [e.text_b for e in dev], max_seq_len=32)
    logits = raw(x, training=False)["logits"].numpy()
    ours = logits[:, [HF_ORDER.index(n) for n in OUR_ORDER]]
    want = float(np.mean(ours.argmax(-1) == np.array([e.label for e in dev])))
    # The run computed the same logits in other batches: a question within rounding of a
    # tie may go either way.
    ties = float(np.mean(~decided(ours, NOISE)))
    assert report["teacher"]["dev"]["dev_matched_accuracy"] == pytest.approx(want,
                                                                             abs=ties + 1e-9)
    # Read position by position, the same teacher would predict other classes here.
    assert (ours.argmax(-1) != logits.argmax(-1)).any()
    student = load_model(os.path.join(ns.output_dir, "task", "model"))
    assert student.label_names == OUR_ORDER


def test_generic_teacher_labels_need_an_explicit_order(tmp_path, tiny_vocab):
    keras.utils.set_random_seed(22)
    generic = export_hf(BertModel(_config(tiny_vocab), vocab=tiny_vocab, head="classifier",
                                  num_labels=3), str(tmp_path / "generic"))
    assert load_model(generic).label_names is None  # LABEL_0.. are not names
    ns = _mnli_flags(tmp_path, tiny_vocab, generic, dry_run=True)
    with pytest.raises(PreflightError, match=r"does not name its 3 outputs.*"
                       r"'contradiction'.*--teacher_label_order"):
        run(ns)
    ok = type(ns)(**{**vars(ns), "teacher_label_order": HF_ORDER})
    plan = run(ok)
    assert plan["teacher_label_mapping"] == {"contradiction": 2, "entailment": 0,
                                             "neutral": 1}
    wrong = type(ns)(**{**vars(ns), "teacher_label_order": ["yes", "no", "maybe"]})
    with pytest.raises(PreflightError, match=r"\['yes', 'no', 'maybe'\].*'contradiction'"):
        run(wrong)


def test_a_teacher_label_order_never_overrides_the_names_a_teacher_gives(hf_mnli_teacher,
                                                                         tmp_path, tiny_vocab):
    ns = _mnli_flags(tmp_path, tiny_vocab, hf_mnli_teacher, dry_run=True,
                     teacher_label_order=OUR_ORDER)  # contradicts the config's id2label
    with pytest.raises(PreflightError, match=r"--teacher_label_order=contradiction,entailment,"
                       r"neutral contradicts the names .*mnli_teacher gives its outputs "
                       r"\(entailment, neutral, contradiction, in its config\); drop "
                       r"--teacher_label_order"):
        run(ns)
    same = run(type(ns)(**{**vars(ns), "teacher_label_order": HF_ORDER}))  # repeats them: fine
    assert same["teacher_label_mapping"] == {"contradiction": 2, "entailment": 0, "neutral": 1}


def test_augmentation_inputs_must_be_explicit(tmp_path, tiny_vocab):
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["augment"], augment_fallback=False,
                    dry_run=True)
    with pytest.raises(PreflightError, match=r"--mlm_model and --word_vectors.*"
                       r"--augment_fallback"):
        run(ns)


def _phases(config_name, monkeypatch, replicas):
    """The plan's batch figures of a shipped config, for `replicas` replicas."""
    monkeypatch.chdir(REPO)
    config = parse_argv(["bin/distill", f"--flagfile=configs/{config_name}"])

    class Ctx:  # what PhaseSpec needs of a Context
        pass
    ctx = Ctx()
    ctx.config, ctx.replicas = config, replicas
    ctx.state = type("S", (), {"path": staticmethod(lambda *p: "/".join(p))})()
    g, d, f, o = config.general, config.distill, config.finetune, config.optim
    runs = resolve_stages(config.run.stages, config)
    out = {}
    if "general" in runs:
        out["general"] = plan_phase(ctx, "general", "distill", "corpus", 10**9, g.batch_size,
                                    "--general_batch_size", g.epochs, g.max_steps, g.lr,
                                    "linear", g.warmup, [])
    if "finetune_teacher" in runs:
        out["finetune"] = plan_phase(ctx, "finetune_teacher", "train", "train", 10**6,
                                     f.batch_size, "--teacher_batch_size", f.epochs, 0, f.lr,
                                     "linear", o.warmup_proportion, [])
    if "task" in runs:
        out["task"] = plan_phase(ctx, "task", "prediction", "train", 10**6, d.batch_size,
                                 "--task_batch_size", d.pred_epochs, 0, d.pred_lr, "linear",
                                 o.warmup_proportion, [])
    assert out, config_name
    return out


# Flagfiles included by others (td_*.cfg, wiki_pairs.cfg) are checked through them.
CONFIGS = sorted(n for n in os.listdir(os.path.join(REPO, "configs"))
                 if n.endswith(".cfg") and n not in ("td_common.cfg", "wiki_pairs_sizes.cfg"))


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_has_a_whole_micro_batch_on_eight_replicas(name, monkeypatch):
    for spec in _phases(name, monkeypatch, replicas=8).values():
        spec.check()  # raises unless the batch splits into replicas x accumulation
        assert spec.micro_batch >= 1 and spec.micro_batch == int(spec.micro_batch)


def test_distilbert_config_updates_on_4096_examples(monkeypatch):
    one = _phases("distilbert.cfg", monkeypatch, replicas=1)["general"]
    eight = _phases("distilbert.cfg", monkeypatch, replicas=8)["general"]
    assert one.global_batch == eight.global_batch == 4096 and one.accumulation == 32
    assert one.micro_batch == 128 and eight.micro_batch == 16


def test_a_batch_that_does_not_split_is_refused_before_training(tmp_path, tiny_vocab):
    ns = tiny_flags(tmp_path, tiny_vocab, task_batch_size=4, grad_accum_steps=3)
    with pytest.raises(PreflightError, match=r"--task_batch_size=4.*--grad_accum_steps"):
        run(ns)
    assert not os.path.exists(os.path.join(ns.output_dir, "run_config.json"))


def test_distilbert_recipe_packs_single_segments_and_masks(tmp_path, tiny_vocab, monkeypatch):
    keras.utils.set_random_seed(23)
    teacher = str(tmp_path / "mlm_teacher")
    save_model(BertModel(_config(tiny_vocab), vocab=tiny_vocab, head="mlm"), teacher)
    seen = {}
    real = general.corpus_lib.general_dataset

    def spy(*args, **kwargs):
        seen.update(kwargs)
        ds = real(*args, **kwargs)
        seen["type_ids"] = next(iter(ds))["input_type_ids"].numpy()
        return ds

    monkeypatch.setattr(general.corpus_lib, "general_dataset", spy)
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["general"], recipe="distilbert",
                    teacher=teacher, student_config=_student_json(tmp_path, tiny_vocab),
                    general_max_steps=2)
    run(ns)
    assert seen["pack"] == "single" and seen["masking"]
    assert not seen["type_ids"].any()  # no segment B for a student without token types


def _student_json(tmp_path, vocab) -> str:
    path = tmp_path / "distil_student.json"
    path.write_text(_config(vocab, num_layers=1).to_json())
    return str(path)


def test_overwriting_a_stage_redoes_every_stage_made_from_it(sst2_run, tmp_path):
    ns = sst2_run.copy(tmp_path / "out")  # every stage finished
    out = ns.output_dir
    ran = [s for s in stage_names() if s != "quantize"]  # no int8 export, no quantize
    before = {s: read_json(os.path.join(out, s, "stage_done.json"))["fingerprint"]
              for s in ran}
    old_student = load_weights(os.path.join(out, "task", "model"))
    changed = type(ns)(**{**vars(ns), "stages": ["augment"], "overwrite": True, "num_aug": 3})
    run(changed)
    again = type(ns)(**{**vars(ns), "num_aug": 3})
    run(again)
    after = {s: read_json(os.path.join(out, s, "stage_done.json"))["fingerprint"]
             for s in ran}
    for stage in ("general", "finetune_teacher"):
        assert after[stage] == before[stage], stage  # untouched: they do not read augment
    for stage in ("augment", "task", "evaluate", "export"):
        assert after[stage] != before[stage], stage  # redone from the new augmented set
    new_student = load_weights(os.path.join(out, "task", "model"))
    assert any(not np.array_equal(old_student[k], new_student[k]) for k in old_student)


def test_a_cased_teacher_gives_a_cased_student(tmp_path, tiny_vocab):
    keras.utils.set_random_seed(24)
    teacher = str(tmp_path / "cased")
    save_model(BertModel(_config(tiny_vocab, lower_case=False), vocab=tiny_vocab,
                         head="classifier", label_names=["0", "1"]), teacher)
    # One prediction-phase step: the student's casing is set before it trains.
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["task"], task_teacher=teacher,
                    general_model="none", use_augmented=False, task_phases=["prediction"],
                    task_max_steps=1)
    run(ns)
    assert load_model(os.path.join(ns.output_dir, "task", "model")).bert_config.lower_case \
        is False


def test_teacher_fine_tuning_clips_and_prediction_phase_mixes_hard_labels(tmp_path,
                                                                          tiny_vocab):
    ns = tiny_flags(tmp_path, tiny_vocab, hard_label_weight=0.5)
    config = parse_argv(["bin/distill", *argv(ns)])
    from tinybert_tf.pipeline.run.state import RunState
    from tinybert_tf.tasks import resolve_task
    ctx = Context(config, resolve_task(config.task), RunState(ns.output_dir),
                         __import__("tensorflow").distribute.get_strategy())
    teacher = load_model(ns.teacher, **ctx.task.type.head_kwargs())
    tuned = common.make_distiller(ctx, teacher, None, finetune_teacher.finetune_phase(ctx, 8))
    assert tuned.clip_norm == 1.0 and tuned.loss_terms == ("hard",)
    (spec,) = task_phase_specs(ctx, {True: 8, False: 8})[1:]
    assert spec.name == "prediction"
    assert [(t.name, t.weight) for t in spec.terms] == [("pred", 1.0), ("hard", 0.5)]
    student = BertModel(_config(tiny_vocab), vocab=tiny_vocab, **ctx.task.type.head_kwargs())
    d = common.make_distiller(ctx, student, teacher, spec)
    x = {"input_word_ids": np.array([[7, 30, 31, 8], [7, 32, 8, 0]], np.int32),
         "input_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.int32),
         "input_type_ids": np.zeros((2, 4), np.int32)}
    y = np.array([1, 0], np.int32)
    got = {k: float(v) for k, v in d.compute_losses((x, y)).items()}
    z = student(x, training=False)["logits"].numpy().astype(np.float64)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_allclose(got["hard"], 0.5 * -np.mean(log_p[np.arange(2), y]), rtol=1e-5)
    np.testing.assert_allclose(got["loss"], got["pred"] + got["hard"], rtol=1e-6)


def test_dry_run_prints_the_plan_and_reads_no_weights(tmp_path, tiny_vocab, monkeypatch,
                                                      capsys):
    from tinybert_tf.models import checkpoint, model_dir

    def no_weights(*a, **k):
        raise AssertionError("the dry run read model weights")

    monkeypatch.setattr(model_dir, "read_safetensors", no_weights)
    monkeypatch.setattr(checkpoint, "read_safetensors", no_weights)
    ns = tiny_flags(tmp_path, tiny_vocab, dry_run=True)
    assert main(["bin/distill", *argv(ns)]) == 0
    plan = json.loads(capsys.readouterr().out)
    # tiny_flags export no int8, so `all` leaves the quantize stage out.
    assert plan["stages"] == [s for s in stage_names() if s != "quantize"]
    phases = {(p["stage"], p["phase"]) for p in plan["phases"]}
    assert phases == {("general", "distill"), ("finetune_teacher", "train"),
                      ("task", "intermediate"), ("task", "prediction")}
    for p in plan["phases"]:
        assert p["steps"] >= 1 and p["micro_batch"] >= 1 and p["learning_rate"]["peak"] > 0
        assert p["loss_terms"]
    assert plan["models"]["teacher"]["layers"] == 2
    assert plan["task"]["type"]["labels"] == ["0", "1"]
    assert not os.path.exists(os.path.join(ns.output_dir, "run_config.json"))
    assert not os.path.exists(os.path.join(ns.output_dir, "general"))


def test_dry_run_reports_every_problem_and_exits_2(tmp_path, tiny_vocab, capsys):
    ns = tiny_flags(tmp_path, tiny_vocab, dry_run=True, layer_mapping="1,2,9",
                    keep_checkpoints=0, general_batch_size=0)
    assert main(["bin/distill", *argv(ns)]) == 2
    err = capsys.readouterr().err
    for flag in ("--layer_mapping", "--keep_checkpoints=0", "--general_batch_size=0"):
        assert flag in err, flag
    with pytest.raises(PreflightError) as info:
        run_argv(["bin/distill", *argv(ns)])
    assert len(info.value.errors) >= 3


def test_a_refused_value_is_the_only_error_not_echoed_by_the_checks_it_feeds(tmp_path,
                                                                           tiny_vocab):
    """The quantize stage sized its phase on 1 + (-1) rows per example and said: "the
    augmented train split has 0 examples, not one full batch; lower
    --quantize_batch_size"."""
    ns = tiny_flags(tmp_path, tiny_vocab, dry_run=True, export_formats=["float32", "int8"],
                    quantize_batch_size=4, num_aug=-1)
    with pytest.raises(PreflightError) as info:
        run_argv(["bin/distill", *argv(ns)])
    assert info.value.errors == ["--num_aug=-1: must be >= 1."]


def test_an_error_quoting_a_refused_value_is_an_echo_of_its_range_error():
    """A library check words the value without the dashes (the tokenizer's "max_seq_len=-1
    leaves no room for text"): dropped too; another flag's error stays."""
    found = Checks()
    found.range_error("--max_seq_len", "--max_seq_len=-1: must be >= 0 (0 = the task's "
                      "default).")
    found.errors += ["max_seq_len=-1 leaves no room for text; use >= 3.",
                     "--max_seq_len=-1: the student's position table ...",
                     "general_max_seq_len=-1 is another flag's value.",
                     "max_seq_len=-10 is another value."]
    assert found.final() == ["--max_seq_len=-1: must be >= 0 (0 = the task's default).",
                             "general_max_seq_len=-1 is another flag's value.",
                             "max_seq_len=-10 is another value."]
    # A library names the value by the flag's last words (pretrain's max_seq_len).
    found = Checks()
    found.range_error("--general_max_seq_len", "--general_max_seq_len=-1: must be >= 4.")
    found.errors += ["max_seq_len=-1 leaves no room for text (need >= 4).",
                     "--max_seq_len=-1: another flag, not refused here."]
    assert found.final() == ["--general_max_seq_len=-1: must be >= 4.",
                             "--max_seq_len=-1: another flag, not refused here."]


def test_dry_run_finds_a_keras_hub_export_that_cannot_work(tmp_path, tiny_vocab):
    """The tiny student uses exact GELU, which keras-hub's BERT cannot compute: found
    before training, with the flag that accepts the approximation."""
    ns = tiny_flags(tmp_path, tiny_vocab, dry_run=True,
                    export_formats=["saved_model", "keras_hub"])
    with pytest.raises(PreflightError) as info:
        run_argv(["bin/distill", *argv(ns)])
    assert [e for e in info.value.errors if e.startswith(
        "--export_formats=keras_hub: the model uses exact GELU")], info.value.errors
    assert any("--keras_hub_approximate_gelu" in e for e in info.value.errors)
    ok = type(ns)(**{**vars(ns), "keras_hub_approximate_gelu": True})
    assert run_argv(["bin/distill", *argv(ok)])["stages"]


def test_a_failed_check_leaves_the_folder_free_for_the_fix(tmp_path, tiny_vocab):
    bad = tiny_flags(tmp_path, tiny_vocab, stages=["finetune_teacher"], task="sst3")
    with pytest.raises(Exception, match="--task=sst3"):
        run(bad)
    assert not os.path.exists(os.path.join(bad.output_dir, "run_config.json"))
    good = type(bad)(**{**vars(bad), "task": "sst-2", "teacher_epochs": 1,
                        "teacher_max_steps": 1})
    run(good)
    assert os.path.isfile(os.path.join(good.output_dir, "finetune_teacher", "stage_done.json"))
    shutil.rmtree(good.output_dir)


@pytest.mark.parametrize("stored, kept", [(["neg", "pos"], True), (["pos", "neg"], True),
                                          (["0", "1"], False), (["a", "b", "c"], False)])
def test_fine_tuning_a_teacher_keeps_its_head_only_when_it_is_for_the_tasks_labels(
        tmp_path, tiny_vocab, capsys, stored, kept):
    import types

    from tinybert_tf.tasks.sentence import Classification
    source = BertModel(_config(tiny_vocab), vocab=tiny_vocab, head="classifier",
                       num_labels=len(stored), label_names=stored)
    save_model(source, str(tmp_path / "teacher"))
    ctx = types.SimpleNamespace(
        config=types.SimpleNamespace(models=types.SimpleNamespace(
            teacher=str(tmp_path / "teacher"))),
        task=types.SimpleNamespace(type=Classification(["neg", "pos"])))
    teacher = finetune_teacher.teacher_with_task_head(ctx)
    assert list(teacher.label_names) == ["neg", "pos"] and teacher.num_labels == 2
    x = {"input_word_ids": np.array([[7, 30, 31, 8]], np.int32),
         "input_mask": np.ones((1, 4), np.int32), "input_type_ids": np.zeros((1, 4), np.int32)}
    got = teacher(x, training=False)["logits"].numpy()[0]
    want = source(x, training=False)["logits"].numpy()[0]
    line = capsys.readouterr().out
    if kept:  # the stored head, its outputs in the task's order by name
        np.testing.assert_allclose(got, [want[stored.index(n)] for n in ["neg", "pos"]],
                                   rtol=1e-5, atol=1e-6)
        assert "fresh head" not in line
    else:  # a fresh head: the stored one's weights are not used
        path = "classifier_head/classifier/kernel"
        fresh, old = teacher.weight_dict()[path].numpy(), source.weight_dict()[path].numpy()
        assert fresh.shape != old.shape or not np.allclose(fresh, old)
        assert "fresh head" in line and str(stored) in line


def test_the_plan_shows_the_student_as_built_and_each_warning_once(tmp_path, tiny_vocab,
                                                                   capsys):
    """A --student_config's own vocab_size is not what runs: the student tokenises as its
    teacher, and the plan now shows the teacher's size (it showed the file's). The
    head-count warning, found for the general and the task pair alike, appeared twice."""
    from pipeline_helpers import write_teacher
    ns = tiny_flags(tmp_path, tiny_vocab, dry_run=True, stages=["general", "task"],
                    use_augmented=False, task_teacher=write_teacher(
                        str(tmp_path / "task_teacher"), tiny_vocab, head="classifier"))
    config = BertConfig(vocab_size=7, hidden_size=16, num_layers=1, num_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    (tmp_path / "two_heads.json").write_text(config.to_json())
    capsys.readouterr()
    plan = run(type(ns)(**{**vars(ns), "student_config": str(tmp_path / "two_heads.json")}))
    assert plan["models"]["student_config"]["vocab_size"] == len(tiny_vocab) != 7
    heads = [w for w in plan["warnings"] if "student has 2 heads, teacher 4" in w]
    assert len(heads) == 1, plan["warnings"]
    err = capsys.readouterr().err
    assert err.count("student has 2 heads, teacher 4") == 1, err


def test_the_plan_counts_the_examples_cut_at_max_seq_len_and_warns_past_a_fifth(
        tmp_path, tiny_vocab, capsys):
    """--max_seq_len=8 on the demo cut 98% of its sentences without a word: the plan now
    says how many examples of each split are longer, and warns past a fifth."""
    from tinybert_tf.data.sentences import packed_lengths
    from tinybert_tf.tasks import resolve_task
    from tinybert_tf.tokenizer import Tokenizer
    ns = tiny_flags(tmp_path, tiny_vocab, dry_run=True, stages=["finetune_teacher"])
    plan = run(ns)
    tok = Tokenizer(tiny_vocab)
    task = resolve_task(parse_argv(["bin/distill", *argv(ns)]).task)
    assert sorted(plan["cut_at_max_seq_len"]) == ["dev", "train"]
    for split, counted in plan["cut_at_max_seq_len"].items():
        examples = task.examples(split)
        lengths = packed_lengths(examples, tok, 512)  # unpacked: every piece counted
        assert counted == {"cut": int(np.sum(lengths > ns.max_seq_len)), "of": len(examples)}
    assert not any("are longer than --max_seq_len" in w for w in plan["warnings"])
    short = int(np.percentile(packed_lengths(task.examples("train"), tok, 512), 10))
    capsys.readouterr()
    plan = run(type(ns)(**{**vars(ns), "max_seq_len": max(short - 1, 3)}))
    (warning,) = [w for w in plan["warnings"] if "are longer than --max_seq_len" in w]
    assert warning.startswith(f"{plan['cut_at_max_seq_len']['train']['cut']} of "
                              f"{len(task.examples('train'))} train examples")
    assert "the teacher takes up to 64" in warning
    assert capsys.readouterr().err.count("are longer than --max_seq_len") == 1
