"""bin/augment, bin/export and bin/pretokenize refuse an out-of-range number as bin/distill
does: one line naming the flag and what it must be, exit 2, before anything is read or
written. (A negative --export_max_examples or --vector_vocab_limit was taken as a
Python slice, dropping the last examples or words without a word.)"""
from __future__ import annotations

import os

import pytest

from pipeline_helpers import run_tool

CASES = [
    ("export", ["--export_max_examples=-3"], "--export_max_examples=-3: must be >= 0 (0 = all)."),
    ("export", ["--export_latency_runs=0"], "--export_latency_runs=0: must be >= 1."),
    ("export", ["--export_threads=-2"], "--export_threads=-2: must be >= 0 (0 = all cores)."),
    ("export", ["--max_seq_len=-5"],
     "--max_seq_len=-5: must be >= 0 (0 = the task's default)."),
    ("augment", ["--vector_vocab_limit=-1"], "--vector_vocab_limit=-1: must be >= 0 (0 = all)."),
    ("augment", ["--num_aug=0"], "--num_aug=0: must be >= 1."),
    ("augment", ["--replace_prob=0"], "--replace_prob=0.0: must be in (0, 1] (0 replaces no "
     "word, and the augmented file would hold only the original rows: for those, give "
     "--nouse_augmented)."),
    ("augment", ["--max_seq_len=-5"],
     "--max_seq_len=-5: must be >= 0 (0 = the task's default)."),
    # --vocab is read only beside --mlm_model: alone, even a missing file was ignored.
    ("augment", ["--vocab=/nonexistent/vocab.txt"],
     "--vocab=/nonexistent/vocab.txt: only --mlm_model's vocab is checked against it; "
     "without --mlm_model it would be ignored: drop it, or give --mlm_model."),
    ("augment", ["--vocab=/nonexistent/vocab.txt", "--mlm_model=/nonexistent/mlm"],
     "--vocab=/nonexistent/vocab.txt: file not found; give the task tokenizer's vocab.txt "
     "(the teacher's), its model directory or a model's short name (minilm-l6)."),
    ("pretokenize", ["--max_seq_len=3"],
     "--max_seq_len=3: must be >= 4 with --pack=pair (the special tokens and a word piece "
     "of text)."),
    ("pretokenize", ["--max_seq_len=2", "--pack=single"],
     "--max_seq_len=2: must be >= 3 with --pack=single (the special tokens and a word "
     "piece of text)."),
    # 0 was taken as 128 (the default) without a word.
    ("pretokenize", ["--max_seq_len=0"],
     "--max_seq_len=0: must be >= 4 with --pack=pair (the special tokens and a word piece "
     "of text)."),
    ("pretokenize", ["--num_workers=-1"], "--num_workers=-1: must be >= 0 (0 = all CPU cores)."),
]


def _required(tool: str, tmp) -> list[str]:
    """Each tool's required flags, naming paths that do not exist: the range check comes
    first."""
    out = tmp / "out"
    return {"export": [f"--model_dir={tmp / 'model'}", f"--output_dir={out}",
                       "--task=polarity"],
            "augment": ["--task=polarity", "--augment_fallback",
                        f"--output={out / 'train_aug.tsv'}"],
            "pretokenize": [f"--vocab={tmp / 'vocab.txt'}", f"--output={out / 'c'}",
                            "--num_shards=1"]}[tool]


@pytest.mark.parametrize("tool,flags,message", CASES,
                         ids=[f"{t}{''.join(f)}" for t, f, _ in CASES])
def test_a_tool_refuses_an_out_of_range_number_naming_the_flag(tmp_path, capsys, tool, flags,
                                                                message):
    code = run_tool(tool, *_required(tool, tmp_path), *flags)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines()[-1] == f"bin/{tool}: error: {message}", err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tool,flag,name", [("augment", "--output", "train_aug.tsv"),
                                            ("pretokenize", "--output", "wiki"),
                                            ("benchmark", "--benchmark_output", "bench")])
def test_a_tools_output_inside_a_model_directory_is_refused(tmp_path, capsys, tool, flag,
                                                            name):
    """What a tool writes into a model directory changes the model: a pipeline that made
    it (a run's fine-tuned teacher, say) trained it again."""
    model = tmp_path / "run" / "finetune_teacher" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"format": "tinybert_tf"}')
    inside = model / "aux" / name
    real = os.path.realpath(model)  # as named: a temporary folder may be reached by a link
    required = {"augment": ["--task=polarity", "--augment_fallback"],
                "pretokenize": [f"--vocab={tmp_path / 'vocab.txt'}", "--num_shards=1"],
                "benchmark": ["--quick"]}[tool]
    code = run_tool(tool, *required, f"{flag}={inside}")
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines()[-1] == (
        f"bin/{tool}: error: {flag}={inside}: inside the model directory {real} "
        "(tinybert_tf format); what is written there would change that model (a run that "
        f"made it would train it again). Choose {flag} outside it."), err
    assert sorted(os.listdir(model)) == ["config.json"]
    # Reached through a symbolic link: the model directory the writes would land in.
    (tmp_path / "latest").symlink_to(model.parent, target_is_directory=True)
    linked = tmp_path / "latest" / "model" / name
    assert run_tool(tool, *required, f"{flag}={linked}") == 2
    assert f"{flag}={linked}: inside the model directory {real} (tinybert_tf format)" in \
        capsys.readouterr().err
    assert sorted(os.listdir(model)) == ["config.json"]
