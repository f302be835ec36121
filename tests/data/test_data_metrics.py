"""NumPy GLUE metrics against scikit-learn / SciPy (test-only dependencies)."""
import numpy as np
import pytest
import scipy.stats
from sklearn import metrics as skm

from tinybert_tf.data import glue
from tinybert_tf.data import metrics as M
from tinybert_tf.tasks import task_type


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classification_metrics_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 200)
    p = np.where(rng.random(200) < 0.7, y, 1 - y)
    assert M.accuracy(p, y) == pytest.approx(skm.accuracy_score(y, p))
    assert M.f1(p, y) == pytest.approx(skm.f1_score(y, p))
    assert M.matthews_corrcoef(p, y) == pytest.approx(skm.matthews_corrcoef(y, p))


def test_multiclass_mcc_and_degenerate_cases():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 300)
    p = np.where(rng.random(300) < 0.5, y, rng.integers(0, 3, 300))
    assert M.matthews_corrcoef(p, y) == pytest.approx(skm.matthews_corrcoef(y, p))
    # Constant predictions: sklearn defines MCC = 0; F1 with no positives = 0.
    assert M.matthews_corrcoef(np.zeros(10), np.r_[np.zeros(5), np.ones(5)]) == 0.0
    assert M.f1(np.zeros(4), np.zeros(4)) == 0.0
    assert M.matthews_corrcoef([1, 0, 1], [1, 0, 1]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="differ in length"):
        M.accuracy([1, 0], [1])


def test_correlations_match_scipy_with_ties():
    rng = np.random.default_rng(4)
    y = np.round(rng.random(150) * 5, 1)  # many ties, as in STS-B scores
    p = y + rng.normal(0, 1.0, 150)
    p[:20] = 2.0  # ties in predictions too
    assert M.pearson(p, y) == pytest.approx(scipy.stats.pearsonr(p, y)[0])
    assert M.spearman(p, y) == pytest.approx(scipy.stats.spearmanr(p, y)[0])
    # Undefined (SciPy: NaN), never a score such as 0.0: a constant series, one example.
    assert np.isnan(M.pearson(np.ones(5), np.arange(5)))
    assert np.isnan(scipy.stats.pearsonr(np.ones(5), np.arange(5))[0])
    assert np.isnan(M.pearson([2.5], [3.0])) and np.isnan(M.spearman([2.5], [3.0]))
    assert not M.is_defined(M.spearman(np.arange(4), np.ones(4)))
    assert M.is_defined(M.pearson(p, y))


def test_each_glue_task_scores_with_its_own_metrics():
    y = np.array([0, 1, 1, 0, 1, 1])
    p = np.array([0, 1, 0, 0, 1, 0])
    mrpc = task_type("MRPC").score_labels(p, y)
    assert set(mrpc) == {"accuracy", "f1", "accuracy_f1_mean"}
    assert mrpc["f1"] == pytest.approx(skm.f1_score(y, p))
    assert mrpc["accuracy_f1_mean"] == pytest.approx((mrpc["accuracy"] + mrpc["f1"]) / 2)
    assert task_type("cola").score_labels(p, y) == {"mcc": pytest.approx(skm.matthews_corrcoef(y, p))}  # noqa: E501
    assert task_type("mnli").score_labels([2, 1, 0], [2, 1, 1]) == {"accuracy": pytest.approx(2 / 3)}  # noqa: E501
    logits = np.array([[0.1, 0.9], [2.0, -1.0]])
    assert task_type("sst2").score_labels(logits, [1, 1])["accuracy"] == 0.5
    s = task_type("STS-B").score_labels([1.0, 2.0, 3.5, 0.2], [1.2, 2.5, 3.0, 0.0])
    assert s["pearson_spearman_mean"] == pytest.approx((s["pearson"] + s["spearman"]) / 2)
    assert s["spearman"] == pytest.approx(1.0)
    for name in glue.task_names():
        spec = glue.get_task(name)
        assert spec.primary_metric in spec.metric_names
    with pytest.raises(ValueError, match="None"):
        task_type("sst-2").score_labels([1, 0], np.array([1, None], dtype=object))
