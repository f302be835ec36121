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
    # Terms that take any head count: every row is a candidate (no row is excluded).
    ns = tiny_flags(tmp_path, tiny_vocab, stages=["general"], dry_run=True,
                    student_config="auto", latency_table=str(table), latency_budget_ms=budget,
                    loss_terms=["embd", "hidn"])
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
             "--loss_terms=embd,hidn", "--latency_budget_ms=5",
             "--latency_candidates=1x16x2x32,2x16x2x32,1x32x2x64"]
    first, sizing = autosize.resolve(parse_argv(argv_), log=lambda line: None)
    again, _ = autosize.resolve(parse_argv(argv_), log=lambda line: None)
    assert len(calls) == 3 and first == again
    assert sizing.student["name"] == "2x16x2x32"  # 1x32 has more parameters but takes 7 ms
    assert autosize.report_entry(str(tmp_path))["student_sizing"]["student"] == sizing.student
    autosize.resolve(parse_argv(argv_[:-2] + ["--latency_budget_ms=8", argv_[-1]]),
                     log=lambda line: None)
    assert len(calls) == 6  # another budget: measured again


# --- the teacher's head count, when the general stage's terms compare heads one to one ---
# The embedded teacher (minilm-l6) has 12 heads; its config is read, not its weights.
TEACHER_HEADS = 12


def _fake_measure(monkeypatch, latencies):
    """autosize.measure replaced by a table of latencies by shape name; returns the calls."""
    calls = []

    def fake(shape, runtime, seq_len, batch, **kwargs):
        calls.append(shape.name)
        return latencies[shape.name]

    monkeypatch.setattr(autosize, "measure", fake)
    return calls


def _auto(tmp_path, *flags):
    return parse_argv(["bin/distill", f"--output_dir={tmp_path}", "--student_config=auto",
                       *flags])


@pytest.mark.parametrize("flags,why", [
    ((), "--loss_terms attn compares the teacher's 12 heads one to one"),
    (("--recipe=minilm_v1",),
     "--recipe=minilm_v1 minilm_att, minilm_val compare the teacher's 12 heads one to one"),
])
def test_terms_that_compare_heads_give_every_candidate_the_teachers_heads(
        flags, why, tmp_path, monkeypatch):
    # Hand calculation: LxH takes 12 heads, H rounded to the nearest multiple of 12
    # (128/12 = 10.7 -> 11 x 12 = 132; 256/12 = 21.3 -> 252; 512/12 = 42.7 -> 516;
    # 768 = 64 x 12 stays), feed-forward 4H; 4x312x12x1200 names the teacher's heads
    # and stays; 3x256x4 names 4 heads and is excluded, not measured.
    calls = _fake_measure(monkeypatch, {"2x132x12x528": 1.0, "4x252x12x1008": 3.0,
                                        "4x516x12x2064": 9.0, "6x768x12x3072": 30.0,
                                        "4x312x12x1200": 4.0})
    config = _auto(tmp_path, *flags, "--latency_budget_ms=10",
                   "--latency_candidates=2x128,4x256,4x512,6x768,4x312x12x1200,3x256x4")
    assert autosize.head_rule(config) is not None
    resolved, sizing = autosize.resolve(config, log=lambda line: None)
    rows = {c["name"]: c for c in sizing.candidates}
    assert list(rows) == ["2x132x12x528", "4x252x12x1008", "4x516x12x2064", "6x768x12x3072",
                          "4x312x12x1200", "3x256x4x1024"]
    assert sorted(calls) == sorted(list(rows)[:5])  # the excluded shape is not measured
    assert rows["2x132x12x528"]["adjusted"] == (
        f"2x128 takes the teacher's 12 heads (not 2), hidden 128 -> 132 = 12 x 11, "
        f"feed-forward 528: {why}")
    assert "hidden 512 -> 516 = 12 x 43" in rows["4x516x12x2064"]["adjusted"]
    assert "adjusted" not in rows["6x768x12x3072"] and "adjusted" not in rows["4x312x12x1200"]
    assert rows["3x256x4x1024"]["excluded"] == f"4 heads; {why}"
    assert rows["3x256x4x1024"]["latency_ms"] is None
    assert not rows["3x256x4x1024"]["chosen"]
    # Within 10 ms: 2x132, 4x252, 4x516, 4x312; 4x516 has the most transformer parameters.
    assert _params(4, 516, 2064) > _params(4, 312, 1200) > _params(4, 252, 1008)
    assert sizing.student["name"] == "4x516x12x2064"
    assert sizing.student["params"] == _params(4, 516, 2064)
    assert f"every candidate has the teacher's 12 heads ({why})" in sizing.reason
    assert "128 -> 132, 256 -> 252, 512 -> 516" in sizing.reason
    assert "1 with another head count excluded" in sizing.reason
    chosen = json.loads(open(resolved.models.student_config).read())
    assert (chosen["num_heads"], chosen["hidden_size"]) == (TEACHER_HEADS, 516)


