"""The TinyBERT paper's Tables 1-7 as data: their cells (a flagfile of configs/paper/
each), the tasks and metrics of their columns, and the numbers the paper publishes.

Source of every published number: Jiao et al., "TinyBERT: Distilling BERT for
Natural Language Understanding", arXiv:1909.10351v5 (Findings of EMNLP 2020),
Tables 1-7, read from a text transcription of v5 (its Tables 1 and 6 also
quoted, identically, in huggingface/nn_pruning's analysis code). A value the
paper leaves blank ("-") is None. Nothing here is estimated.

Units: the paper's numbers are percentages (SQuAD: EM/F1 points); our report
holds fractions for GLUE metrics (`Column.scale` = 100) and points for SQuAD.
Table 1 is the GLUE *test* set (the GLUE server's numbers); the others are
dev. `bin/reproduce` scores dev sets, so Table 1's comparison is dev against
test. Where the paper does not name a column's metric (MRPC and QQP in Tables
1-4 and 7, STS-B in Table 1) we compare GLUE's headline metric: F1 for MRPC and
QQP, Spearman for STS-B.

`TASK_FLAGS` are the paper's per-task settings (Sec. 4.2 and its footnotes:
10 intermediate epochs for MNLI, QQP and QNLI, 50 for CoLA; Appendix B for
SQuAD, with the choices of configs/td_squad11.cfg where the paper names none).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

SOURCE = ("Jiao et al. 2020, TinyBERT, arXiv:1909.10351v5 (Findings of EMNLP 2020), "
          "Table {n}")


@dataclasses.dataclass(frozen=True)
class Column:
    """A column of a table: its header, our --task and the report key of its metric
    (`<split>_<metric>` for tasks with several dev splits)."""

    header: str
    task: str
    metric: str
    scale: float = 100.0


@dataclasses.dataclass(frozen=True)
class Cell:
    """A row of a table: a recipe (flagfile under configs/paper/), or the teacher
    (`flagfile` None: its score is the task teacher's in every cell's report).

    model_flag: the bin/reproduce flag naming the pre-trained model the cell starts from
    (passed as its --general_model), which it cannot make itself; the cell refuses to run
    without it."""

    name: str
    label: str
    flagfile: Optional[str]
    published: dict[str, Optional[float]]
    note: str = ""
    model_flag: Optional[str] = None

    @property
    def is_teacher(self) -> bool:
        return self.flagfile is None


@dataclasses.dataclass(frozen=True)
class PaperTable:
    number: int
    title: str
    split: str
    columns: tuple[Column, ...]
    cells: tuple[Cell, ...]
    note: str = ""

    @property
    def source(self) -> str:
        return SOURCE.format(n=self.number)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.task for c in self.columns))

    def cell(self, name: str) -> Cell:
        for cell in self.cells:
            if cell.name == name:
                return cell
        raise KeyError(name)


def _col(header: str, task: str, metric: str, scale: float = 100.0) -> Column:
    return Column(header, task, metric, scale)


MNLI_M = _col("MNLI-m", "mnli", "dev_matched_accuracy")
MNLI_MM = _col("MNLI-mm", "mnli", "dev_mismatched_accuracy")
QQP = _col("QQP", "qqp", "f1")
QNLI = _col("QNLI", "qnli", "accuracy")
SST2 = _col("SST-2", "sst-2", "accuracy")
COLA = _col("CoLA", "cola", "mcc")
STSB = _col("STS-B", "sts-b", "spearman")
MRPC = _col("MRPC", "mrpc", "f1")
RTE = _col("RTE", "rte", "accuracy")
GLUE9 = (MNLI_M, MNLI_MM, QQP, QNLI, SST2, COLA, STSB, MRPC, RTE)
ABLATION = (MNLI_M, MNLI_MM, MRPC, COLA)


def _row(columns, values) -> dict[str, Optional[float]]:
    """{header: value} for `columns` (in order) plus "Avg" (the last value)."""
    *scores, avg = values
    if len(scores) != len(columns):
        raise ValueError(f"{len(scores)} values for {len(columns)} columns")
    return {**{c.header: v for c, v in zip(columns, scores)}, "Avg": avg}


# --- Table 1: GLUE test set -----------------------------------------------------------

TABLE1 = PaperTable(1, "4- and 6-layer students against their baselines", "GLUE test set",
                    GLUE9, (
    Cell("teacher", "BERT-base (teacher)", None,
         _row(GLUE9, [83.9, 83.4, 71.1, 90.9, 93.4, 52.8, 85.2, 87.5, 67.0, 79.5])),
    Cell("bert_tiny", "BERT-Tiny", "table1_bert_tiny.cfg",
         _row(GLUE9, [75.4, 74.9, 66.5, 84.8, 87.6, 19.5, 77.1, 83.2, 62.6, 70.2])),
    Cell("bert_small", "BERT-Small", "table1_bert_small.cfg",
         _row(GLUE9, [77.6, 77.0, 68.1, 86.4, 89.7, 27.8, 77.0, 83.4, 61.8, 72.1]),
         "fine-tunes the pre-trained 4 x 512 checkpoint given as --bert_small_model",
         model_flag="bert_small_model"),
    Cell("bert4_pkd", "BERT4-PKD", "table1_bert4_pkd.cfg",
         _row(GLUE9, [79.9, 79.3, 70.2, 85.1, 89.4, 24.8, 79.8, 82.6, 62.3, 72.6])),
    Cell("distilbert4", "DistilBERT4", "table1_distilbert4.cfg",
         _row(GLUE9, [78.9, 78.0, 68.5, 85.2, 91.4, 32.8, 76.1, 82.4, 54.1, 71.9])),
    Cell("tinybert4", "TinyBERT4", "tinybert4.cfg",
         _row(GLUE9, [82.5, 81.8, 71.3, 87.7, 92.6, 44.1, 80.4, 86.4, 66.6, 77.0])),
    Cell("bert6_pkd", "BERT6-PKD", "table1_bert6_pkd.cfg",
         _row(GLUE9, [81.5, 81.0, 70.7, 89.0, 92.0, None, None, 85.0, 65.5, None])),
    Cell("pd", "PD (6 layers)", "table1_pd.cfg",
         _row(GLUE9, [82.8, 82.2, 70.4, 88.9, 91.8, None, None, 86.8, 65.3, None])),
    Cell("distilbert6", "DistilBERT6", "table1_distilbert6.cfg",
         _row(GLUE9, [82.6, 81.3, 70.1, 88.9, 92.5, 49.0, 81.3, 86.9, 58.4, 76.8])),
    Cell("tinybert6", "TinyBERT6", "tinybert6.cfg",
         _row(GLUE9, [84.6, 83.2, 71.6, 90.4, 93.1, 51.1, 83.7, 87.3, 70.0, 79.4])),
), "MobileBERT-TINY (24 layers, task-agnostic) is not reproduced: no recipe here.")

# --- Tables 2-4: ablations on dev -----------------------------------------------------

TABLE2 = PaperTable(2, "learning procedure: w/o GD, TD, DA", "dev", ABLATION, (
    Cell("tinybert4", "TinyBERT4", "tinybert4.cfg", _row(ABLATION, [82.8, 82.9, 85.8, 50.8, 75.6])),
    Cell("no_gd", "w/o GD", "table2_no_gd.cfg", _row(ABLATION, [82.5, 82.6, 84.1, 40.8, 72.5])),
    Cell("no_td", "w/o TD", "table2_no_td.cfg", _row(ABLATION, [80.6, 81.2, 83.8, 28.5, 68.5])),
    Cell("no_da", "w/o DA", "table2_no_da.cfg", _row(ABLATION, [80.5, 81.0, 82.4, 29.8, 68.4])),
))

TABLE3 = PaperTable(3, "distillation objectives", "dev", ABLATION, (
    Cell("tinybert4", "TinyBERT4", "tinybert4.cfg", _row(ABLATION, [82.8, 82.9, 85.8, 50.8, 75.6])),
    Cell("no_embd", "w/o Embd", "table3_no_embd.cfg",
         _row(ABLATION, [82.3, 82.3, 85.0, 46.7, 74.1])),
    Cell("no_pred", "w/o Pred", "table3_no_pred.cfg",
         _row(ABLATION, [80.5, 81.0, 84.3, 48.2, 73.5])),
    Cell("no_trm", "w/o Trm", "table3_no_trm.cfg", _row(ABLATION, [71.7, 72.3, 70.1, 11.2, 56.3])),
    Cell("no_attn", "w/o Attn", "table3_no_attn.cfg",
         _row(ABLATION, [79.9, 80.7, 82.3, 41.1, 71.0])),
    Cell("no_hidn", "w/o Hidn", "table3_no_hidn.cfg",
         _row(ABLATION, [81.7, 82.1, 84.1, 43.7, 72.9])),
))

TABLE4 = PaperTable(4, "layer mapping strategies", "dev", ABLATION, (
    Cell("uniform", "Uniform", "table4_uniform.cfg",
         _row(ABLATION, [82.8, 82.9, 85.8, 50.8, 75.6])),
    Cell("top", "Top", "table4_top.cfg", _row(ABLATION, [81.7, 82.3, 83.6, 35.9, 70.9])),
    Cell("bottom", "Bottom", "table4_bottom.cfg", _row(ABLATION, [80.6, 81.3, 84.6, 38.5, 71.3])),
))

# --- Table 5: TinyBERT6 against 6-layer baselines on GLUE dev (Appendix A) ------------

DEV9 = (_col("CoLA", "cola", "mcc"), MNLI_M, MNLI_MM, _col("MRPC F1", "mrpc", "f1"),
        _col("MRPC Acc", "mrpc", "accuracy"), QNLI, _col("QQP F1", "qqp", "f1"),
        _col("QQP Acc", "qqp", "accuracy"), _col("RTE", "rte", "accuracy"), SST2,
        _col("STS-B Pearson", "sts-b", "pearson"), _col("STS-B Spearman", "sts-b", "spearman"))


def _dev9(cola, m, mm, mrpc_f1, mrpc_acc, qnli, qqp_f1, qqp_acc, rte, sst2, pear, spea):
    values = [cola, m, mm, mrpc_f1, mrpc_acc, qnli, qqp_f1, qqp_acc, rte, sst2, pear, spea]
    return {c.header: v for c, v in zip(DEV9, values)}


TABLE5 = PaperTable(5, "TinyBERT6 against 6-layer baselines", "dev", DEV9, (
    Cell("distilbert6", "DistilBERT6", "table1_distilbert6.cfg",
         _dev9(51.3, 82.2, None, 87.5, None, 89.2, None, 88.5, 59.9, 92.7, None, 86.9)),
    Cell("tinybert6", "TinyBERT6", "tinybert6.cfg",
         _dev9(54.0, 84.5, 84.5, 90.6, 86.3, 91.1, 88.0, 91.1, 73.4, 93.0, 90.1, 89.6)),
), "Poor Man's BERT6, BERT-of-Theseus and MiniLM6 rows (reported by their papers) have no "
   "recipe here.")

# --- Table 6: SQuAD dev (Appendix B) --------------------------------------------------

SQUAD = (_col("SQuAD1.1 EM", "squad1.1", "exact_match", 1.0),
         _col("SQuAD1.1 F1", "squad1.1", "f1", 1.0),
         _col("SQuAD2.0 EM", "squad2.0", "exact_match", 1.0),
         _col("SQuAD2.0 F1", "squad2.0", "f1", 1.0))


def _squad(em1, f11, em2, f12):
    return {c.header: v for c, v in zip(SQUAD, (em1, f11, em2, f12))}


TABLE6 = PaperTable(6, "question answering", "dev", SQUAD, (
    Cell("teacher", "BERT-base (teacher)", None, _squad(80.7, 88.4, 74.5, 77.7)),
    Cell("bert4_pkd", "BERT4-PKD", "table1_bert4_pkd.cfg", _squad(70.1, 79.5, 60.8, 64.6)),
    Cell("distilbert4", "DistilBERT4", "table1_distilbert4.cfg", _squad(71.8, 81.2, 60.6, 64.1)),
    Cell("tinybert4", "TinyBERT4", "tinybert4.cfg", _squad(72.7, 82.1, 68.2, 71.8)),
    Cell("bert6_pkd", "BERT6-PKD", "table1_bert6_pkd.cfg", _squad(77.1, 85.3, 66.3, 69.8)),
    Cell("distilbert6", "DistilBERT6", "table1_distilbert6.cfg", _squad(78.1, 86.2, 66.0, 69.5)),
    Cell("tinybert6", "TinyBERT6", "tinybert6.cfg", _squad(79.7, 87.5, 74.7, 77.7)),
), "MiniLM4/MiniLM6 rows have no recipe here. SQuAD's prediction layer is distilled on "
   "the original training set (Appendix B).")

# --- Table 7: initialising TinyBERT with BERT-Tiny (Appendix C) -----------------------

TABLE7 = PaperTable(7, "pre-training-stage methods (TD without data augmentation)", "dev",
                    ABLATION, (
    Cell("bert_tiny", "BERT-Tiny", "table1_bert_tiny.cfg",
         _row(ABLATION, [75.9, 76.9, 83.2, 19.5, 63.9])),
    Cell("bert_tiny_td", "BERT-Tiny (+TD)", "table7_bert_tiny_td.cfg",
         _row(ABLATION, [79.2, 79.7, 82.9, 12.4, 63.6])),
    Cell("tinybert_gd", "TinyBERT (GD)", "table7_tinybert_gd.cfg",
         _row(ABLATION, [76.6, 77.2, 82.0, 8.7, 61.1])),
    Cell("tinybert_gd_td", "TinyBERT (GD+TD)", "table2_no_da.cfg",
         _row(ABLATION, [80.5, 81.0, 82.4, 29.8, 68.4])),
))

TABLES = {t.number: t for t in (TABLE1, TABLE2, TABLE3, TABLE4, TABLE5, TABLE6, TABLE7)}

# The paper's per-task settings (Sec. 4.2 footnotes; Appendix B for SQuAD).
_SQUAD_FLAGS = ("--max_seq_len=384", "--doc_stride=128", "--max_query_len=64",
                "--n_best_size=20", "--max_answer_len=30", "--teacher_lr=3e-5",
                "--teacher_epochs=2", "--intermediate_epochs=10", "--num_aug=10")
TASK_FLAGS: dict[str, tuple[str, ...]] = {
    "mnli": ("--intermediate_epochs=10",), "qqp": ("--intermediate_epochs=10",),
    "qnli": ("--intermediate_epochs=10",), "cola": ("--intermediate_epochs=50",),
    "squad1.1": _SQUAD_FLAGS, "squad2.0": _SQUAD_FLAGS,
}
# GLUE task -> its folder in the GLUE download (--glue_dir); SQuAD -> its files (--squad_dir).
GLUE_FOLDERS = {"cola": "CoLA", "sst-2": "SST-2", "mrpc": "MRPC", "sts-b": "STS-B",
                "qqp": "QQP", "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
SQUAD_FILES = {"squad1.1": ("train-v1.1.json", "dev-v1.1.json"),
               "squad2.0": ("train-v2.0.json", "dev-v2.0.json")}


def get_table(number: int) -> PaperTable:
    if number not in TABLES:
        raise ValueError(f"--table={number}: the paper has Tables 1-7; use one of "
                         f"{', '.join(map(str, sorted(TABLES)))}.")
    return TABLES[number]
