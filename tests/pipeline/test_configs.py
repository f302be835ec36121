"""The shipped flagfiles parse with bin/distill's flags and carry the paper's settings.

TinyBERT (Jiao et al., 2020) Sec. 4.2: general distillation at sequence
length 128 for 3 epochs; task distillation with batch 32, intermediate-layer
lr 5e-5 for 20 epochs (10 on MNLI/QQP/QNLI, 50 on CoLA), prediction layer 3
epochs at lr 3e-5, sequence length 64 for single sentences and 128 for pairs.
DistilBERT (Sanh et al., 2019): L = 5 L_ce + 2 L_mlm + 1 L_cos at temperature 2.
"""
from __future__ import annotations

import glob
import json
import os
import types

import pytest

from tinybert_tf.cli.flagfiles import expand_flagfiles
from tinybert_tf.pipeline import flags as tb_flags
from tinybert_tf.pipeline.preflight import resolve_stages
from tinybert_tf.pipeline.settings.configs import PipelineConfig

from pipeline_helpers import REPO, parse

CONFIGS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "configs", "*.cfg")))
TD_EPOCHS = {"cola": 50, "mnli": 10, "qqp": 10, "qnli": 10, "sst2": 20, "mrpc": 20,
             "stsb": 20, "rte": 20, "wnli": 20}
SINGLE_SENTENCE = {"cola", "sst2"}
# Included by other flagfiles (or bin/reproduce), not run alone: no --output_dir.
INCLUDED = {"td_common.cfg", "wiki_pairs_sizes.cfg"}


def test_every_task_has_a_config():
    assert {f"td_{t}.cfg" for t in TD_EPOCHS} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_parses(name, monkeypatch):
    values = parse(name, monkeypatch)
    if name not in INCLUDED:
        assert values.output_dir, name


def test_the_reproduce_sizes_leave_what_bin_reproduce_sets_to_it(monkeypatch):
    """bin/reproduce refuses --task, --stages and --output_dir in its flagfile."""
    sizes = parse("wiki_pairs_sizes.cfg", monkeypatch)
    for name in ("task", "stages", "output_dir"):
        assert not sizes[name].present, name
    run = parse("wiki_pairs.cfg", monkeypatch)
    assert run.task == "wiki_pairs" and run.max_seq_len == sizes.max_seq_len == 96


def test_the_reproduce_sizes_run_one_last_phase_at_one_learning_rate(monkeypatch):
    """On top of a table's cell (configs/paper/tinybert4.cfg has the paper's six-cell
    prediction grid), the 2-core sizes leave one prediction phase, and a cell that
    fine-tunes on the labels instead (w/o TD, w/o Pred) does so at the same rate."""
    monkeypatch.chdir("/")
    values = tb_flags.distill_flags()
    values(expand_flagfiles(["bin/distill", *(
        f"--flagfile={os.path.join(REPO, 'configs', name)}"
        for name in ("paper/table2_no_td.cfg", "wiki_pairs_sizes.cfg"))]))
    assert parse("paper/tinybert4.cfg", monkeypatch).pred_grid  # what the sizes undo
    assert values.pred_grid == [] and values.task_phases == ["finetune"]
    assert values.finetune_lr == values.pred_lr