def test_a_table_row_with_other_heads_is_excluded_with_its_reason(tmp_path, monkeypatch):
    table = tmp_path / "latency.csv"
    table.write_text("layers,hidden,heads,intermediate,latency_ms\n"
                     "4,312,12,1200,5.0\n4,256,4,1024,3.0\n6,384,12,1536,9.0\n"
                     "6,512,8,2048,8.0\n", encoding="utf-8")
    calls = _fake_measure(monkeypatch, {})
    _, sizing = autosize.resolve(_auto(tmp_path, "--latency_budget_ms=10",
                                       f"--latency_table={table}"), log=lambda line: None)
    assert calls == []
    why = "--loss_terms attn compares the teacher's 12 heads one to one"
    assert [c.get("excluded") for c in sizing.candidates] == [
        None, f"4 heads; {why}", None, f"8 heads; {why}"]
    # 6x512x8 fits and has the most parameters, but 8 heads: 6x384x12 is chosen.
    assert _params(6, 512, 2048) > _params(6, 384, 1536)
    assert [c["within_budget"] for c in sizing.candidates] == [True] * 4
    assert [c["chosen"] for c in sizing.candidates] == [False, False, True, False]
    assert "of the 2 of 2 candidates" in sizing.reason
    assert "2 with another head count excluded" in sizing.reason


@pytest.mark.parametrize("flags", [("--recipe=minilm_v2",), ("--recipe=mlm",),
                                   ("--loss_terms=embd,hidn",)])
def test_terms_that_take_any_head_count_keep_the_h64_grid(flags, tmp_path, monkeypatch):
    calls = _fake_measure(monkeypatch, {"2x128x2x512": 1.0, "4x256x4x1024": 3.0})
    config = _auto(tmp_path, *flags, "--latency_budget_ms=10",
                   "--latency_candidates=2x128,4x256")
    assert autosize.head_rule(config) is None
    _, sizing = autosize.resolve(config, log=lambda line: None)
    assert calls == ["2x128x2x512", "4x256x4x1024"]
    assert not any("adjusted" in c or "excluded" in c for c in sizing.candidates)
    assert sizing.student["name"] == "4x256x4x1024" and "heads" not in sizing.reason
    assert sizing.request["teacher_heads"] is None


