"""Every path goes through tf.io.gfile: the whole pipeline runs with the corpus, the
task data and --output_dir on TensorFlow's in-memory file system (ram://, standing
in for gs://), model folders and augmentation resume there, and a path that cannot
be reached is one error naming it."""
from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

from tinybert_tf import files
from tinybert_tf.augment import augment_task
from tinybert_tf.data import glue
from tinybert_tf.export.saved_model import export_saved_model
from tinybert_tf.export.serving import list_versions, publish_version, replay_warmup
from tinybert_tf.models.checkpoint import load_model, load_tokenizer, save_model
from tinybert_tf.models.hf_io import export_hf

from augment_helpers import tiny_mlm, tiny_vectors
from pipeline_helpers import run, tiny_flags, write_teacher


def _upload(local: str, remote: str) -> str:
    """A local file or folder copied to `remote` (ram://...)."""
    if os.path.isdir(local):
        files.makedirs(remote)
        for name in os.listdir(local):
            _upload(os.path.join(local, name), f"{remote}/{name}")
    else:
        tf.io.gfile.copy(local, remote, overwrite=True)
    return remote


def _ram(name: str) -> str:
    """A fresh ram:// folder (the in-memory file system lives as long as the process)."""
    return f"ram://{name}-{uuid.uuid4().hex[:8]}"


def test_whole_pipeline_with_corpus_task_data_and_output_on_ram(tmp_path, tiny_vocab):
    # Every stage writes there; one task phase and one teacher epoch are enough for that.
    ns = tiny_flags(tmp_path, tiny_vocab, export_formats=["float32"],
                    task_phases=["prediction"], teacher_epochs=1)
    root = _ram("e2e")
    ns.data_dir = _upload(ns.data_dir, f"{root}/task")
    ns.corpus = _upload(ns.corpus, f"{root}/corpus.txt")
    ns.output_dir = f"{root}/out"
    results = run(ns)
    assert set(results) == {"general", "finetune_teacher", "augment", "task", "evaluate",
                            "export"}
    out = ns.output_dir
    for path in ("report.json", "loss_curves.png", "augment/train_aug.tsv",
                 "general/model/config.json", "task/model/model.safetensors",
                 "task/prediction/history.jsonl", "task/prediction/teacher_cache/cache.json",
                 "export/model_float32.tflite", "export/parity.json"):
        assert files.isfile(f"{out}/{path}"), path
    # A done stage's training checkpoints are deleted, on a remote file system too.
    assert not files.glob(f"{out}/*/*/ckpt/ckpt-*") and not files.glob(f"{out}/*/*/ckpt")
    assert files.read_json(f"{out}/report.json")["student"]["params"] > 0
    assert load_model(f"{out}/task/model").num_labels == 2
    assert not os.path.exists("ram:"), "a remote path was used as a local one"

    # The same command again resumes: every stage is done already (its record comes back).
    again = run(ns)
    assert {s: again[s]["seconds"] for s in again} == {s: results[s]["seconds"]
                                                       for s in results}


def test_unreachable_remote_corpus_is_one_error_naming_it(tmp_path, tiny_vocab):
    corpus = "hdfs://namenode.invalid:8020/corpus/wiki.txt"
    ns = tiny_flags(tmp_path, tiny_vocab, corpus=corpus, stages=["general"])
    with pytest.raises(ValueError, match="hdfs://namenode.invalid:8020/corpus/wiki.txt") as e:
        run(ns)
    assert "Traceback" not in str(e.value)


def test_serving_versions_are_published_to_a_remote_folder_only_once_whole(
        tiny_vocab, tmp_path, monkeypatch):
    """On an object store a version cannot appear by one folder rename: it is uploaded to
    a hidden folder, then moved into N/ with saved_model.pb (the SavedModel marker TF
    Serving loads) last; a failed move leaves no version."""
    model = load_model(write_teacher(str(tmp_path / "t"), tiny_vocab, head="classifier",
                                     label_names=["neg", "pos"]))
    root = f"{_ram('serving')}/tinybert"
    moved, real = [], files.rename
    fail_after = {"n": None}

    def rename(src, dst, overwrite=True):
        if dst.startswith(f"{root}/"):
            assert ".publish-" in src  # only whole uploads move in, from the hidden folder
            version = dst[len(root) + 1:].split("/")[0]
            assert not files.exists(f"{root}/{version}/saved_model.pb"), dst  # last of all
            if fail_after["n"] is not None and len(moved) == fail_after["n"]:
                raise files.FileAccessError(f"{dst}: cannot rename (network lost)")
            moved.append(dst)
        real(src, dst, overwrite)
    monkeypatch.setattr(files, "rename", rename)

    def publish():
        return publish_version(lambda d: export_saved_model(model, d, 16), root,
                               warmup_texts=["a good film", "an awful plot"],
                               tokenizer=load_tokenizer(model, 16))
    assert publish() == (1, f"{root}/1")
    assert moved[-1] == f"{root}/1/saved_model.pb" and len(moved) > 3
    assert sorted(n.rstrip("/") for n in tf.io.gfile.listdir(root)) == ["1"]  # no staging
    replayed = replay_warmup(f"{root}/1")  # TF Serving's load and warm-up, from ram://
    assert len(replayed) == 4 and replayed[0].outputs["probabilities"].shape == (1, 2)
    fail_after["n"] = len(moved) + 2
    with pytest.raises(files.FileAccessError, match="network lost"):
        publish()
    assert list_versions(root) == {1: "1"}
    assert sorted(n.rstrip("/") for n in tf.io.gfile.listdir(root)) == ["1"]


def test_model_folders_save_load_and_export_on_ram(tiny_vocab, tmp_path):
    model = load_model(write_teacher(str(tmp_path / "t"), tiny_vocab, head="classifier"))
    root = _ram("models")
    saved = save_model(model, f"{root}/ours")
    assert saved == f"{root}/ours" and files.isfile(f"{root}/ours/config.json")
    again = load_model(f"{root}/ours")
    for (k, a), b in zip(model.weight_dict().items(), again.weight_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    # Saving over an existing remote model replaces it whole.
    save_model(model, f"{root}/ours", metadata={"round": 2})
    assert load_model(f"{root}/ours").metadata["round"] == 2
    hf = export_hf(model, f"{root}/hf")
    assert load_model(hf).num_labels == model.num_labels


def test_augmentation_resumes_on_ram_and_writes_the_local_bytes(tmp_path):
    task = tmp_path / "sst"
    task.mkdir()
    glue.write_rows(str(task / "train.tsv"), ["sentence", "label"],
                    [[s, str(i % 2)] for i, s in enumerate(
                        ["a good movie", "the cat sat on the mat", "a dull plot", "great fun",
                         "the actor was awful", "a smart film", "very boring story"])])
    model, kv = tiny_mlm(), tiny_vectors()
    args = dict(mlm_model=model, word_vectors=kv, num_aug=3, replace_prob=0.5,
                num_candidates=3, seed=5, progress=False, chunk_size=2)
    local = str(tmp_path / "aug" / "train_aug.tsv")
    augment_task("sst-2", str(task), local, **args)
    remote = f"{_ram('aug')}/train_aug.tsv"
    first = augment_task("sst-2", str(task), remote, stop_after_chunks=2, **args)
    assert not first["complete"] and files.isdir(remote + ".parts")
    second = augment_task("sst-2", str(task), remote, **args)
    assert second["complete"] and second["resumed_chunks"] == 2
    assert not files.exists(remote + ".parts") and not files.exists(remote + ".progress.json")
    with open(local, "rb") as f:
        assert files.read_bytes(remote) == f.read()
