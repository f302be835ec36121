"""bin/reproduce: the paper's tables as data (published numbers consistent with their own
averages, every cell a flagfile that parses), bad commands refused in one line, and a
toy table run end to end: cells share one general stage and one fine-tuned teacher,
a re-run resumes (trains nothing again), the results are written as Markdown, JSON and
PNG. The general-stage recipe that trains nothing (first_layers) copies the teacher."""
import json
import os

import numpy as np
import pytest

from tinybert_tf.paper import reproduce, seed_tables
from tinybert_tf.paper import tables as paper_tables
from tinybert_tf.pipeline.main import parse_argv, run_argv

from pipeline_helpers import (
    REPO,
    argv,
    load_weights,
    read_json,
    tiny_flags,
    write_task,
    write_teacher,
)

CONFIGS = os.path.join(REPO, "configs", "paper")


def test_published_numbers_agree_with_the_papers_own_averages():
    """A typo in a transcribed number shows as an average the row does not give."""
    checked = 0
    for table in paper_tables.TABLES.values():
        for cell in table.cells:
            values = [cell.published.get(c.header) for c in table.columns]
            if "Avg" not in cell.published or any(v is None for v in values):
                continue
            assert np.mean(values) == pytest.approx(cell.published["Avg"], abs=0.051), \
                (table.number, cell.name)
            checked += 1
    assert checked == 25  # Table 1: 8 rows with every column; Tables 2-4: 13; Table 7: 4
    assert paper_tables.TABLE1.cell("tinybert4").published["MNLI-m"] == 82.5
    assert paper_tables.TABLE6.cell("tinybert6").published["SQuAD2.0 F1"] == 77.7


@pytest.mark.parametrize("name", sorted({c.flagfile for t in paper_tables.TABLES.values()
                                         for c in t.cells if c.flagfile}))
def test_every_cell_is_a_flagfile_that_parses(name, tmp_path):
    config = parse_argv(["bin/distill", f"--flagfile={os.path.join(CONFIGS, name)}",
                         f"--output_dir={tmp_path}"])
    assert config.distill.task_phases


