"""Own-data CSV / TSV / JSON-lines readers: quoting, BOM, CRLF, unicode, pairs, label
sets and ids, regression targets, and every bad-input error naming file, line and fix."""
import math
import os
import re

import pytest
import tensorflow as tf

from tinybert_tf.data import tabular
from tinybert_tf.data.examples import DataError

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                   "own_data")


def fixture(name):
    return os.path.join(FIX, name)


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return str(path)


def raises_at(path, line, *fix):
    """pytest.raises for a DataError whose message starts with `path:line:` and holds `fix`."""
    pattern = re.escape(f"{path}:{line}:") + "".join(f"(?s:.*){re.escape(f)}" for f in fix)
    return pytest.raises(DataError, match=pattern)


# ---------------------------------------------------------------------------
# Reading.

def test_csv_keeps_quoted_commas_doubled_quotes_newlines_tabs_and_unicode():
    ex = tabular.load_examples(fixture("reviews_train.csv"))
    assert len(ex) == 10 and ex.source == fixture("reviews_train.csv")
    assert ex[0].text_a == "The battery lasts two full days, even with GPS on."
    assert ex[3].text_a == 'The manual says "waterproof", but it died in the rain.'
    assert ex[4].text_a == ("Great little speaker.\n"
                            "The bass is surprisingly deep for the size.")
    assert ex[5].text_a == "Colour:\tmatte black\t(as pictured)"
    assert ex[6].text_a == "Café-quality espresso at home — naïve me expected less ☕"
    assert ex[8].text_a == "説明書が分かりにくいが、音質は良い。"
    assert [e.label for e in ex[:3]] == ["positive", "negative", "neutral"]
    assert all(e.text_b is None for e in ex)


def test_line_numbers_are_each_records_starting_line():
    ex = tabular.load_examples(fixture("reviews_train.csv"))
    # The record on lines 6-7 holds a newline: the records after it start one line later.
    assert ex.lines == [2, 3, 4, 5, 6, 8, 9, 10, 11, 12]
    assert ex[4].guid == "reviews_train-6" and ex[5].guid == "reviews_train-8"


def test_bom_and_crlf_read_like_plain_utf8(tmp_path):
    with open(fixture("reviews_train.csv"), "rb") as f:
        plain = f.read()
    path = write(tmp_path, "excel.csv", b"\xef\xbb\xbf" + plain.replace(b"\n", b"\r\n"))
    ex = tabular.load_examples(path)
    ref = tabular.load_examples(fixture("reviews_train.csv"))
    assert ex.lines == ref.lines
    # The newline inside the quoted field is kept as written (CRLF here).
    assert [e.text_a.replace("\r\n", "\n") for e in ex] == [e.text_a for e in ref]
    assert [e.label for e in ex] == [e.label for e in ref]


def test_bom_on_a_header_does_not_hide_the_first_column(tmp_path):
    path = write(tmp_path, "bom.tsv", "\ufefftext\tlabel\nA calm, clear morning.\tpos\n")
    assert tabular.load_examples(path)[0].text_a == "A calm, clear morning."


def test_tsv_uses_csv_quoting_for_tabs_newlines_and_quotes():
    ex = tabular.load_examples(fixture("nli_train.tsv"), text_column="premise",
                               text_pair_column="hypothesis")
    assert len(ex) == 5
    assert (ex[0].text_a, ex[0].text_b, ex[0].label) == (
        "A man is playing a guitar on stage.", "A musician is performing.", "entailment")
    assert ex[2].text_a == "A woman reads a book\ton a park bench."
    assert ex[3].text_a == 'The chef said "taste this" and\nhanded me a spoon.'
    # A quote that does not start the field is text.
    assert ex[4].text_a == 'He said "hello" to the crowd.'
    assert ex.lines == [2, 3, 4, 5, 7]


