"""The baselines' loss terms and data against independent NumPy formulas: Patient KD's
patient loss and objective (Sun et al. 2019, as its code computes them), BERT's
next-sentence pairs (50% random B from another document, truncate_seq_pair) and
next-sentence loss, and masking of the mlm recipe by BERT's 80/10/10 rule."""
import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf.config import BertConfig
from tinybert_tf.data import corpus, pretrain
from tinybert_tf.distill import Distiller, NextSentenceTerm, PatientTerm, pkd_phase_terms
from tinybert_tf.models import BertModel
from tinybert_tf.tasks import Classification, Regression
from tinybert_tf.tokenizer import Tokenizer

from pipeline_helpers import write_corpus


def _models(vocab, s_hidden=16, t_hidden=24, s_layers=3, t_layers=4, head=None, labels=2):
    base = BertConfig(vocab_size=len(vocab), hidden_size=s_hidden, num_layers=s_layers,
                      num_heads=2, intermediate_size=32, max_position_embeddings=32,
                      hidden_dropout=0.0, attention_dropout=0.0)
    kw = {"head": head, "num_labels": labels} if head else {}
    student = BertModel(base, vocab=vocab, **kw)
    teacher = BertModel(base.replace(hidden_size=t_hidden, num_layers=t_layers,
                                     intermediate_size=48), vocab=vocab, **kw)
    return student, teacher