def test_each_table_cell_on_the_reproduce_sizes_changes_only_what_its_table_ablates(
        monkeypatch):
    """bin/reproduce puts wiki_pairs_sizes.cfg after each cell's flagfile (configs/paper/
    table[234]_*.cfg). The sizes add no second change: the flags a cell changes from the
    main cell are those its flagfile changes from tinybert4.cfg, and every cell's student
    starts general distillation as the main one's, from random weights (teacher layers
    copied by --init_from_teacher would follow Table 4's --layer_mapping, and Table 2's
    w/o GD, a random student, would drop them too)."""
    from tinybert_tf.config import get_config
    from tinybert_tf.pipeline.training.recipes import get_recipe

    def parsed(*names):
        monkeypatch.chdir("/")
        values = tb_flags.distill_flags()
        values(expand_flagfiles(["bin/distill", *(
            f"--flagfile={os.path.join(REPO, 'configs', n)}" for n in names)]))
        return values

    def start(values):
        config = PipelineConfig.from_flags(values)
        return get_recipe(config.general.recipe).init_layers(
            config, get_config(values.student_config), get_config("minilm_l6_384d"))

    main_alone = parsed("paper/tinybert4.cfg").flag_values_dict()
    main = parsed("paper/tinybert4.cfg", "wiki_pairs_sizes.cfg")
    assert main.teacher == "minilm-l6" and start(main) is None
    cells = sorted(os.path.relpath(p, os.path.join(REPO, "configs")) for p in
                   glob.glob(os.path.join(REPO, "configs", "paper", "table[234]_*.cfg")))
    assert len(cells) == 11
    for cell in cells:
        values = parsed(cell, "wiki_pairs_sizes.cfg")
        alone = parsed(cell).flag_values_dict()
        changed = {k for k, v in values.flag_values_dict().items() if v != main[k].value}
        assert changed == {k for k, v in alone.items() if v != main_alone[k]}, cell
        assert start(values) is None, cell


@pytest.mark.parametrize("task", sorted(TD_EPOCHS))
def test_task_configs_follow_the_paper(task, monkeypatch):
    f = parse(f"td_{task}.cfg", monkeypatch)
    assert f.intermediate_epochs == TD_EPOCHS[task]
    assert f.task_batch_size == 32
    assert f.intermediate_lr == pytest.approx(5e-5)
    assert f.pred_epochs == 3 and f.pred_lr == pytest.approx(3e-5)
    assert f.max_seq_len == (64 if task in SINGLE_SENTENCE else 128)
    assert f.use_augmented and f.num_aug == 20 and f.replace_prob == pytest.approx(0.4)
    assert f.num_candidates == 15
    assert set(f.loss_terms) == {"embd", "attn", "hidn"} and f.layer_mapping == "uniform"
    assert f.student_config == "tinybert_4l_312d" and f.general_model


@pytest.mark.parametrize("name,student", [("general_tinybert4.cfg", "tinybert_4l_312d"),
                                          ("general_tinybert6.cfg", "tinybert_6l_768d")])
def test_general_configs_follow_the_paper(name, student, monkeypatch):
    f = parse(name, monkeypatch)
    assert f.stages == ["general"] and f.recipe == "tinybert"
    assert f.student_config == student
    assert f.general_max_seq_len == 128 and f.general_epochs == 3
    assert set(f.loss_terms) == {"embd", "attn", "hidn"}
    assert f.general_lr == pytest.approx(1e-4) and f.weight_decay == pytest.approx(0.01)


def test_distilbert_config_follows_the_paper(monkeypatch):
    f = parse("distilbert.cfg", monkeypatch)
    assert f.recipe == "distilbert" and f.student_config == "distilbert_6l"
    assert (f.alpha_ce, f.alpha_mlm, f.alpha_cos) == (5.0, 2.0, 1.0)
    assert f.distil_temperature == 2.0


def test_demo_config_runs_everything_on_the_embedded_default(monkeypatch):
    f = parse("demo.cfg", monkeypatch)
    assert f.stages == ["all"] and f.task == "polarity" and f.teacher == "minilm-l6"
    assert f.student_config == "minilm_1l_384d" and f.init_from_teacher
    assert not f.data_dir and not f.corpus  # the data installed with the package
    # The quantize stage runs between task and evaluate, and makes the export's int8.
    stages = resolve_stages(f.stages, PipelineConfig.from_flags(f))
    assert stages[stages.index("task"):] == ["task", "quantize", "evaluate", "export"]
    assert "int8" in f.export_formats and f.quantize_steps > 0


# --- every shipped config dry-runs ------------------------------------------------------------