def test_jsonl_pairs():
    ex = tabular.load_examples(fixture("nli_train.jsonl"), text_column="premise",
                               text_pair_column="hypothesis")
    assert [(e.text_b, e.label) for e in ex[:2]] == [
        ("A child is playing.", "entailment"), ("The kids are frowning.", "contradiction")]
    assert ex[3].text_a == "Zwei Frauen gehen am Fluss spazieren."
    assert ex.lines == [1, 2, 3, 4]


def test_data_format_overrides_the_extension(tmp_path):
    with open(fixture("nli_train.tsv"), encoding="utf-8") as f:
        path = write(tmp_path, "pairs.txt", f.read())
    ex = tabular.load_examples(path, "premise", "hypothesis", data_format="tsv")
    assert len(ex) == 5 and ex[2].text_a == "A woman reads a book\ton a park bench."
    with pytest.raises(DataError, match=r"pairs\.txt: cannot tell the format.*data_format="):
        tabular.load_examples(path)
    with pytest.raises(DataError, match="unknown data format 'xml'"):
        tabular.load_examples(path, data_format="xml")


def test_unlabelled_test_file_reads_with_require_label_false():
    ex = tabular.load_examples(fixture("reviews_test.csv"), require_label=False)
    assert [e.label for e in ex] == [None, None]
    assert ex[1].text_a == "Loud, clear, and the app is simple."
    assert ex.label_column is None


def test_gfile_paths_are_read():
    path = "ram://own_data/train.csv"
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(b"text,label\nQuiet and fast.,pos\n")
    assert tabular.load_examples(path)[0].label == "pos"


# ---------------------------------------------------------------------------
# Labels.

def test_string_labels_sort_by_name():
    ex = tabular.load_examples(fixture("reviews_train.csv"))
    assert tabular.label_set(ex) == ["negative", "neutral", "positive"]
    ids = tabular.encode_labels(ex, ["negative", "neutral", "positive"])
    assert [e.label for e in ids[:4]] == [2, 0, 1, 0]
    assert ids.lines == ex.lines and ids.source == ex.source
    assert ex[0].label == "positive"  # the input is left as it was


def test_integer_labels_sort_numerically_and_are_named_as_strings():
    ex = tabular.load_examples(fixture("ratings.jsonl"), text_column="review",
                               label_column="stars")
    assert [e.label for e in ex[:2]] == [10, 2]  # raw JSON numbers
    names = tabular.label_set(ex)
    assert names == ["1", "2", "6", "8", "10"]
    assert [e.label for e in tabular.encode_labels(ex, names)] == [4, 1, 2, 0, 3, 2]


def test_integer_labels_in_csv_match_json_ones(tmp_path):
    path = write(tmp_path, "stars.csv", "text,label\nGood.,10\nFine.,9\nBad.,-1\n")
    ex = tabular.load_examples(path)
    assert tabular.label_set(ex) == ["-1", "9", "10"]
    assert [e.label for e in tabular.encode_labels(ex, ["-1", "9", "10"])] == [2, 1, 0]


def test_explicit_label_order_wins():
    ex = tabular.load_examples(fixture("reviews_train.csv"))
    names = tabular.label_set(ex, "positive, neutral,negative")
    assert names == ["positive", "neutral", "negative"]
    assert tabular.label_set(ex, ["negative", "positive", "neutral", "mixed"])[-1] == "mixed"
    assert tabular.encode_labels(ex, names)[0].label == 0


def test_explicit_labels_must_cover_the_file_and_be_distinct():
    ex = tabular.load_examples(fixture("reviews_train.csv"))
    with raises_at(fixture("reviews_train.csv"), 4, "label 'neutral' is not in --labels",
                   "add it to --labels"):
        tabular.label_set(ex, "positive,negative")
    with pytest.raises(DataError, match="'neutral' is listed twice"):
        tabular.label_set(ex, "neutral,positive,neutral")
    with pytest.raises(DataError, match="empty label name"):
        tabular.label_set(ex, "neutral,,positive")