def _batch(B=4, L=7, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(20, 60, size=(B, L)).astype(np.int32)
    mask = np.ones((B, L), np.int32)
    mask[1, 5:] = 0
    return {"input_word_ids": tf.constant(ids), "input_mask": tf.constant(mask),
            "input_type_ids": tf.zeros([B, L], tf.int32)}


def _unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@pytest.fixture(scope="module")
def pair(tiny_vocab):
    return _models(tiny_vocab)  # 3-layer student 16 wide, 4-layer teacher 24 wide


def test_patient_loss_is_the_pkd_codes_mse_of_unit_cls_states(pair):
    student, teacher = pair  # uniform g(m) for M=3, N=4: 1, 3, (4)
    term = PatientTerm(layer_mapping="uniform", weight=500.0)
    distiller = Distiller(student=student, teacher=teacher, terms=[term])
    batch = _batch()
    loss = float(distiller.compute_losses(batch)["pkd"])
    s_out, t_out = student(batch), teacher(batch)
    W = distiller.projections.hidden_projections[0]  # one shared W_h (widths differ)
    s = np.stack([np.asarray(W(s_out["hidden_states"][m]))[:, 0] for m in (1, 2)], 1)
    t = np.stack([np.asarray(t_out["hidden_states"][g])[:, 0] for g in (1, 3)], 1)
    # PKD's patience_loss: F.mse_loss(normalize(t, dim=2), normalize(s, dim=2)), times beta.
    expect = 500.0 * np.mean((_unit(s) - _unit(t)) ** 2)
    assert loss == pytest.approx(expect, rel=1e-5)
    assert term.get_config()["layer_mapping"] == [1, 3]


def test_patient_loss_needs_no_projection_at_equal_width_and_two_layers(tiny_vocab):
    student, teacher = _models(tiny_vocab, s_hidden=16, t_hidden=16, s_layers=1)
    with pytest.raises(ValueError, match="1-layer student"):
        Distiller(student=student, teacher=teacher, terms=[PatientTerm()])
    student, teacher = _models(tiny_vocab, s_hidden=16, t_hidden=16, s_layers=2, t_layers=4)
    distiller = Distiller(student=student, teacher=teacher, terms=[PatientTerm(weight=1.0)])
    assert distiller.projections is None
    batch = _batch()
    s = np.asarray(student(batch)["hidden_states"][1])[:, 0]
    t = np.asarray(teacher(batch)["hidden_states"][2])[:, 0]
    assert float(distiller.compute_losses(batch)["pkd"]) == pytest.approx(
        np.mean((_unit(s) - _unit(t)) ** 2), rel=1e-5)


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_pkd_objective_matches_the_pkd_code(tiny_vocab):
    """(1 - a) CE(y) + a T^2 KLDivLoss(mean over B x C) + b L_PT, the PKD code's
    distillation_loss + patience_loss, in values of the loss (KL = our soft CE minus
    the teacher's entropy, a constant)."""
    task = Classification(["neg", "mid", "pos"])
    student, teacher = _models(tiny_vocab, head="classifier", labels=3)
    a, b, T = 0.7, 500.0, 10.0
    terms = pkd_phase_terms(task, alpha=a, beta=b, temperature=T, layer_mapping="uniform")
    assert [t.name for t in terms] == ["hard", "pred", "pkd"]
    distiller = Distiller(student=student, teacher=teacher, terms=terms)
    batch = _batch()
    labels = np.array([0, 2, 1, 2])
    losses = {k: float(v) for k, v in
              distiller.compute_losses((batch, tf.constant(labels))).items()}
    zs = np.asarray(student(batch)["logits"], np.float64)
    zt = np.asarray(teacher(batch)["logits"], np.float64)
    ce = -np.mean(_log_softmax(zs)[np.arange(4), labels])
    p_t = np.exp(_log_softmax(zt / T))
    kl_mean = np.mean(p_t * (np.log(p_t) - _log_softmax(zs / T)))  # KLDivLoss 'mean'
    entropy_mean = np.mean(p_t * np.log(p_t))  # what KL adds to the soft cross-entropy
    assert losses["hard"] == pytest.approx((1 - a) * ce, rel=1e-4)
    # ours = the PKD code's a T^2 KL with the teacher's (constant) entropy added back
    assert losses["pred"] == pytest.approx(a * T * T * (kl_mean - entropy_mean), rel=1e-5)
    # A regression task has no temperature: alpha weighs the MSE to the teacher's score.
    reg = pkd_phase_terms(Regression(), alpha=0.5, beta=10.0, temperature=10.0)
    assert [(t.name, t.weight) for t in reg] == [("hard", 0.5), ("pred", 0.5), ("pkd", 10.0)]
    with pytest.raises(ValueError, match="--pkd_alpha"):
        pkd_phase_terms(task, alpha=1.5, beta=1.0, temperature=1.0)


def test_truncated_pair_lengths_follow_bert_truncate_seq_pair():
    def bert(a, b, m):  # create_pretraining_data.truncate_seq_pair, lengths only
        while a + b > m:
            if a > b:
                a -= 1
            else:
                b -= 1
        return a, b

    cases = [(a, b, m) for m in (5, 8, 13) for a in range(0, 16) for b in range(0, 16)]
    for m in (5, 8, 13):
        idx = [i for i, c in enumerate(cases) if c[2] == m]
        a, b = pretrain.truncated_pair_lengths(tf.constant([cases[i][0] for i in idx]),
                                               tf.constant([cases[i][1] for i in idx]), m)
        assert list(zip(a.numpy(), b.numpy())) == [bert(*cases[i]) for i in idx]


def _rows(ids, mask, types):
    """(A tokens, B tokens) of packed rows."""
    out = []
    for r, m, t in zip(ids, mask, types):
        n = int(m.sum())
        a = [int(x) for x, tt in zip(r[1:n], t[1:n]) if tt == 0][:-1]
        b = [int(x) for x, tt in zip(r[:n], t[:n]) if tt == 1][:-1]
        out.append((a, b))
    return out


def test_next_sentence_pairs_half_random_from_another_document(tiny_vocab):
    tok = Tokenizer(tiny_vocab, max_seq_len=24)
    rng = np.random.default_rng(3)
    B, L = 512, 24
    docs = rng.integers(0, 40, size=B)  # 40 documents in the batch
    ids = np.zeros((B, L), np.int32)
    mask = np.zeros((B, L), np.int32)
    types = np.zeros((B, L), np.int32)
    for i in range(B):
        a = rng.integers(40, 60, size=int(rng.integers(1, 12)))
        b = rng.integers(60, 80, size=int(rng.integers(0, 9)) if i % 4 else 0)  # 1/4 no B
        row = [tok.cls_id, *a, tok.sep_id] + ([*b, tok.sep_id] if len(b) else [])
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
        types[i, len(a) + 2:len(row)] = 1
    batch = {"input_word_ids": tf.constant(ids), "input_mask": tf.constant(mask),
             "input_type_ids": tf.constant(types),
             pretrain.DOCUMENT_KEY: tf.constant(docs, tf.int64)}
    out = pretrain.next_sentence_pairs(batch, tf.constant([9, 1], tf.int64), tok.cls_id,
                                       tok.sep_id, tok.pad_id)
    assert pretrain.DOCUMENT_KEY not in out
    labels = out["next_sentence_labels"].numpy()
    new = _rows(out["input_word_ids"].numpy(), out["input_mask"].numpy(),
                out["input_type_ids"].numpy())
    old = _rows(ids, mask, types)
    has_b = np.array([len(b) > 0 for _, b in old])
    assert labels[~has_b].all()  # a one-segment row always gets a random B (as BERT)
    frac = labels[has_b].mean()  # the others: a fair coin (384 rows: 4 sigma ~ 0.1)
    assert abs(frac - 0.5) < 0.1
    texts = {i: a + b for i, (a, b) in enumerate(old)}
    for i, ((a, b), (a0, b0)) in enumerate(zip(new, old)):
        if not labels[i]:
            assert (a, b) == (a0, b0)  # the real continuation, untouched
            continue
        assert len(a) + len(b) <= L - 3 and len(b) >= 1
        assert a == a0[:len(a)]  # A cut from the back only
        sources = [j for j in texts if docs[j] != docs[i] and texts[j][:len(b)] == b]
        assert sources, f"row {i}: B is not the start of another document's row"
        exp_a, exp_b = pretrain.truncated_pair_lengths(
            tf.constant([len(a0)] * len(sources)),
            tf.constant([len(texts[j]) for j in sources]), L - 3)
        assert (len(a), len(b)) in set(zip(exp_a.numpy().tolist(), exp_b.numpy().tolist()))
        row = out["input_word_ids"].numpy()[i]
        assert row[0] == tok.cls_id and row[len(a) + 1] == tok.sep_id
        assert row[len(a) + len(b) + 2] == tok.sep_id


def test_mlm_recipe_input_masks_by_berts_rule_after_pairing(tiny_vocab, tmp_path):
    tok = Tokenizer(tiny_vocab, max_seq_len=32)
    path = write_corpus(str(tmp_path / "c.txt"), docs=30)
    ds = corpus.general_dataset(path, tok, 24, batch_size=16, seed=4, next_sentence=True,
                                masking=True, max_predictions=4, drop_remainder=True)
    n_real, chosen, labels = [], [], []
    for batch in ds:
        n_real.extend(batch["input_mask"].numpy().sum(1))
        chosen.extend(batch["masked_lm_weights"].numpy().sum(1))
        labels.extend(batch["next_sentence_labels"].numpy())
    # BERT: min(max_predictions, max(1, round(15% of the tokens, [CLS]/[SEP] included))).
    expect = np.minimum(np.maximum(np.round(np.array(n_real) * 0.15), 1), 4)
    np.testing.assert_array_equal(chosen, expect)
    assert 0 < np.mean(labels) < 1
    with pytest.raises(Exception, match="TFRecord"):
        corpus.general_dataset(str(tmp_path / "x.tfrecord"), tok, 24, next_sentence=True)


def test_next_sentence_loss_is_cross_entropy_of_a_term_owned_classifier(pair, tiny_vocab):
    student, _ = pair
    term = NextSentenceTerm()
    distiller = Distiller(student=student, teacher=None, terms=[term])
    assert len(distiller.term_variables) == 2  # kernel [H, 2], bias [2]
    assert set(map(id, distiller.term_variables)) <= set(map(id, distiller.trainable_variables))
    assert "terms" in distiller.checkpoint_items()
    batch = dict(_batch(), next_sentence_labels=tf.constant([0, 1, 1, 0]))
    loss = float(distiller.compute_losses(batch)["nsp"])
    pooled = np.asarray(student(_batch())["pooled_output"], np.float64)
    kernel, bias = (np.asarray(v, np.float64) for v in term.classifier.weights)
    logp = _log_softmax(pooled @ kernel + bias)
    assert loss == pytest.approx(-np.mean(logp[np.arange(4), [0, 1, 1, 0]]), rel=1e-5)
    with pytest.raises(ValueError, match="no pooler"):
        Distiller(student=BertModel(student.bert_config.replace(use_pooler=False),
                                    vocab=tiny_vocab), terms=[NextSentenceTerm()])
