"""--student_config=auto: the shape a hand calculation expects from a latency table, one
clear error when nothing fits or the table is malformed, and a real measurement here."""
from __future__ import annotations

import json
import os

import pytest

from tinybert_tf.pipeline import autosize
from tinybert_tf.pipeline.main import main, parse_argv

from pipeline_helpers import argv, tiny_flags

TABLE = """# measured on the target phone (benchmark_model, 4 threads)
layers,hidden,heads,intermediate,latency_ms
2,128,2,512,1.0
4,128,2,512,2.0
2,256,4,1024,3.0
4,256,4,1024,6.0
6,256,4,1024,9.0
4,512,8,2048,20.0
"""


def _params(layers, hidden, ffn):
    """Q, K, V, O (weights + biases), the two FFN layers, two LayerNorms (gamma, beta)."""
    return layers * (4 * (hidden * hidden + hidden) + 2 * hidden * ffn + ffn + hidden
                     + 4 * hidden)


def test_auto_picks_the_most_transformer_parameters_within_budget(tmp_path, tiny_vocab):
    table = tmp_path / "latency.csv"
    table.write_text(TABLE, encoding="utf-8")
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["general"], dry_run=True,
                    student_config="auto", latency_table=str(table), latency_budget_ms=10.0,
                    layer_mapping="1,1,1,2,2,2")  # the tiny teacher has 2 layers
    plan = _dry_run(ns)
    # Hand calculation: within 10 ms are the first five rows; 6 x 256 has the most
    # transformer parameters among them (4 x 512 is over budget).
    assert _params(6, 256, 1024) == 4_738_560 > _params(4, 256, 1024)
    assert plan["student"]["name"] == "6x256x4x1024"
    assert plan["student"]["params"] == 4_738_560
    assert [c["within_budget"] for c in plan["candidates"]] == [True] * 5 + [False]
    assert [c["chosen"] for c in plan["candidates"]] == [False] * 4 + [True, False]
    assert {"shape", "params", "latency_ms", "within_budget", "chosen"} <= set(
        plan["candidates"][0])
    assert plan["models"]["student_config"]["num_layers"] == 6
    assert plan["models"]["student_config"]["hidden_size"] == 256
    folder = os.path.join(ns.output_dir, autosize.FOLDER)
    assert os.path.getsize(os.path.join(folder, "latency.png")) > 1000
    sizing = json.loads(open(os.path.join(folder, "sizing.json")).read())
    assert sizing["student"] == plan["student"]


def _dry_run(ns):
    from tinybert_tf.pipeline.main import run_argv
    return run_argv(["bin/distill", *argv(ns)])


@pytest.mark.parametrize("content,budget,message", [
    (TABLE, 0.5, "--latency_budget_ms=0.5: no candidate fits; the fastest, 2x128x2x512, "
                 "takes 1 ms"),
    (TABLE.replace("4,128,2,512,2.0", "4,128,2,512,fast"), 10.0, "latency.csv:4: "),
    (TABLE.replace("layers,hidden", "depth,hidden"), 10.0, "latency.csv:2: the header"),
    (TABLE.replace("2,256,4,1024,3.0", "2,256,4,3.0"), 10.0, "latency.csv:5: 4 values"),
])
def test_nothing_fits_or_a_malformed_table_is_one_error(content, budget, message, tmp_path,
                                                        tiny_vocab, capsys):
    table = tmp_path / "latency.csv"
    table.write_text(content, encoding="utf-8")
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["general"], dry_run=True,
                    student_config="auto", latency_table=str(table), latency_budget_ms=budget)
    assert main(["bin/distill", *argv(ns)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any(message in line for line in err), err
    assert not os.path.exists(os.path.join(ns.output_dir, autosize.FOLDER, "config.json"))


def test_a_real_measurement_here_stays_within_a_generous_budget(tmp_path):
    config = parse_argv(["bin/distill", f"--output_dir={tmp_path}", "--student_config=auto",
                         "--latency_budget_ms=5000", "--latency_seq_len=8",
                         "--latency_candidates=1x16x2x32,1x32x2x64"])
    sizing = autosize.size_student(config.models, log=lambda line: None)
    assert all(0 < c["latency_ms"] < 5000 and c["within_budget"] for c in sizing.candidates)
    assert sizing.student["name"] == "1x32x2x64"  # both fit: the larger one


def test_a_second_run_with_the_same_flags_reuses_the_choice(tmp_path, monkeypatch):
    """Measured once: the re-run (or the run after --dry_run) trains the announced student;
    report.json's entry is the same choice."""
    calls = []

    def fake(shape, runtime, seq_len, batch, **kwargs):
        calls.append(shape.name)
        return {"1x16x2x32": 2.0, "2x16x2x32": 4.0, "1x32x2x64": 7.0}[shape.name]

    monkeypatch.setattr(autosize, "measure", fake)
    argv_ = ["bin/distill", f"--output_dir={tmp_path}", "--student_config=auto",
             "--latency_budget_ms=5", "--latency_candidates=1x16x2x32,2x16x2x32,1x32x2x64"]
    first, sizing = autosize.resolve(parse_argv(argv_), log=lambda line: None)
    again, _ = autosize.resolve(parse_argv(argv_), log=lambda line: None)
    assert len(calls) == 3 and first == again
    assert sizing.student["name"] == "2x16x2x32"  # 1x32 has more parameters but takes 7 ms
    assert autosize.report_entry(str(tmp_path))["student_sizing"]["student"] == sizing.student
    autosize.resolve(parse_argv(argv_[:-2] + ["--latency_budget_ms=8", argv_[-1]]),
                     log=lambda line: None)
    assert len(calls) == 6  # another budget: measured again