@pytest.mark.parametrize("rows,first,second,how", [
    ("Great.,pos\nBad.,neg\nFine.,Pos\n", "pos", "Pos", "differ only in case"),
    ("Great.,1\nBad.,0\nFine.,1.0\n", "1", "1.0", "are the same number"),
    ("Great.,01\nBad.,0\nFine.,1\n", "01", "1", "are the same number"),
])
def test_one_class_written_two_ways_is_refused_not_trained_as_two(tmp_path, rows, first,
                                                                  second, how):
    """ "pos" and "Pos", or "1" and "1.0", were two classes, each with part of the rows
    (a CSV's 1.0 is a string; a JSON 1.0 already names class "1")."""
    path = write(tmp_path, "train.csv", "text,label\n" + rows)
    with raises_at(path, 4, f"label {second!r} in column 'label' and label {first!r} "
                   f"({path}:2) {how}, so they would be two classes", "--labels"):
        tabular.label_set(tabular.load_examples(path))
    # --labels listing both says they are two classes on purpose.
    names = tabular.label_set(tabular.load_examples(path), [first, "0" if first != "pos"
                                                            else "neg", second])
    assert names[0] == first and names[2] == second


@pytest.mark.parametrize("name,header,fix", [
    ("train.csv", "text;label", "write it with commas (.csv) or tabs (.tsv)"),
    ("train.csv", "text\tlabel", "name it .tsv (or pass --data_format=tsv)"),
    ("train.tsv", "text,label", "name it .csv (or pass --data_format=csv)"),
])
def test_a_header_in_another_separator_names_the_separator_not_a_column_flag(
        tmp_path, name, header, fix):
    sep = ";" if ";" in header else "\t" if "\t" in header else ","
    path = write(tmp_path, name, f"{header}\nGreat.{sep}pos\nBad.{sep}neg\n")
    with pytest.raises(DataError) as err:
        tabular.load_examples(path)
    message = str(err.value)
    assert message.startswith(f"{path}:1: no column 'text' (--text_column); the header is "
                              f"one column, {header!r}, separated by ")
    assert message.endswith(fix + ".") and "pass --text_column" not in message
    # A header of one ordinary column still gets the column advice.
    path = write(tmp_path, "one.csv", "review\nGreat.\n")
    with raises_at(path, 1, "the header has the columns ['review']: pass --text_column"):
        tabular.load_examples(path)


def test_validation_labels_encode_with_the_training_names():
    names = tabular.label_set(tabular.load_examples(fixture("reviews_train.csv")))
    dev = tabular.load_examples(fixture("reviews_dev.csv"))
    assert [e.label for e in tabular.encode_labels(dev, names)] == [2, 0, 1]


def test_label_unseen_in_training_names_file_line_and_labels_flag(tmp_path):
    path = write(tmp_path, "dev.csv", "text,label\nNice.,positive\nMeh, I guess.,mixed\n")
    # The unquoted comma makes line 3 three fields: fix that first, then the label.
    with raises_at(path, 3, "3 comma-separated fields", "header (line 1) has 2",
                   "double quotes"):
        tabular.load_examples(path)
    path = write(tmp_path, "dev.csv", 'text,label\nNice.,positive\n"Meh, I guess.",mixed\n')
    dev = tabular.load_examples(path)
    with raises_at(path, 3, "label 'mixed'", "does not occur in the training file",
                   "--labels=negative,neutral,positive,mixed"):
        tabular.encode_labels(dev, ["negative", "neutral", "positive"])


def test_an_id_column_as_labels_is_refused_not_planned_as_one_class_per_row(tmp_path):
    rows = "".join(f"Review number {i}.,r{i:03d},{'positive' if i % 2 else 'negative'}\n"
                   for i in range(24))
    path = write(tmp_path, "train.csv", "text,id,label\n" + rows)
    with pytest.raises(DataError, match=re.escape(
            f"{path}: the labels in column 'id' take 24 different values in 24 rows, "
            "['r000', 'r001', 'r002', ... (24 in all)]: that is text or ids, not class "
            "labels; pass --label_column=NAME of the column that holds the classes (or "
            "--task=text_regression for numeric targets).")):
        tabular.label_set(tabular.load_examples(path, label_column="id"))
    assert tabular.label_set(tabular.load_examples(path)) == ["negative", "positive"]
    # A handful of rows may each have their own class; --labels says so on purpose.
    few = write(tmp_path, "few.csv", "text,label\n" + "".join(
        f"Text {i}.,c{i}\n" for i in range(10)))
    assert len(tabular.label_set(tabular.load_examples(few))) == 10
    assert len(tabular.label_set(tabular.load_examples(path, label_column="id"),
                                 [f"r{i:03d}" for i in range(24)])) == 24


