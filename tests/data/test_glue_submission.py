"""GLUE test-set submission files: names, headers, index columns and prediction formats of
the GLUE server, read from the GLUE download's layout (fixtures in tests/fixtures/glue)."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tinybert_tf.data import glue_submission as gs
from tinybert_tf.data.examples import DataError

from pipeline_helpers import REPO

GLUE = os.path.join(REPO, "tests", "fixtures", "glue")


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f]


@pytest.fixture
def glue_dir(tmp_path):
    """The fixtures in GLUE's layout, with the diagnostic set beside the task folders."""
    root = tmp_path / "glue_data"
    shutil.copytree(GLUE, root)
    os.makedirs(root / "diagnostic")
    with open(root / "diagnostic" / "diagnostic.tsv", "w", encoding="utf-8") as f:
        f.write("index\tsentence1\tsentence2\n0\tThe cat sat.\tA cat sat.\n"
                "1\tNo dog ran.\tA dog ran.\n2\tIt rains.\tIt is dry.\n")
    return str(root)


def test_mnli_writes_matched_mismatched_and_the_diagnostic_set_with_label_names(glue_dir,
                                                                              tmp_path):
    seen = {}

    def predict(examples):  # class ids, a different one per row
        seen[examples.source] = [e.text_a for e in examples]
        return np.arange(len(examples)) % 3

    out = str(tmp_path / "sub")
    written = gs.write_submission("MNLI", os.path.join(glue_dir, "MNLI"), out, predict)
    assert sorted(written) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    assert sorted(os.listdir(out)) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    labels = ["contradiction", "entailment", "neutral"]  # our MNLI label order
    for name, test in (("MNLI-m.tsv", "MNLI/test_matched.tsv"),
                       ("MNLI-mm.tsv", "MNLI/test_mismatched.tsv"),
                       ("AX.tsv", "diagnostic/diagnostic.tsv")):
        rows = _rows(os.path.join(out, name))
        source = _rows(os.path.join(glue_dir, test))
        assert rows[0] == ["index", "prediction"], name
        assert [r[0] for r in rows[1:]] == [s[0] for s in source[1:]], name
        assert [r[1] for r in rows[1:]] == [labels[i % 3] for i in range(len(source) - 1)]
        assert written[name] == len(source) - 1
    # The diagnostic set's premise and hypothesis are read by header name.
    ax = [v for k, v in seen.items() if k.endswith("diagnostic.tsv")]
    assert ax == [["The cat sat.", "No dog ran.", "It rains."]]


@pytest.mark.parametrize("task,file,values,want", [
    ("STS-B", "STS-B.tsv", [3.14159], ["3.1416"]),      # a score
    ("QQP", "QQP.tsv", [1], ["1"]),                      # an integer label; the "id" column
    ("QNLI", "QNLI.tsv", [1], ["not_entailment"]),       # a label name
    ("RTE", "RTE.tsv", [0], ["entailment"]),
    ("CoLA", "CoLA.tsv", [0, 1], ["0", "1"]),
])
def test_each_task_writes_its_server_file_name_and_prediction_format(glue_dir, tmp_path, task,
                                                                     file, values, want):
    data_dir = os.path.join(glue_dir, task)
    test = _rows(os.path.join(data_dir, "test.tsv"))[1:]
    n = len(test)
    values = (values * n)[:n]
    written = gs.write_submission(task, data_dir, str(tmp_path),
                                  lambda examples: np.array(values))
    assert written == {file: n}
    rows = _rows(os.path.join(tmp_path, file))
    assert rows[0] == ["index", "prediction"]
    assert [r[0] for r in rows[1:]] == [t[0] for t in test]
    assert [r[1] for r in rows[1:]] == (want * n)[:n]


def test_the_checks_name_the_flag_the_folder_and_the_fix(glue_dir, tmp_path):
    errors, warnings = gs.check("polarity", "")
    assert "not a GLUE task" in errors[0] and not warnings
    errors, _ = gs.check("SST-2", "tfds")
    assert "needs the GLUE TSV folder" in errors[0]
    os.remove(os.path.join(glue_dir, "SST-2", "test.tsv"))
    errors, _ = gs.check("SST-2", os.path.join(glue_dir, "SST-2"))
    assert errors and "SST-2/test.tsv not found" in errors[0]
    assert gs.check("MNLI", os.path.join(glue_dir, "MNLI")) == ([], [])
    shutil.rmtree(os.path.join(glue_dir, "diagnostic"))
    errors, warnings = gs.check("MNLI", os.path.join(glue_dir, "MNLI"))
    assert not errors and "AX.tsv" in warnings[0]
    written = gs.write_submission("MNLI", os.path.join(glue_dir, "MNLI"), str(tmp_path),
                                  lambda ex: np.zeros(len(ex), int))
    assert sorted(written) == ["MNLI-m.tsv", "MNLI-mm.tsv"]  # no diagnostic set, no AX


def test_a_diagnostic_file_without_its_columns_is_refused(tmp_path):
    root = tmp_path / "g"
    os.makedirs(root / "diagnostic")
    (root / "diagnostic" / "diagnostic.tsv").write_text("id\tpremise\thypothesis\n0\ta\tb\n")
    with pytest.raises(DataError, match=r"diagnostic.tsv:1: .*index, sentence1 and sentence2"):
        gs.test_set("MNLI", str(root / "MNLI"), gs.AX)