@pytest.mark.parametrize("extra, message", [
    (["--table=8"], "Tables 1-7"),
    (["--table=2", "--task=mnli"], "--tasks"),
    (["--table=2", "--overwrite"], "--overwrite"),
    (["--table=2", "--cells=nope"], "no cell nope; its cells are "),
    (["--table=2", "--tasks=MRPC,nope"], "--tasks=MRPC,nope: unknown task(s) nope; use any "
                                         "of "),
    (["--table=2", "--no_such_flag=1"], "no_such_flag"),
    (["--table=2", "--seeds=1,x"], "give integers"),
    (["--table=2", "--seeds=1,1"], "given twice"),
    (["--table=2", "--seeds=-1"], "--seeds=-1: -1 is out of range"),
    (["--table=1", "--cells=bert_small,tinybert4"],
     "--bert_small_model is required for the BERT-Small cell"),
])
def test_bad_commands_exit_2_with_one_line(extra, message, tmp_path, capsys):
    code = reproduce.main(["bin/reproduce", f"--output_dir={tmp_path}", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("flag", ["--help", "-h", "--helpfull"])
def test_help_prints_the_flags_and_exits_0(flag, capsys, monkeypatch):
    """Through the entry point, as bin/reproduce runs: --help and -h list bin/reproduce's
    own flags, --helpfull every flag, bin/distill's (passed on to each run) included."""
    monkeypatch.setattr("sys.argv", ["bin/reproduce", flag])
    with pytest.raises(SystemExit) as done:
        reproduce.entry_point()
    out, err = capsys.readouterr()
    assert done.value.code == 0 and not err
    assert "bin/reproduce --table=2" in out
    for own in ("--table", "--tasks", "--cells", "--seeds", "--glue_dir", "--squad_dir",
                "--bert_small_model", "--output_dir", "--dry_run"):
        assert own in out, own
    assert ("--intermediate_epochs" in out) == (flag == "--helpfull")


def test_missing_task_data_is_one_short_line_naming_the_reproduce_flag(tmp_path, capsys):
    """No --glue_dir (or one without the task's folder), no --squad_dir, a task given
    twice: one line naming bin/reproduce's flag and what is wrong, not bin/distill's
    --data_dir."""
    glue = tmp_path / "glue"
    (glue / "MRPC").mkdir(parents=True)
    (glue / "MRPC" / "train.tsv").write_text("x\n")
    cases = [(["--table=2"], "--glue_dir is required for mnli, mrpc, cola"),
             (["--table=2", f"--glue_dir={glue}"],
              f"--glue_dir={glue}: no {glue}/MNLI/, {glue}/MRPC/dev.tsv, {glue}/CoLA/;"),
             (["--table=6", "--tasks=squad1.1"], "--squad_dir is required for squad1.1"),
             (["--table=6", "--tasks=squad2.0", f"--squad_dir={tmp_path}"],
              f"no {tmp_path}/train-v2.0.json, {tmp_path}/dev-v2.0.json;"),
             (["--table=2", "--tasks=rte,RTE"], "--tasks=rte,RTE: rte is given twice"),
             # Empty (an unset shell variable): the default would run other hours of work.
             (["--table=2", "--tasks="], "--tasks=: none given; name at least one, or drop "
              "the flag for the table's tasks."),
             (["--table=2", "--seeds="], "--seeds=: none given;"),
             (["--table=2", "--cells= "], "--cells=: none given;")]
    for extra, message in cases:
        code = reproduce.main(["bin/reproduce", f"--output_dir={tmp_path / 'o'}", "--dry_run",
                               *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2 and message in err, err
        assert len(err.splitlines()) == 1 and len(err.replace(str(tmp_path), "T")) < 300
        assert "--data_dir" not in err and "TaskSpec" not in err
    # An --output_dir in a model directory is named as given, not as a cell's folder.
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"format": "tinybert_tf"}')
    code = reproduce.main(["bin/reproduce", f"--output_dir={model / 'o'}", "--dry_run",
                           "--table=2", "--tasks=rte", f"--glue_dir={glue}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"reproduce: error: --output_dir={model / 'o'}: "
                                        f"inside the model directory {model} "), err


def test_a_general_tinybert_starts_only_the_cells_that_start_from_one(tmp_path, tiny_vocab):
    """Table 1 with --general_model: the TinyBERT cells start from it; BERT-Tiny and PD
    pre-train their student (MLM), PKD copies the teacher's layers, DistilBERT distils its
    own, BERT-Small starts from --bert_small_model; a General TinyBERT of another shape
    than a TinyBERT cell's student is refused, naming the cell."""
    toy = _toy_argv(tmp_path, tiny_vocab)  # a 2 x 32 student
    general = write_teacher(str(tmp_path / "general"), tiny_vocab)
    small = write_teacher(str(tmp_path / "bert_small"), tiny_vocab, layers=1)
    cmd = ["bin/reproduce", "--table=1", "--tasks=sst-2", f"--output_dir={tmp_path / 'o'}",
           "--cells=bert_tiny,bert_small,bert4_pkd,distilbert4,tinybert4", *toy,
           f"--general_model={general}", f"--bert_small_model={small}"]
    shared, cells = reproduce.plan(reproduce.parse(cmd))
    given = {c.cell.name: c.general_model for c in cells}
    assert given == {"bert_tiny": None, "bert_small": small, "bert4_pkd": None,
                     "distilbert4": None, "tinybert4": general}
    own = {c for r in shared if r.stage == "general" for c in r.cells}
    assert own == {"sst-2/bert_tiny", "sst-2/bert4_pkd", "sst-2/distilbert4"}
    for c in cells:  # the run's own model: the last --general_model wins
        config = parse_argv(c.run_argv())
        assert config.models.general_model == (given[c.cell.name] or
                                                c.shared["general"].output)
    other = write_teacher(str(tmp_path / "general_1l"), tiny_vocab, layers=1)
    with pytest.raises(reproduce.ReproduceError,
                       match=r"is 1 x 32, but the TinyBERT4 cell of Table 1 starts from a "
                             r"General TinyBERT of its --student_config=.* \(2 x 32\); run "
                             r"that cell on its own \(--cells=tinybert4\)"):
        reproduce.plan(reproduce.parse([*cmd, f"--general_model={other}"]))


def test_a_preempted_cell_ends_reproduce_with_75_and_one_line(tmp_path, capsys, monkeypatch):
    """SIGTERM during a cell's phase: bin/reproduce exits as bin/distill does (75, the
    checkpoint named), not with a traceback and 1."""
    from tinybert_tf.pipeline.training.loop import Preempted

    def preempted(opts):
        raise Preempted("intermediate", 116, str(tmp_path / "ckpt-116"))

    monkeypatch.setattr(reproduce, "run", preempted)
    code = reproduce.main(["bin/reproduce", "--table=2", f"--output_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code == 75, err
    assert len(err.splitlines()) == 1 and "stopped by SIGTERM at step 116" in err
    assert "ckpt-116" in err and "Traceback" not in err


def _toy_argv(tmp, vocab):
    """Toy sizes; the student has the tiny teacher's width (first_layers copies it)."""
    teacher = read_json(os.path.join(write_teacher(str(tmp / "teacher32"), vocab),
                                     "config.json"))["bert_config"]
    student = tmp / "student32.json"
    student.write_text(json.dumps(teacher))
    ns = tiny_flags(tmp, vocab, teacher=str(tmp / "teacher32"), student_config=str(student),
                    general_max_steps=2, general_batch_size=8, teacher_epochs=1,
                    teacher_batch_size=8, task_batch_size=8, pred_epochs=1, finetune_epochs=1,
                    pred_grid=[], eval_every=0, checkpoint_every=50,
                    data_dir=write_task(str(tmp / "task"), train=16, dev=8))
    keep = ("data_dir", "teacher", "corpus", "student_config", "general_max_seq_len",
            "general_batch_size", "general_epochs", "general_max_steps", "teacher_epochs",
            "teacher_lr", "teacher_batch_size", "max_seq_len", "task_batch_size",
            "pred_epochs", "finetune_epochs", "pred_grid", "eval_every", "latency_runs",
            "eval_batch_size", "checkpoint_every", "export_formats")  # no int8: no quantize
    return [a for a in argv(ns) if a.lstrip("-").split("=")[0].removeprefix("no") in keep]


def test_a_table_plans_shared_runs_and_runs_a_cell_end_to_end(tmp_path, tiny_vocab):
    """Cells that agree on a stage's settings share one run of it (planned, and given
    to each cell as --general_model / --task_teacher); one cell then runs for real,
    writes the table, and a re-run resumes with nothing trained again."""
    out = tmp_path / "table1"
    toy = _toy_argv(tmp_path, tiny_vocab)
    cmd = ["bin/reproduce", "--table=1", "--tasks=sst-2", f"--output_dir={out}", *toy]
    plan = reproduce.run(reproduce.parse(cmd + ["--cells=bert_tiny,pd,bert4_pkd",
                                                "--dry_run"]))
    shared = {(s["stage"], tuple(s["cells"])) for s in plan["shared"]}
    assert shared == {("general", ("sst-2/bert_tiny", "sst-2/pd")),  # one MLM pre-training
                      ("general", ("sst-2/bert4_pkd",)),  # first_layers: another recipe
                      ("finetune_teacher", ("sst-2/bert_tiny", "sst-2/bert4_pkd", "sst-2/pd"))}
    phases = {c["cell"]: [p["phase"] for p in c["plan"]["phases"]] for c in plan["cells"]}
    assert phases == {"bert_tiny": ["distill", "train", "finetune"],
                      "pd": ["distill", "train", "prediction", "finetune"],
                      "bert4_pkd": ["train", "pkd"]}
    pkd = next(c for c in plan["cells"] if c["cell"] == "bert4_pkd")["plan"]["phases"][-1]
    assert [t["name"] for t in pkd["loss_terms"]] == ["hard", "pred", "pkd"]
    assert not (out / "shared").exists()  # a dry run trains and writes nothing
    _, cells = reproduce.plan(reproduce.parse(cmd + ["--cells=bert_tiny,pd"]))
    given = [[a for a in c.run_argv() if a.startswith(("--general_model", "--task_teacher"))]
             for c in cells]
    assert given[0] == given[1] and len(given[0]) == 2

    # One cell for real, with a fine-tuned teacher given (no teacher stage to run).
    teacher = write_teacher(str(tmp_path / "sst2_teacher"), tiny_vocab, head="classifier")
    cmd += ["--cells=bert_tiny", f"--task_teacher={teacher}"]
    assert reproduce.main(cmd) == 0
    general = list((out / "shared" / "general").iterdir())
    assert len(general) == 1 and general[0].name.startswith("mlm-")
    assert not (out / "shared" / "sst-2").exists()
    run_config = read_json(str(out / "sst-2" / "bert_tiny" / "run_config.json"))
    assert run_config["general_model"] == str(general[0] / "general" / "model")
    data = read_json(str(out / "table1.json"))
    rows = {r["cell"]: r for r in data["rows"]}
    assert set(rows) == {"teacher", "bert_tiny"}
    report = read_json(str(out / "sst-2" / "bert_tiny" / "report.json"))
    sst2 = rows["bert_tiny"]["scores"]["SST-2"]
    assert sst2["ours"] == pytest.approx(100 * report["student"]["dev"]["accuracy"], abs=0.01)
    assert rows["teacher"]["scores"]["SST-2"]["ours"] == pytest.approx(
        100 * report["teacher"]["dev"]["accuracy"], abs=0.01)
    assert sst2["paper"] == 87.6 and rows["teacher"]["scores"]["SST-2"]["paper"] == 93.4
    assert sst2["paper_retained"] == pytest.approx(87.6 / 93.4, abs=1e-4)
    assert "| BERT-Tiny |" in (out / "table1.md").read_text()
    assert (out / "table1.png").read_bytes()[:4] == b"\x89PNG"

    done = {p: os.path.getmtime(p) for p in
            [str(general[0] / "general" / "stage_done.json"),
             str(out / "sst-2" / "bert_tiny" / "task" / "stage_done.json")]}
    assert reproduce.main(cmd) == 0  # resumes: every stage is done already
    assert {p: os.path.getmtime(p) for p in done} == done
    assert read_json(str(out / "table1.json"))["rows"] == data["rows"]


def test_a_cell_runs_quantize_when_its_flags_make_an_int8_student(tmp_path, tiny_vocab):
    """Evaluate reads the quantize stage's int8 student whenever the run makes one (int8
    in --export_formats, --quantize: the defaults), so a cell's own stages include it
    then, and only then: a cell run as task,evaluate would be refused by evaluate."""
    toy = _toy_argv(tmp_path, tiny_vocab)  # --export_formats=saved_model
    cmd = ["bin/reproduce", "--table=2", "--tasks=sst-2", f"--output_dir={tmp_path / 'o'}",
           "--cells=tinybert4,no_td", *toy]

    def stages(extra: list[str]) -> dict[str, str]:
        _, cells = reproduce.plan(reproduce.parse(cmd + extra))
        return {c.cell.name: next(a for a in c.run_argv() if a.startswith("--stages="))
                for c in cells}

    assert stages([]) == {"tinybert4": "--stages=task,evaluate",
                          "no_td": "--stages=task,evaluate"}
    with_int8 = ["--export_formats=saved_model,int8"]
    assert stages(with_int8) == {"tinybert4": "--stages=task,quantize,evaluate",
                                 "no_td": "--stages=task,quantize,evaluate"}
    assert set(stages(with_int8 + ["--noquantize"]).values()) == {"--stages=task,evaluate"}


def test_seeds_each_run_the_table_in_their_own_folder_with_their_seed(tmp_path, tiny_vocab):
    """--seeds=7,8: each seed is the single run's plan in DIR/seed-N with --seed=N last
    (so it wins over a flagfile's), nothing else changed."""
    out = tmp_path / "t2"
    cmd = ["bin/reproduce", "--table=2", "--tasks=sst-2", f"--output_dir={out}",
           "--cells=tinybert4,no_gd", "--augment_fallback", *_toy_argv(tmp_path, tiny_vocab)]
    opts = reproduce.parse(cmd + ["--seed=3", "--seeds=7,8"])  # --seeds wins
    assert opts.seeds == (7, 8)
    for seed in (7, 8):
        one = reproduce.seed_options(opts, seed)
        assert one.output_dir == str(out / f"seed-{seed}") and not one.seeds
        shared, cells = reproduce.plan(one)
        for c in cells:
            assert c.directory == str(out / f"seed-{seed}" / "sst-2" / c.cell.name)
            config = parse_argv(c.run_argv())
            assert config.numerics.seed == seed and config.run.output_dir == c.directory
        assert all(r.directory.startswith(str(out / f"seed-{seed}" / "shared"))
                   for r in shared)
    plans = reproduce.run(reproduce.parse(cmd + ["--seed=3", "--seeds=7,8", "--dry_run"]))
    assert sorted(plans["seeds"]) == ["7", "8"]
    single = reproduce.run(reproduce.parse(cmd + [f"--output_dir={out / 'seed-8'}",
                                                  "--seed=8", "--dry_run"]))
    assert plans["seeds"]["8"]["cells"] == single["cells"]
    assert not out.exists()  # dry runs write nothing


def test_table_files_bin_reproduce_did_not_write_are_refused_before_any_run(tmp_path,
                                                                          tiny_vocab):
    """DIR/table<N>.json / .md / .png (and DIR/seed-N/'s with --seeds) that bin/reproduce
    did not write are refused when the command is read, and kept; its own are replaced."""
    out = tmp_path / "mine"
    cmd = ["bin/reproduce", "--table=2", "--tasks=sst-2", f"--output_dir={out}",
           "--cells=tinybert4", "--augment_fallback", *_toy_argv(tmp_path, tiny_vocab)]
    (out / "seed-8").mkdir(parents=True)
    for folder, name, content, extra in [
            (out, "table2.json", '{"title": "my notes"}', []),
            (out, "table2.md", "# my table", []),
            (out, "table2.png", "not a chart", ["--dry_run"]),
            (out / "seed-8", "table2.md", "# my table", ["--seeds=7,8"])]:
        (folder / name).write_text(content)
        with pytest.raises(reproduce.ReproduceError) as e:
            reproduce.parse(cmd + extra)
        assert str(e.value) == (f"--output_dir={out}: {folder / name} is not a table "
                                "bin/reproduce wrote, and this run would replace it; move "
                                "it, or choose another --output_dir.")
        assert (folder / name).read_text() == content
        (folder / name).unlink()
    (out / "table2.json").write_text(json.dumps(_seed_table({"x": 50.0}, 60.0)))
    (out / "table2.md").write_text("# an earlier table of ours")
    assert reproduce.parse(cmd).output_dir == str(out)


def _seed_table(scores: dict[str, float], teacher: float) -> dict:
    """A single run's table<N>.json (write_results' layout) with one column."""
    def entry(v):
        return {"ours": v, "paper": None, "ours_retained": None, "paper_retained": None}
    rows = [{"cell": "teacher", "label": "Teacher", "flagfile": None, "note": "",
             "scores": {"WP": entry(teacher)}, "average": entry(teacher)}]
    for cell, v in scores.items():  # a proxy task: the paper has no number for it
        rows.append({"cell": cell, "label": cell.upper(), "flagfile": f"{cell}.cfg",
                     "note": "", "scores": {"WP": entry(v)}, "average": entry(v)})
    return {"table": 2, "title": "t", "paper_split": "dev", "our_split": "dev",
            "source": "s", "note": "", "columns": [{"header": "WP", "task": "wiki_pairs",
                                                    "metric": "", "scale": 100.0}],
            "rows": rows, "runs": {}}


def test_a_table_over_seeds_is_the_mean_spread_and_paired_difference_of_its_seeds(
        tmp_path):
    """Against numpy: the mean and sample standard deviation of each cell's score, and
    the seed-by-seed difference to the first recipe row, with how many seeds are below;
    on a task the paper has not, its own averages (Table 2: 75.6, 72.5, 68.4)."""
    per_seed = {42: {"main": 70.1, "no_gd": 66.0, "no_da": 71.0},
                1: {"main": 68.3, "no_gd": 65.9, "no_da": 67.2},
                2: {"main": 72.0, "no_gd": 66.4, "no_da": 71.9}}
    per_seed = {s: {("tinybert4" if c == "main" else c): v for c, v in row.items()}
                for s, row in per_seed.items()}
    tables = {s: _seed_table(v, teacher=69.0 + s / 100) for s, v in per_seed.items()}
    data = seed_tables.write(tables, str(tmp_path))
    rows = {r["cell"]: r["scores"]["average"] for r in data["rows"]}
    assert data["seeds"] == [42, 1, 2] and data["first_row"] == "tinybert4"
    for cell in ("tinybert4", "no_gd", "no_da"):
        values = np.array([per_seed[s][cell] for s in (42, 1, 2)])
        assert rows[cell]["per_seed"] == list(values)
        assert rows[cell]["mean"] == pytest.approx(values.mean(), abs=1e-3)
        assert rows[cell]["sd"] == pytest.approx(values.std(ddof=1), abs=1e-3)
    assert "diff_to_first" not in rows["tinybert4"] and "diff_to_first" not in rows["teacher"]
    main = np.array([per_seed[s]["tinybert4"] for s in (42, 1, 2)])
    for cell, below in (("no_gd", 3), ("no_da", 2)):
        d = np.array([per_seed[s][cell] for s in (42, 1, 2)]) - main
        got = rows[cell]["diff_to_first"]
        assert got["per_seed"] == pytest.approx(list(d), abs=1e-3)
        assert got["mean"] == pytest.approx(d.mean(), abs=1e-3)
        assert got["sd"] == pytest.approx(d.std(ddof=1), abs=1e-3)
        assert got["below"] == below
    assert rows["no_gd"]["paper_diff_to_first"] == pytest.approx(72.5 - 75.6)
    assert rows["no_da"]["paper_diff_to_first"] == pytest.approx(68.4 - 75.6)
    md = (tmp_path / "table2.md").read_text()
    assert "| NO_GD | 66.1 ± 0.3 (–) | 66.1 ± 0.3 (72.5) | -4.0 ± 1.6 | 3 of 3 | -3.1 |" \
        in md, md
    assert "over its own tasks" in md
    assert read_json(str(tmp_path / "table2.json")) == json.loads(json.dumps(data))
    assert (tmp_path / "table2.png").read_bytes()[:4] == b"\x89PNG"
    other = _seed_table({"tinybert4": 1.0, "no_gd": 2.0}, 3.0)
    with pytest.raises(ValueError, match="seed 1's table has other rows"):
        seed_tables.summarise({42: tables[42], 1: other})


def test_first_layers_recipe_is_the_teachers_embeddings_and_first_layers(tmp_path,
                                                                         tiny_vocab):
    teacher = write_teacher(str(tmp_path / "teacher3"), tiny_vocab, hidden=32, layers=3)
    student = tmp_path / "student3.json"
    cfg = read_json(os.path.join(teacher, "config.json"))["bert_config"]
    student.write_text(json.dumps({**cfg, "num_layers": 2}))
    ns = tiny_flags(tmp_path, tiny_vocab, teacher=teacher, student_config=str(student),
                    recipe="first_layers", stages=["general"], general_epochs=0)
    result = run_argv(["bin/distill", *argv(ns)])
    assert result["general"]["steps"] == 0
    ours = load_weights(os.path.join(ns.output_dir, "general", "model"))
    theirs = load_weights(teacher)
    assert any(k.startswith("transformer_layer_1/") for k in ours)
    for key, value in ours.items():
        np.testing.assert_array_equal(value, theirs[key])  # layers 0, 1 and embeddings
    assert not os.path.exists(os.path.join(ns.output_dir, "general", "distill"))
    wide = tiny_flags(tmp_path, tiny_vocab, teacher=teacher, recipe="first_layers",
                      stages=["general"], output_dir=str(tmp_path / "wide"))
    with pytest.raises(ValueError, match="--recipe=first_layers copies teacher layers"):
        run_argv(["bin/distill", *argv(wide)])


def test_mapped_layers_recipe_is_the_init_from_teacher_start_untrained(tmp_path, tiny_vocab):
    """--recipe=mapped_layers saves what tinybert --init_from_teacher starts from: the
    teacher's embeddings and layers g(m) of --layer_mapping (uniform, M=2 of N=4: layers
    2 and 4, 0-based 1 and 3), with no training step."""
    teacher = write_teacher(str(tmp_path / "teacher4"), tiny_vocab, hidden=32, layers=4)
    student = tmp_path / "student2.json"
    cfg = read_json(os.path.join(teacher, "config.json"))["bert_config"]
    student.write_text(json.dumps({**cfg, "num_layers": 2}))
    ns = tiny_flags(tmp_path, tiny_vocab, teacher=teacher, student_config=str(student),
                    recipe="mapped_layers", layer_mapping="uniform", stages=["general"],
                    general_epochs=0)
    result = run_argv(["bin/distill", *argv(ns)])
    assert result["general"]["steps"] == 0
    ours = load_weights(os.path.join(ns.output_dir, "general", "model"))
    theirs = load_weights(teacher)
    moved = {"transformer_layer_0/": "transformer_layer_1/",
             "transformer_layer_1/": "transformer_layer_3/"}
    checked = 0
    for key, value in ours.items():
        source = key
        for mine, its in moved.items():
            if key.startswith(mine):
                source = its + key[len(mine):]
        checked += source != key
        np.testing.assert_array_equal(value, theirs[source])
    assert checked > 0 and not any(k.startswith("transformer_layer_2/") for k in ours)


def test_shared_and_cell_stages_come_from_the_stage_registry():
    from tinybert_tf.pipeline.stages import Stage, register_stage, unregister_stage
    assert reproduce.shared_stages() == ("general", "finetune_teacher", "augment")
    assert reproduce.cell_stages() == ("task", "quantize", "evaluate")
    register_stage(Stage("probe", lambda ctx: {}, settings=lambda config: {}), after="task")
    try:  # a plugin stage before the report runs in every cell
        assert reproduce.cell_stages() == ("task", "probe", "quantize", "evaluate")
    finally:
        unregister_stage("probe")