# Every flagfile under configs/ and configs/paper/ but the include-only fragments of INCLUDED
# (td_common.cfg runs through each td_*.cfg, wiki_pairs_sizes.cfg through wiki_pairs.cfg).
EVERY_CONFIG = sorted(
    os.path.relpath(p, os.path.join(REPO, "configs"))
    for p in glob.glob(os.path.join(REPO, "configs", "*.cfg"))
    + glob.glob(os.path.join(REPO, "configs", "paper", "*.cfg"))
    if os.path.basename(p) not in INCLUDED)
FIXTURES = os.path.join(REPO, "tests", "fixtures")
# The largest batches the configs train with: DistilBERT's 4,096 corpus sequences, 32 task
# rows (the stand-in data repeat the fixtures' rows to hold a batch of each).
CORPUS_SEQUENCES, TASK_ROWS = 4096, 32


def _repeated_rows(src: str, dest) -> str:
    """The CSV or TSV file `src` with its rows after the header repeated to at least
    TASK_ROWS rows."""
    import csv
    tsv = src.endswith(".tsv")
    with open(src, encoding="utf-8", newline="") as f:
        head, *rows = (list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)) if tsv
                       else list(csv.reader(f)))
    with open(dest, "w", encoding="utf-8", newline="") as f:
        writer = (csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\",
                             lineterminator="\n") if tsv else csv.writer(f))
        writer.writerows([head] + rows * -(-TASK_ROWS // len(rows)))
    return str(dest)


def _stand_in_data(tmp) -> dict[str, list[str]]:
    """--task -> the flags of its stand-in data: the fixtures' GLUE folders, SQuAD files and
    own-data files, their training rows repeated to hold a batch."""
    import shutil

    from tinybert_tf.paper.tables import GLUE_FOLDERS, SQUAD_FILES
    out = {}
    for task, folder in GLUE_FOLDERS.items():
        where = tmp / "glue" / folder
        shutil.copytree(os.path.join(FIXTURES, "glue", folder), where)
        _repeated_rows(os.path.join(FIXTURES, "glue", folder, "train.tsv"),
                       where / "train.tsv")
        out[task] = [f"--data_dir={where}"]
    for task, (_, dev) in SQUAD_FILES.items():
        data = json.loads(open(os.path.join(FIXTURES, "squad", dev), encoding="utf-8").read())
        questions = sum(len(p["qas"]) for a in data["data"] for p in a["paragraphs"])
        copies = json.dumps(data["data"] * -(-TASK_ROWS // questions))
        data["data"] = json.loads(copies)
        for i, qa in enumerate(q for a in data["data"] for p in a["paragraphs"]
                               for q in p["qas"]):
            qa["id"] = f"{qa['id']}-{i}"  # ids stay unique
        train = tmp / f"train-{dev}"
        train.write_text(json.dumps(data), encoding="utf-8")
        out[task] = [f"--train_file={train}",
                     f"--validation_file={os.path.join(FIXTURES, 'squad', dev)}"]
    own = os.path.join(FIXTURES, "own_data")
    reviews = _repeated_rows(os.path.join(own, "reviews_train.csv"), tmp / "reviews.csv")
    out["text_classification"] = [f"--train_file={reviews}",
                                  f"--validation_file={os.path.join(own, 'reviews_dev.csv')}"]
    out["token_classification"] = [
        f"--train_file={os.path.join(own, 'news_ner_train.conll')}",
        f"--validation_file={os.path.join(own, 'news_ner_dev.conll')}"]
    return out


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory, tiny_vocab):
    """Tiny stand-ins for the assets the shipped configs name (BERT-base teachers, GloVe,
    General TinyBERTs, corpora, task data): a 4-layer teacher 48 wide with an MLM head
    (DistilBERT's L_ce reads it; MiniLMv2's 48 relation heads divide its width), a
    2-layer student of its width, FFN and heads (--init_from_teacher and first_layers
    copy into it) and a general model of that shape, all with 512 positions (SQuAD's
    384-piece windows); a task teacher per GLUE task, built when first asked."""
    from tinybert_tf.data import glue

    from pipeline_helpers import write_corpus, write_teacher
    tmp = tmp_path_factory.mktemp("stand_ins")
    teacher = write_teacher(str(tmp / "teacher"), tiny_vocab, hidden=48, layers=4,
                            head="mlm", positions=512)
    config = json.loads((tmp / "teacher" / "config.json").read_text())["bert_config"]
    student = tmp / "student.json"
    student.write_text(json.dumps({**config, "num_layers": 2}))
    vectors = tmp / "vectors.txt"
    vectors.write_text("".join(f"{w} {i % 3 * 0.5} 0.25 {i * 0.1:.1f}\n"
                               for i, w in enumerate(["good", "great", "bad", "movie"])))

    def task_teacher(task: str) -> str:
        spec = glue.get_task(task)
        head = "regressor" if spec.is_regression else "classifier"
        return write_teacher(str(tmp / f"teacher_{spec.name}"), tiny_vocab, hidden=48,
                             head=head,
                             label_names=None if spec.is_regression else spec.label_names,
                             positions=512)

    return types.SimpleNamespace(
        tmp=tmp, teacher=teacher, student=str(student), task_teacher=task_teacher,
        general=write_teacher(str(tmp / "general"), tiny_vocab, hidden=48, layers=2,
                              positions=512),
        mlm=write_teacher(str(tmp / "mlm"), tiny_vocab, head="mlm", positions=512),
        vectors=str(vectors), data=_stand_in_data(tmp),
        corpus=write_corpus(str(tmp / "corpus.txt")))


@pytest.mark.parametrize("name", EVERY_CONFIG)
def test_every_shipped_config_passes_its_own_dry_run(name, stand_ins, monkeypatch, capsys):
    """bin/distill --flagfile=configs/NAME --dry_run exits 0: its stages, settings and
    models agree (e.g. a --stages list without quantize, which evaluate reads, fails).
    What the config names as an asset (models, data, corpus) is replaced by a tiny
    stand-in; a config that leaves its task, data, teacher and Algorithm 1's models to
    the command line (configs/paper/'s cells) gets SST-2 and the stand-ins. The corpus
    stand-in holds CORPUS_SEQUENCES sequences by decree: counting a corpus that size (or
    the installed Wikipedia sample) takes some 20 s per config."""
    from tinybert_tf.pipeline.main import main
    from tinybert_tf.pipeline.stages import general

    monkeypatch.setattr(general, "corpus_sequences", lambda ctx: CORPUS_SEQUENCES)
    values = parse(name, monkeypatch)
    task = values.task.lower() if values["task"].present else "sst-2"
    # With the task teacher given and neither stage that reads --teacher run (general,
    # finetune_teacher), the config's --teacher (BERT-base) is read by nothing: it may
    # be absent (augment was refused for lacking it, though it tokenises with the task
    # teacher's vocab).
    teacher = stand_ins.teacher
    if values["task_teacher"].present and not {"general", "finetune_teacher", "all"} & set(
            values.stages):
        teacher = str(stand_ins.tmp / "bert_base_not_downloaded")
    argv = ["bin/distill", f"--flagfile={os.path.join(REPO, 'configs', name)}",
            f"--task={task}", *stand_ins.data.get(task, []),
            f"--teacher={teacher}", f"--student_config={stand_ins.student}",
            f"--output_dir={stand_ins.tmp / 'runs' / name.replace('/', '_')}", "--dry_run"]
    if values["test_file"].present:
        argv.append("--test_file=" + stand_ins.data[task][-1].split("=", 1)[1])
    if values["corpus"].present:  # else the Wikipedia sample installed with the package
        argv.append(f"--corpus={stand_ins.corpus}")
    if values["general_model"].present:
        argv.append(f"--general_model={stand_ins.general}")
    if values["task_teacher"].present:
        argv.append(f"--task_teacher={stand_ins.task_teacher(task)}")
    if not values.augment_fallback:  # Algorithm 1's MLM and GloVe, named or left to the user
        argv += [f"--mlm_model={stand_ins.mlm}", f"--word_vectors={stand_ins.vectors}"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, f"{name}: {err}"
    plan = json.loads(out)
    assert plan["stages"], name