def test_fractional_number_is_not_a_class_label(tmp_path):
    path = write(tmp_path, "scores.jsonl", '{"text": "Okay.", "label": 0.5}\n')
    with raises_at(path, 1, "0.5", "--task=text_regression"):
        tabular.label_set(tabular.load_examples(path))


# ---------------------------------------------------------------------------
# Regression.

def test_regression_targets_parse_to_floats():
    ex = tabular.load_examples(fixture("similarity.csv"), "sentence1", "sentence2", "score")
    out = tabular.parse_regression(ex)
    assert [e.label for e in out] == [5.0, 2.4, 2.6, 0.0]
    assert all(isinstance(e.label, float) for e in out)
    assert out[2].text_b == "Two men are playing chess."
    js = tabular.parse_regression(tabular.load_examples(
        fixture("ratings.jsonl"), text_column="review", label_column="stars"))
    assert js[0].label == 10.0 and isinstance(js[0].label, float)


@pytest.mark.parametrize("value,why", [("high", "is not a number"), ("nan", "is not finite"),
                                       ("-inf", "is not finite"), ("1,5", "is not a number")])
def test_bad_regression_target_names_file_and_line(tmp_path, value, why):
    path = write(tmp_path, "sts.csv",
                 f'sentence1,sentence2,score\nA cat sleeps.,A cat naps.,4.5\nA.,B.,"{value}"\n')
    ex = tabular.load_examples(path, "sentence1", "sentence2", "score")
    fix = "--task=text_regression" if "number" in why else "finite number"
    with raises_at(path, 3, f"regression target '{value}' in column 'score' {why}", fix):
        tabular.parse_regression(ex)


def test_json_nan_and_boolean_targets_are_refused(tmp_path):
    path = write(tmp_path, "t.jsonl", '{"text": "a b", "label": 1.5}\n{"text": "c", "label": NaN}\n'
                 '{"text": "d", "label": true}\n')
    ex = tabular.load_examples(path)
    with raises_at(path, 2, "is not finite"):
        tabular.parse_regression(ex)
    with raises_at(path, 3, "True", "is not a number"):
        tabular.parse_regression(ex[2:])
    assert math.isclose(tabular.parse_regression(ex[:1])[0].label, 1.5)


# ---------------------------------------------------------------------------
# Bad input.

def test_missing_column_lists_the_columns_found():
    path = fixture("reviews_dev.csv")
    with raises_at(path, 1, "no column 'sentence' (--text_column)", "['id', 'text', 'label']",
                   "--text_column=NAME"):
        tabular.load_examples(path, text_column="sentence")
    with raises_at(path, 1, "no column 'gold' (--label_column)"):
        tabular.load_examples(path, label_column="gold")
    with raises_at(fixture("reviews_test.csv"), 1, "no column 'label' (--label_column)"):
        tabular.load_examples(fixture("reviews_test.csv"))


def test_missing_key_in_a_json_line_lists_its_keys(tmp_path):
    path = write(tmp_path, "d.jsonl", '{"text": "Fine.", "label": "a"}\n{"txt": "Oops.", '
                 '"label": "b"}\n')
    with raises_at(path, 2, "no key 'text' (--text_column)", "['label', 'txt']"):
        tabular.load_examples(path)


@pytest.mark.parametrize("content,what", [("", "empty file"), ("\n\n", "empty file"),
                                          ("text,label\n", "a header and no rows"),
                                          ("text,label\r\n\r\n", "a header and no rows")])
