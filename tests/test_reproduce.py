"""bin/reproduce: the paper's tables as data (published numbers consistent with their own
averages, every cell a flagfile that parses), bad commands refused in one line, and a
toy table run end to end: cells share one general stage and one fine-tuned teacher,
a re-run resumes (trains nothing again), the results are written as Markdown, JSON and
PNG. The general-stage recipe that trains nothing (first_layers) copies the teacher."""
import json
import os

import numpy as np
import pytest

from tinybert_tf.pipeline import paper_tables, reproduce
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
    (["--table=2", "--cells=nope"], "no cell ['nope']"),
    (["--table=2", "--no_such_flag=1"], "no_such_flag"),
])
def test_bad_commands_exit_2_with_one_line(extra, message, tmp_path, capsys):
    code = reproduce.main(["bin/reproduce", f"--output_dir={tmp_path}", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1


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
    given = [[a for a in c.run_argv("") if a.startswith(("--general_model", "--task_teacher"))]
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
        return {c.cell.name: next(a for a in c.run_argv("") if a.startswith("--stages="))
                for c in cells}

    assert stages([]) == {"tinybert4": "--stages=task,evaluate",
                          "no_td": "--stages=task,evaluate"}
    with_int8 = ["--export_formats=saved_model,int8"]
    assert stages(with_int8) == {"tinybert4": "--stages=task,quantize,evaluate",
                                 "no_td": "--stages=task,quantize,evaluate"}
    assert set(stages(with_int8 + ["--noquantize"]).values()) == {"--stages=task,evaluate"}


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