@pytest.mark.parametrize("source,message", [
    ("--latency_candidates=2x128x2,4x256x4x1024",
     "--latency_candidates: every shape names a head count other than the teacher's 12, and "
     "--loss_terms attn compares the teacher's 12 heads one to one; write the shapes "
     "LAYERSxHIDDEN (they then take 12 heads) or LxHx12, or train without attn (e.g. "
     "--recipe=minilm_v2"),
    ("table", "latency.csv: no row has the teacher's 12 heads, and --loss_terms attn "
              "compares the teacher's 12 heads one to one; add rows of 12-head shapes"),
])
def test_nothing_left_with_the_teachers_heads_is_one_error(source, message, tmp_path,
                                                          monkeypatch, capsys):
    table = tmp_path / "latency.csv"
    table.write_text(TABLE, encoding="utf-8")  # 2, 4 and 8 heads
    if source == "table":
        source = f"--latency_table={table}"
    calls = _fake_measure(monkeypatch, {})
    out = tmp_path / "out"
    assert main(["bin/distill", f"--output_dir={out}", "--student_config=auto",
                 "--latency_budget_ms=10", source, "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert calls == [] and not os.path.exists(out / autosize.FOLDER / "config.json")


def test_another_recipe_measures_again(tmp_path, monkeypatch):
    """The reuse key holds the head rule: the same --latency_* flags under another recipe
    (other terms, other candidates or another reason) are measured again."""
    calls = _fake_measure(monkeypatch, {"2x132x12x528": 1.0, "2x128x2x512": 1.0})
    flags = ("--latency_budget_ms=5", "--latency_candidates=2x128")
    for recipe, measured in (("tinybert", 1), ("tinybert", 1), ("minilm_v1", 2),
                             ("minilm_v2", 3)):
        _, sizing = autosize.resolve(_auto(tmp_path, f"--recipe={recipe}", *flags),
                                     log=lambda line: None)
        assert len(calls) == measured, recipe
    assert calls == ["2x132x12x528", "2x132x12x528", "2x128x2x512"]
    assert sizing.student["name"] == "2x128x2x512"


@pytest.mark.parametrize("flags,named", [
    (("--latency_budget_ms=1.5",), "--latency_budget_ms: only --student_config=auto reads it"),
    (("--latency_table=lat.csv", "--latency_budget_ms=2"),
     "--latency_budget_ms, --latency_table: only --student_config=auto reads them"),
])
def test_latency_flags_with_a_fixed_student_are_refused_not_ignored(flags, named, tmp_path,
                                                                     capsys):
    assert main(["bin/distill", f"--output_dir={tmp_path / 'out'}",
                 "--student_config=tinybert_4l_312d", *flags, "--dry_run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
    assert "--student_config=tinybert_4l_312d fixes the shape" in err[0]
    assert "drop" in err[0] and "or use --student_config=auto" in err[0]
    assert not os.path.exists(tmp_path / "out")


def test_latency_flags_left_at_their_defaults_pass_with_a_fixed_student(tmp_path):
    config = parse_argv(["bin/distill", f"--output_dir={tmp_path}", "--latency_budget_ms=0",
                         "--latency_seq_len=128"])
    assert config.models.student_config == "tinybert_4l_312d"


# --- the teacher's layer count, which --layer_mapping maps the student onto ---
# The embedded teacher (minilm-l6) has 6 layers.

def test_candidates_deeper_than_the_teacher_are_excluded_with_their_reason(tmp_path,
                                                                           monkeypatch):
    calls = _fake_measure(monkeypatch, {"4x252x12x1008": 3.0, "6x252x12x1008": 4.0})
    config = _auto(tmp_path, "--noinit_from_teacher", "--latency_budget_ms=10",
                   "--latency_candidates=4x256,6x256,8x256,12x256")
    resolved, sizing = autosize.resolve(config, log=lambda line: None)
    rows = {c["name"]: c for c in sizing.candidates}
    why = ("--layer_mapping=uniform maps each student layer onto its own layer of the "
           "teacher (--teacher=minilm-l6), which has 6")
    assert rows["8x252x12x1008"]["excluded"] == f"8 layers; {why}"
    assert rows["12x252x12x1008"]["excluded"] == f"12 layers; {why}"
    assert "excluded" not in rows["6x252x12x1008"]
    assert sorted(calls) == ["4x252x12x1008", "6x252x12x1008"]  # excluded: not measured
    assert sizing.student["name"] == "6x252x12x1008"
    assert f"2 excluded for their layer count ({why})" in sizing.reason
    assert "with another head count excluded" not in sizing.reason
    chosen = json.loads(open(resolved.models.student_config).read())
    assert chosen["num_layers"] == 6


def test_an_explicit_layer_mapping_keeps_only_candidates_of_its_length(tmp_path, monkeypatch):
    calls = _fake_measure(monkeypatch, {"8x252x12x1008": 5.0})
    _, sizing = autosize.resolve(_auto(tmp_path, "--layer_mapping=1,2,3,3,4,5,6,6",
                                       "--latency_budget_ms=10",
                                       "--latency_candidates=4x256,8x256"),
                                 log=lambda line: None)
    assert calls == ["8x252x12x1008"]
    assert sizing.candidates[0]["excluded"] == (
        "4 layers; --layer_mapping=1,2,3,3,4,5,6,6 names 8 teacher layers, one per student "
        "layer")
    assert sizing.student["name"] == "8x252x12x1008"


def test_no_candidate_within_the_teachers_layers_is_one_error(tmp_path, monkeypatch, capsys):
    calls = _fake_measure(monkeypatch, {})
    out = tmp_path / "out"
    assert main(["bin/distill", f"--output_dir={out}", "--student_config=auto",
                 "--latency_budget_ms=10", "--latency_candidates=8x256,12x256",
                 "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert ("--latency_candidates: no shape left has at most 6 layers, and "
            "--layer_mapping=uniform maps each student layer") in err, err
    assert "add shapes of at most 6 layers, or give --layer_mapping an explicit list" in err
    assert calls == [] and not os.path.exists(out / autosize.FOLDER / "config.json")


# --- --init_from_teacher: the teacher's width and heads, at most its feed-forward size ---
# The embedded teacher (minilm-l6): 6 layers, 384 wide, 12 heads, 1,536 feed-forward units.
INIT_WHY = ("--init_from_teacher copies the teacher's layers (384 wide, 12 heads, at most "
            "its 1536 feed-forward units)")


def test_init_from_teacher_measures_the_teachers_own_grid(tmp_path, monkeypatch):
    # Hand-made latencies: 1 ms per layer, plus 1 ms per layer at the full feed-forward
    # size, in proportion below it.
    ffns = (1536, 1152, 768, 384)
    latencies = {f"{n}x384x12x{f}": n * (1.0 + f / 1536) for n in range(1, 7) for f in ffns}
    calls = _fake_measure(monkeypatch, latencies)
    config = _auto(tmp_path, "--init_from_teacher", "--latency_budget_ms=4.6")
    assert autosize.init_rule(config) is not None
    resolved, sizing = autosize.resolve(config, log=lambda line: None)
    assert sorted(calls) == sorted(latencies)  # the 24 shapes, nothing else
    # Within 4.6 ms (n * (1 + f/1536) <= 4.6): every 1- and 2-layer shape, 3 layers at
    # 768 (4.5 ms) or 384; no 4-layer one (4 at 384: 5.0). The most transformer
    # parameters among them: 3 at 768, just ahead of 2 at 1536.
    assert _params(3, 384, 768) == 3_551_616 > _params(2, 384, 1536) == 3_548_928
    assert _params(2, 384, 1536) > _params(3, 384, 384)
    assert sizing.student["name"] == "3x384x12x768"
    assert ("the candidates are the teacher's own shapes, 1-6 layers x feed-forward "
            f"1536, 1152, 768, 384 ({INIT_WHY})") in sizing.reason
    chosen = json.loads(open(resolved.models.student_config).read())
    assert (chosen["num_layers"], chosen["hidden_size"], chosen["intermediate_size"]) == \
        (3, 384, 768)


def test_init_from_teacher_excludes_given_shapes_it_cannot_start(tmp_path, monkeypatch):
    calls = _fake_measure(monkeypatch, {"2x384x12x768": 2.0, "3x384x12x1536": 3.0})
    _, sizing = autosize.resolve(_auto(
        tmp_path, "--init_from_teacher", "--latency_budget_ms=10",
        "--latency_candidates=2x256,2x384x12x768,3x384x12x1536,3x384x12x3072"),
        log=lambda line: None)
    rows = {c["name"]: c for c in sizing.candidates}
    assert rows["2x252x12x1008"]["excluded"] == f"252 wide, 12 heads; {INIT_WHY}"
    assert rows["3x384x12x3072"]["excluded"] == f"3072 feed-forward units; {INIT_WHY}"
    assert sorted(calls) == ["2x384x12x768", "3x384x12x1536"]
    assert sizing.student["name"] == "3x384x12x1536"
    assert f"2 excluded that cannot start from the teacher ({INIT_WHY})" in sizing.reason


def test_no_candidate_that_can_start_from_the_teacher_is_one_error(tmp_path, monkeypatch,
                                                                    capsys):
    calls = _fake_measure(monkeypatch, {})
    out = tmp_path / "out"
    assert main(["bin/distill", f"--output_dir={out}", "--student_config=auto",
                 "--init_from_teacher", "--latency_budget_ms=10",
                 "--latency_candidates=4x256,2x512", "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert f"--latency_candidates: no shape left can start from the teacher, and {INIT_WHY}" \
        in err, err
    assert "give shapes LAYERSx384x12xFFN with FFN <= 1536" in err
    assert "or train from random weights (--noinit_from_teacher)" in err
    assert calls == [] and not os.path.exists(out / autosize.FOLDER / "config.json")


def test_a_recipe_that_always_copies_layers_gets_the_same_rule(tmp_path, monkeypatch):
    # DistilBERT's recipe starts every student from every other teacher layer.
    calls = _fake_measure(monkeypatch, {"2x384x12x768": 2.0})
    _, sizing = autosize.resolve(_auto(tmp_path, "--recipe=distilbert",
                                       "--latency_budget_ms=10",
                                       "--latency_candidates=4x256,2x384x12x768"),
                                 log=lambda line: None)
    why = INIT_WHY.replace("--init_from_teacher", "--recipe=distilbert")
    assert sizing.candidates[0]["excluded"] == f"256 wide, 4 heads; {why}"
    assert calls == ["2x384x12x768"] and sizing.student["name"] == "2x384x12x768"
    assert sizing.request["teacher_init"]["flag"] == "--recipe=distilbert"


@pytest.mark.parametrize("flags,source", [
    (("--general_model={general}",), "its student is --general_model={general}, whose shape "
                                     "stays. Drop --student_config=auto and the --latency_* "
                                     "flags, or add general to --stages without "
                                     "--general_model."),
    (("--stages=evaluate,export",), "its student is the general stage's model "
                                    "({out}/general/model), whose shape stays."),
])
def test_auto_with_no_stage_that_builds_the_student_is_refused_before_measuring(
        flags, source, tmp_path, monkeypatch, capsys):
    calls = _fake_measure(monkeypatch, {})
    out, general = tmp_path / "out", tmp_path / "general"
    flags = [f.format(general=general) for f in flags]
    assert main(["bin/distill", f"--output_dir={out}", "--student_config=auto",
                 "--latency_budget_ms=10", *flags, "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert "--student_config=auto sizes the student the general stage builds, but this " \
        "run's stages (" in err, err
    assert source.format(general=general, out=out) in err, err
    assert calls == [] and not os.path.exists(out / autosize.FOLDER)