def test_empty_or_header_only_csv(tmp_path, content, what):
    path = write(tmp_path, "train.csv", content)
    with pytest.raises(DataError, match=re.escape(f"{path}: ") + f".*{what}"):
        tabular.load_examples(path)


def test_blank_jsonl_has_no_examples(tmp_path):
    path = write(tmp_path, "train.jsonl", "\n  \n")
    with pytest.raises(DataError, match="no examples.*only blank lines"):
        tabular.load_examples(path)


def test_json_line_that_is_not_json_or_not_an_object(tmp_path):
    path = write(tmp_path, "d.jsonl", '{"text": "Good.", "label": "a"}\n{"text": "Bad.", '
                 "'label': 'b'}\n")
    with raises_at(path, 2, "not JSON", "one JSON object per line"):
        tabular.load_examples(path)
    path = write(tmp_path, "e.jsonl", '{"text": "Good.", "label": "a"}\n["Bad.", "b"]\n')
    with raises_at(path, 2, "a JSON array, expected an object"):
        tabular.load_examples(path)
    path = write(tmp_path, "f.json", '[\n  {"text": "Good.", "label": "a"}\n]\n')
    with raises_at(path, 1, "not JSON", "one JSON array", "jq -c"):
        tabular.load_examples(path)


def test_empty_text_names_the_row(tmp_path):
    path = write(tmp_path, "d.csv", 'text,label\nFine.,a\n"  ",b\n')
    with raises_at(path, 3, "empty text in column 'text'", "delete the row"):
        tabular.load_examples(path)
    path = write(tmp_path, "p.jsonl", '{"a": "One.", "b": "", "label": "x"}\n')
    with raises_at(path, 1, "empty text in column 'b'"):
        tabular.load_examples(path, "a", "b")
    path = write(tmp_path, "n.jsonl", '{"text": 42, "label": "x"}\n')
    with raises_at(path, 1, "holds a JSON number", "must be a string"):
        tabular.load_examples(path)


def test_empty_label_in_a_labelled_file(tmp_path):
    path = write(tmp_path, "d.csv", "text,label\nFine.,a\nNo label here.,\n")
    with raises_at(path, 3, "empty label in column 'label'"):
        tabular.load_examples(path)
    assert tabular.load_examples(path, require_label=False)[1].label is None


def test_unclosed_quote_names_the_records_first_line(tmp_path):
    path = write(tmp_path, "d.csv", 'text,label\nFine.,a\n"Never closed,b\nMore.,c\n')
    with raises_at(path, 3, "malformed record", 'a field that starts with " must end with "'):
        tabular.load_examples(path)
    path = write(tmp_path, "d.tsv", 'text\tlabel\n"Quoted" then text\tb\n')
    with raises_at(path, 2, "malformed record"):
        tabular.load_examples(path)


def test_invalid_utf8_and_missing_file(tmp_path):
    path = write(tmp_path, "latin1.csv", "text,label\nFine.,a\nCaf\xe9 au lait.,b\n"
                 .encode("latin-1"))
    with raises_at(path, 3, "invalid UTF-8", "iconv -f LATIN1 -t UTF-8"):
        tabular.load_examples(path)
    # Excel's "Unicode Text" (UTF-16 with its byte-order mark), and UTF-32: named, with
    # the command for that encoding, not LATIN1's.
    for name, codec in (("UTF-16", "utf-16"), ("UTF-32", "utf-32")):
        path = write(tmp_path, f"{codec}.tsv", "text\tlabel\nFine.\ta\n".encode(codec))
        with raises_at(path, 1, "invalid UTF-8", f"the file is {name} (its byte-order mark "
                       f"says so): re-encode it, e.g. iconv -f {name} -t UTF-8"):
            tabular.load_examples(path)
    missing = str(tmp_path / "nope.csv")
    with pytest.raises(DataError, match=re.escape(missing) + ": file not found"):
        tabular.load_examples(missing)
