"""TF Serving layout: version folders, warm-up records, models.config, the gRPC client.

One tiny classifier (hidden 32, 2 layers, random weights) is exported once per
module at seq 16 with `export_saved_model`; every test publishes copies of it.
The warm-up records are replayed in a fresh Python process that loads the
version folder the way TF Serving does, and compared with the Keras model.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent import futures

import grpc
import keras
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from tinybert_tf.export import ExportRequest, export_all
from tinybert_tf.export.common import ExportError
from tinybert_tf.export.saved_model import export_saved_model
from tinybert_tf.export.serving import (
    MAX_WARMUP_RECORDS,
    WARMUP_DIR,
    WARMUP_FILE,
    build_warmup_requests,
    list_versions,
    predict_request,
    publish_version,
    read_warmup_requests,
    run_request,
    write_models_config,
    write_warmup_requests,
)
from tinybert_tf.models import INPUT_NAMES, BertModel
from tinybert_tf.models.checkpoint import load_tokenizer

from numerics import assert_labels_are_argmax
from pipeline_helpers import SERVER_SCRIPT_HEAD, load_script

# Served outputs are compared with Keras's (make test-isa).
pytestmark = pytest.mark.numerics

L = 16
LABELS = ["neg", "pos"]
TEXTS = ["a good fun film", "the plot was awful", "Café, un-affable actors!", "the cat sat"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_classifier(vocab, config, seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    return BertModel(config.replace(vocab_size=len(vocab)), head="classifier", num_labels=2,
                     vocab=vocab, **kwargs)


@pytest.fixture(scope="module")
def vocab(tiny_vocab):
    return list(dict.fromkeys(tiny_vocab))  # conftest's TINY_VOCAB repeats a few tokens


@pytest.fixture(scope="module")
def exported(tmp_path_factory, vocab, tiny_config):
    model = tiny_classifier(vocab, tiny_config, label_names=LABELS)
    path = export_saved_model(model, str(tmp_path_factory.mktemp("export") / "sm"), L)
    return model, path


@pytest.fixture(scope="module")
def published(tmp_path_factory, exported):
    """Version 1 published from a writer, with warm-up records from TEXTS."""
    model, _ = exported
    root = str(tmp_path_factory.mktemp("serving") / "tinybert")
    version, path = publish_version(lambda d: export_saved_model(model, d, L), root,
                                    warmup_texts=TEXTS, tokenizer=load_tokenizer(model, L))
    return root, version, path


def keras_outputs(model, inputs):
    logits = model({k: tf.constant(v) for k, v in inputs.items()}, training=False)["logits"]
    logits = logits.numpy()
    return {"logits": logits, "probabilities": tf.nn.softmax(logits, -1).numpy()}


def tree_digest(path):
    """Relative path -> sha256 of every file under `path`."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            full = os.path.join(root, f)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def load_client():
    return load_script(os.path.join(ROOT, "examples", "serving_client.py"))


def test_the_export_traces_each_serving_function_once(vocab, tiny_config, tmp_path,
                                                    monkeypatch):
    """tf.saved_model.save traces the functions its object tracks in its own save
    context; a trace made before the save would be made again there
    (benchmarks/bench_saved_model.py)."""
    from tinybert_tf.export import saved_model
    modules = []

    class Recorded(saved_model.ServingModule):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            modules.append(self)

    monkeypatch.setattr(saved_model, "ServingModule", Recorded)
    export_saved_model(tiny_classifier(vocab, tiny_config, label_names=LABELS),
                       str(tmp_path / "sm"), L)
    [module] = modules
    assert module.serve_text.experimental_get_tracing_count() == 1
    assert module.serve_ids.experimental_get_tracing_count() == 1


def test_publish_writes_version_1_atomically_with_warmup_for_every_signature(published):
    root, version, path = published
    assert version == 1 and path == os.path.join(os.path.abspath(root), "1")
    assert sorted(os.listdir(root)) == ["1"]  # no hidden staging folder left behind
    assert os.path.isfile(os.path.join(path, "saved_model.pb"))
    requests = read_warmup_requests(path)
    seen = [(r.model_spec.signature_name, tf.make_ndarray(r.inputs[next(iter(r.inputs))]).shape[0])
            for r in requests]
    assert seen == [("serve_ids", 1), ("serve_ids", 8), ("serving_default", 1),
                    ("serving_default", 8)]
    ids = [r for r in requests if r.model_spec.signature_name == "serve_ids"][1]
    assert set(ids.inputs) == set(INPUT_NAMES)
    for key in INPUT_NAMES:
        assert ids.inputs[key].dtype == tf.int32.as_datatype_enum
        assert [d.size for d in ids.inputs[key].tensor_shape.dim] == [8, L]
    text = requests[3].inputs["text"]
    assert text.dtype == tf.string.as_datatype_enum
    assert [s.decode() for s in text.string_val] == TEXTS + TEXTS  # 8 = the 4 texts, twice


# Everything this module runs in a fresh Python process that imports tensorflow-text,
# in ONE process (each start pays TensorFlow's import): the warm-up records of each
# version folder replayed as TF Serving replays them, then _REQUEST_SCRIPT's requests
# (defined below) on a pair SavedModel. A replay prints its outputs before the next
# starts, so a crash in the requests leaves the replays' results.
_REPLAY_SCRIPT = SERVER_SCRIPT_HEAD + r"""
import json, sys
from tinybert_tf.export.serving import replay_warmup
for path in json.loads(sys.argv[3]):
    out = [{k: [x.decode() for x in v] if v.dtype == object else v.tolist()
            for k, v in r.outputs.items()} for r in replay_warmup(path)]
    print("REPLAY " + json.dumps([path, out]), flush=True)
"""


def check_replay_matches_keras(model, path, replayed, labels=LABELS):
    """Every warm-up record of the version folder, replayed in a fresh process
    (`replayed`: its outputs, from the `fresh` fixture), gives the Keras model's outputs;
    returns the requests."""
    requests = read_warmup_requests(path)
    assert len(replayed) == len(requests)
    tokenizer = load_tokenizer(model, L)
    for request, out in zip(requests, replayed, strict=True):
        if request.model_spec.signature_name == "serving_default":
            texts = [s.decode() for s in request.inputs["text"].string_val]
            inputs = {k: v.numpy() for k, v in tokenizer(texts, max_seq_len=L).items()}
        else:
            inputs = {k: tf.make_ndarray(request.inputs[k]) for k in INPUT_NAMES}
        expected = keras_outputs(model, inputs)
        np.testing.assert_allclose(out["logits"], expected["logits"], atol=1e-5)
        np.testing.assert_allclose(out["probabilities"], expected["probabilities"], atol=1e-5)
        assert out["label"] == [labels[i] for i in np.argmax(out["logits"], -1)]
    return requests


def test_warmup_records_replayed_in_a_fresh_process_match_keras(published, exported, fresh):
    model, _ = exported
    _, _, path = published
    assert len(check_replay_matches_keras(model, path, fresh["replays"][path])) == 4


def test_export_all_publishes_a_version_whose_warmup_replays(exported, fresh):
    """What bin/export and the pipeline's export stage write: export/serving/<N>/
    with warm-up from the dev texts (8 at most, batch 1 and 8), and models.config."""
    model, _ = exported
    out, parity = fresh["export"], fresh["parity"]
    row = parity["formats"]["saved_model"]
    assert (row["path"], row["version"], row["models_config"]) == (
        "serving/1", 1, "serving/models.config")
    path = str(out / "serving" / "1")
    requests = check_replay_matches_keras(model, path, fresh["replays"][path])
    assert len(requests) == 4
    text = [r for r in requests if r.model_spec.signature_name == "serving_default"][1]
    assert [s.decode() for s in text.inputs["text"].string_val] == (TEXTS * 2)[:8]
    config = text_format.Parse((out / "serving" / "models.config").read_text(),
                               model_server_config_pb2.ModelServerConfig())
    (entry,) = config.model_config_list.config
    assert (entry.name, entry.base_path) == ("polarity", "/models/polarity")


# In a process that never imports tensorflow-text: load each SavedModel's graph with the
# loader TF Serving's C++ one mirrors (it imports every function of the graph), then
# call serving_default on token ids.
NO_TF_TEXT = SERVER_SCRIPT_HEAD + r"""
import json, sys
import tensorflow as tf
ids, out = json.loads(sys.argv[1]), {}
for path in sys.argv[2:]:
    try:
        with tf.compat.v1.Session(graph=tf.Graph()) as sess:
            tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
    except Exception as e:
        out[path] = {"error": str(e).splitlines()[0]}
        continue
    fn = tf.saved_model.load(path).signatures["serving_default"]
    res = fn(**{k: tf.constant(v, tf.int32) for k, v in ids.items()})
    out[path] = {"probabilities": res["probabilities"].numpy().tolist()}
assert "tensorflow_text" not in sys.modules
print("RESULT" + json.dumps(out))
"""


def test_the_ids_servable_loads_where_tensorflow_text_is_missing(tmp_path, exported, fresh):
    """A server without tensorflow-text's ops cannot load the text SavedModel at all,
    not even to call serve_ids; the saved_model_ids format can be loaded and served."""
    from tinybert_tf.export.saved_model import custom_ops
    model, text_saved_model = exported
    out, parity = fresh["export"], fresh["parity"]
    row = parity["formats"]["saved_model_ids"]
    assert (row["path"], row["version"], row["models_config"]) == (
        "serving_ids/1", 1, "serving_ids/models.config")
    assert row["max_abs_diff"] < 1e-5
    path = str(out / "serving_ids" / "1")
    assert custom_ops(path) == []
    signatures = [r.model_spec.signature_name for r in read_warmup_requests(path)]
    assert signatures == ["serve_ids", "serve_ids", "serving_default", "serving_default"]
    assert len(fresh["replays"][path]) == 4
    inputs = {k: v.numpy() for k, v in load_tokenizer(model, L)(TEXTS).items()}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", NO_TF_TEXT,
                           json.dumps({k: v.tolist() for k, v in inputs.items()}), path,
                           text_saved_model], capture_output=True, text=True, timeout=300,
                          env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")][-1]
    got = json.loads(line[len("RESULT"):])
    np.testing.assert_allclose(got[path]["probabilities"],
                               keras_outputs(model, inputs)["probabilities"], atol=1e-5)
    assert "Op type not registered 'FastBertNormalize'" in got[text_saved_model]["error"]


def test_second_publish_is_version_2_and_leaves_version_1_byte_identical(tmp_path, exported):
    _, saved_model = exported
    root = str(tmp_path / "m")
    assert publish_version(saved_model, root) == (1, os.path.join(root, "1"))
    before = tree_digest(os.path.join(root, "1"))
    mtime = os.stat(os.path.join(root, "1", "saved_model.pb")).st_mtime_ns
    version, path = publish_version(saved_model, root)
    assert (version, path) == (2, os.path.join(root, "2"))
    assert tree_digest(os.path.join(root, "1")) == before
    assert os.stat(os.path.join(root, "1", "saved_model.pb")).st_mtime_ns == mtime
    assert tree_digest(path) == tree_digest(saved_model)  # a faithful copy
    assert sorted(os.listdir(root)) == ["1", "2"]
    # An explicit version skips ahead; the next automatic one follows the highest.
    assert publish_version(saved_model, root, version=10)[0] == 10
    assert publish_version(saved_model, root)[0] == 11
    assert sorted(list_versions(root)) == [1, 2, 10, 11]


def test_models_config_parses_back_with_the_serving_protos(published, tmp_path):
    root, _, _ = published
    path = write_models_config(root, "tinybert")
    assert path == os.path.join(root, "models.config")
    config = text_format.Parse(open(path).read(), model_server_config_pb2.ModelServerConfig())
    (entry,) = config.model_config_list.config
    assert (entry.name, entry.base_path, entry.model_platform) == (
        "tinybert", os.path.abspath(root), "tensorflow")
    other = write_models_config(root, "tinybert", base_path="/models/tinybert",
                                path=str(tmp_path / "serving.config"))
    config = text_format.Parse(open(other).read(), model_server_config_pb2.ModelServerConfig())
    assert config.model_config_list.config[0].base_path == "/models/tinybert"
    assert sorted(list_versions(root)) == [1]  # the config file is not taken for a version
    with pytest.raises(ExportError, match="model_name"):
        write_models_config(root, "bad name/")
    with pytest.raises(ExportError, match="no version folder"):
        write_models_config(str(tmp_path / "empty"), "tinybert")


def test_existing_version_is_refused_naming_it_and_the_fix(tmp_path, exported):
    _, saved_model = exported
    root = tmp_path / "m"
    publish_version(saved_model, str(root))
    before = tree_digest(str(root))
    with pytest.raises(ExportError, match=r"1: version 1 already exists.*version 2"):
        publish_version(saved_model, str(root), version=1)
    (root / "007").mkdir()  # TF Serving reads this name as version 7
    with pytest.raises(ExportError, match="007: version 7 already exists"):
        publish_version(saved_model, str(root), version="7")
    (root / "007").rmdir()
    assert tree_digest(str(root)) == before and sorted(os.listdir(root)) == ["1"]


@pytest.mark.parametrize("version", ["v2", 2.0, "1.5", 0, -3, True, "", 2**63])
def test_non_integer_or_non_positive_version_is_refused(tmp_path, exported, version):
    # A number past int64 is a positive integer: its message names the limit instead.
    expected = ("version=.*too large.*int64.*2\\*\\*63 - 1" if version == 2**63
                else "version=.*positive integer")
    with pytest.raises(ExportError, match=expected):
        publish_version(exported[1], str(tmp_path / "m"), version=version)
    assert not (tmp_path / "m").exists()


def test_missing_or_broken_saved_model_is_refused(tmp_path, exported):
    with pytest.raises(ExportError, match="nope: no saved_model.pb"):
        publish_version(str(tmp_path / "nope"), str(tmp_path / "m"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "saved_model.pb").write_bytes(b"\xffnot a proto")
    with pytest.raises(ExportError, match="not a readable SavedModel"):
        publish_version(str(tmp_path / "bad"), str(tmp_path / "m"))
    with pytest.raises(ExportError, match="base folder ABOVE"):
        publish_version(exported[1], exported[1])  # a SavedModel given as the serving root
    # A remote serving root is fine (published whole, see serving.py); a remote source is
    # refused before anything is read or written.
    with pytest.raises(ExportError, match="gs://bucket/sm: publish_version copies a local "
                       "SavedModel folder"):
        publish_version("gs://bucket/sm", str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


def test_failing_writer_publishes_nothing_and_leaves_no_temporary(tmp_path, exported):
    root = tmp_path / "m"
    publish_version(exported[1], str(root))

    def boom(path):
        os.makedirs(path)
        (open(os.path.join(path, "saved_model.pb"), "wb")).close()
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        publish_version(boom, str(root))
    with pytest.raises(ExportError, match="wrote nothing"):
        publish_version(lambda path: None, str(root))
    with pytest.raises(ExportError, match="did not write a SavedModel"):
        publish_version(os.makedirs, str(root))
    with pytest.raises(ExportError, match="warmup_texts is empty"):
        publish_version(exported[1], str(root), warmup_texts=[],
                        tokenizer=load_tokenizer(exported[0], L))
    with pytest.raises(ExportError, match="tokenizer="):
        publish_version(exported[1], str(root), warmup_texts=TEXTS)
    assert sorted(os.listdir(root)) == ["1"]


def test_warmup_writer_refuses_requests_that_would_fail_the_load(tmp_path, exported):
    model, saved_model = exported
    requests = build_warmup_requests(saved_model, TEXTS[:1], load_tokenizer(model, L))
    text_only = [r for r in requests if r.model_spec.signature_name == "serving_default"]
    target = tmp_path / "v"
    shutil.copytree(saved_model, target)
    with pytest.raises(ExportError, match=r"no warm-up request for signature\(s\) \['serve_ids'\]"):
        write_warmup_requests(str(target), text_only)
    cases = [
        (predict_request("serve_text", {"text": ["a"]}), "'serve_text' is not in the SavedModel"),
        (predict_request("serving_default", {"txt": ["a"]}), r"takes inputs \['text'\]"),
        (predict_request("serving_default", {"text": np.array([1, 2])}), "wants string"),
        (predict_request("serving_default", {"text": [["a"]]}), "wants rank 1"),
        (predict_request("serve_ids", {"input_word_ids": np.ones([2, 4], np.int32),
                                       "input_mask": np.ones([2, 4], np.int32),
                                       "input_type_ids": np.ones([3, 4], np.int32)}),
         "different batch sizes"),
    ]
    for bad, message in cases:
        with pytest.raises(ExportError, match=message):
            write_warmup_requests(str(target), requests + [bad])
    with pytest.raises(ExportError, match=f"refuses more than {MAX_WARMUP_RECORDS}"):
        write_warmup_requests(str(target), requests * 300)
    assert not (target / WARMUP_DIR).exists()  # nothing written by a refused call
    path = write_warmup_requests(str(target), requests)
    assert path == str(target / WARMUP_DIR / WARMUP_FILE)
    with pytest.raises(ExportError, match="already exists; a published version is never"):
        write_warmup_requests(str(target), requests)
    assert os.listdir(target / WARMUP_DIR) == [WARMUP_FILE]


def test_pair_task_warmup_sends_text_b(tmp_path, vocab, tiny_config):
    model = tiny_classifier(vocab, tiny_config, seed=1)
    _, path = publish_version(lambda d: export_saved_model(model, d, L, is_pair=True),
                              str(tmp_path / "m"), warmup_texts=[("the cat", "a dog ran")],
                              tokenizer=load_tokenizer(model, L))
    requests = read_warmup_requests(path)
    text = [r for r in requests if r.model_spec.signature_name == "serving_default"]
    assert [sorted(r.inputs) for r in text] == [["text", "text_b"]] * 2
    assert text[1].inputs["text_b"].string_val == [b"a dog ran"] * 8
    ids = [r for r in requests if r.model_spec.signature_name == "serve_ids"]
    assert tf.make_ndarray(ids[0].inputs["input_type_ids"]).max() == 1  # two segments packed
    loaded = tf.saved_model.load(path)
    out = run_request(loaded, text[0])
    x = load_tokenizer(model, L)(["the cat"], ["a dog ran"], max_seq_len=L)
    np.testing.assert_allclose(out["logits"], model(x, training=False)["logits"].numpy(),
                               atol=1e-5)
    with pytest.raises(ExportError, match="pair task needs"):
        build_warmup_requests(path, ["just one text"], load_tokenizer(model, L))


def test_client_builds_the_raw_text_predict_request():
    client = load_client()
    request = client.build_request("tinybert", ["a good film", "café"], version=3)
    assert isinstance(request, predict_pb2.PredictRequest)
    assert request.model_spec.name == "tinybert"
    assert request.model_spec.signature_name == "serving_default"
    assert request.model_spec.version.value == 3
    assert list(request.inputs) == ["text"]
    tensor = request.inputs["text"]
    assert tensor.dtype == tf.string.as_datatype_enum
    assert [d.size for d in tensor.tensor_shape.dim] == [2]
    assert list(tensor.string_val) == [b"a good film", "café".encode()]
    pair = client.build_request("mrpc", ["a"], ["b"])
    assert sorted(pair.inputs) == ["text", "text_b"]
    with pytest.raises(ValueError, match="one --text_b per --text"):
        client.build_request("mrpc", ["a", "b"], ["c"])


class ServingStandIn(prediction_service_pb2_grpc.PredictionServiceServicer):
    """A gRPC PredictionService that runs requests on one loaded SavedModel."""

    def __init__(self, name, loaded):
        self.name, self.loaded = name, loaded

    def Predict(self, request, context):
        if request.model_spec.name != self.name:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"Servable not found for request: Latest({request.model_spec.name})")
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        for key, value in run_request(self.loaded, request).items():
            response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
        return response


def test_client_script_prints_what_the_served_model_answers(published, exported, capsys):
    model, _ = exported
    _, _, path = published
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        ServingStandIn("tinybert", tf.saved_model.load(path)), server)
    port = server.add_insecure_port("localhost:0")
    server.start()
    try:
        client = load_client()
        rc = client.main(["--host", f"localhost:{port}", "--model", "tinybert",
                          "--text", TEXTS[0], "--text", TEXTS[1]])
        out = capsys.readouterr().out
        assert rc == 0, out
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["text"] for r in rows] == TEXTS[:2]
        x = {k: v.numpy() for k, v in load_tokenizer(model, L)(TEXTS[:2], max_seq_len=L).items()}
        expected = keras_outputs(model, x)
        np.testing.assert_allclose([r["probabilities"] for r in rows],
                                   expected["probabilities"], atol=1e-5)
        assert_labels_are_argmax([LABELS.index(r["label"]) for r in rows],
                                 expected["probabilities"], err_msg="served labels")
        rc = client.main(["--host", f"localhost:{port}", "--model", "other", "--text", "a"])
        assert rc == 1
        assert "NOT_FOUND" in capsys.readouterr().err
    finally:
        server.stop(None)


# --- requests that must not crash the server ------------------------------------------

# name: (signature, inputs as the client sends them, "answers" or "refused")
BAD_REQUESTS = {
    "one string, not a batch": ("serving_default", {"text": "some text", "text_b": "other"},
                                "refused"),
    "a rank-2 batch": ("serving_default", {"text": [["a good"], ["film"]],
                                           "text_b": [["x"], ["y"]]}, "refused"),
    "text and text_b of other sizes": ("serving_default", {"text": ["a", "b"],
                                                           "text_b": ["c"]}, "refused"),
    "an empty batch": ("serving_default", {"text": [], "text_b": []}, "answers"),
    "invalid UTF-8": ("serving_default", {"text": [b"\xff\xfe good \xc3"],
                                          "text_b": [b"\x80"]}, "answers"),
    "a 1 MB text": ("serving_default", {"text": ["good " * 200_000], "text_b": ["a"]},
                    "answers"),
    "512 texts": ("serving_default", {"text": ["a good film"] * 512,
                                      "text_b": ["the plot"] * 512}, "answers"),
    "an empty string": ("serving_default", {"text": [""], "text_b": [""]}, "answers"),
    "scalar ids": ("serve_ids", {k: 0 for k in INPUT_NAMES}, "refused"),
    "ids of other shapes": ("serve_ids", {"input_word_ids": [[2, 5, 3]],
                                          "input_mask": [[1, 1]],
                                          "input_type_ids": [[0, 0, 0]]}, "refused"),
    "a sequence beyond the position table": ("serve_ids", {k: [[1] * 100] for k in INPUT_NAMES},
                                             "refused"),
    "a negative word id": ("serve_ids", {"input_word_ids": [[2, -1, 3]],
                                         "input_mask": [[1, 1, 1]],
                                         "input_type_ids": [[0, 0, 0]]}, "refused"),
    "a type id beyond the table": ("serve_ids", {"input_word_ids": [[2, 5, 3]],
                                                 "input_mask": [[1, 1, 1]],
                                                 "input_type_ids": [[0, 7, 0]]}, "refused"),
    "an empty ids batch": ("serve_ids", {k: np.zeros((0, 8), np.int32) for k in INPUT_NAMES},
                           "answers"),
}

# Runs every request the way TF Serving does: a tf.compat.v1 Session loads the SavedModel
# (tag "serve"), each request is a tensorflow-serving-api PredictRequest built with
# make_tensor_proto, fed through Session::MakeCallable (no client-side shape check, as
# the server's C++ Session::Run); then the same through the eager signatures. A case prints its name
# before it runs: a crash names the case it died in.
_REQUEST_SCRIPT = r'''
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401
from tensorflow.core.protobuf import config_pb2
from tensorflow_serving.apis import predict_pb2
path, cases = sys.argv[1], json.load(open(sys.argv[2]))
graph = tf.Graph()
with graph.as_default():
    sess = tf.compat.v1.Session(graph=graph)
    meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
loaded = tf.saved_model.load(path)


def as_bytes(value):
    if isinstance(value, list):
        return [as_bytes(v) for v in value]
    return value.encode("latin-1")


for name, (signature, inputs) in cases.items():
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature
    for key, value in inputs.items():
        if signature == "serving_default":  # JSON carried the bytes as latin-1 text
            value = as_bytes(value)
        elif isinstance(value, dict):
            value = np.zeros(value["zeros"], np.int32)
        dtype = tf.string if signature == "serving_default" else tf.int32
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value, dtype))
    sig = meta.signature_def[signature]
    keys = sorted(request.inputs)
    for path_name in ("session", "eager"):
        print("CASE", path_name, name, flush=True)
        try:
            arrays = {k: tf.make_ndarray(request.inputs[k]) for k in keys}
            if path_name == "session":
                # Session::MakeCallable, as the server's C++ runs it: no client-side check.
                options = config_pb2.CallableOptions()
                options.feed.extend(sig.inputs[k].name for k in keys)
                options.fetch.extend(sig.outputs[o].name for o in sorted(sig.outputs))
                run = sess._make_callable_from_options(options)
                shapes = [list(np.shape(o)) for o in run(*[arrays[k] for k in keys])]
            else:
                out = loaded.signatures[signature](**{k: tf.constant(v)
                                                      for k, v in arrays.items()})
                shapes = [list(out[o].shape) for o in sorted(out)]
            print("RESULT", json.dumps([path_name, name, "answers", shapes]), flush=True)
        except tf.errors.InvalidArgumentError as e:
            print("RESULT", json.dumps([path_name, name, "refused", e.message[:300]]),
                  flush=True)
'''


def test_no_request_crashes_the_served_model_through_the_session_path(fresh):
    proc = fresh["proc"]
    started = [line for line in proc.stdout.splitlines() if line.startswith("CASE")]
    assert proc.returncode == 0, f"the server process died in {started[-1:]}: " \
                                 f"{proc.stderr[-2000:]}"
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines()
               if line.startswith("RESULT")]
    assert len(results) == 2 * len(BAD_REQUESTS)
    for path_name, name, outcome, detail in results:
        assert outcome == BAD_REQUESTS[name][2], (path_name, name, detail)
        if outcome == "answers":
            n = len(BAD_REQUESTS[name][1]["input_word_ids" if "ids" in name else "text"])
            assert all(shape[0] == n for shape in detail), (name, detail)
    refused = {name: detail for p, name, outcome, detail in results if p == "session"
               and outcome == "refused"}
    assert "[] is not compatible with expected shape [?]" in refused["one string, not a batch"]
    assert "must hold the same number of texts" in refused["text and text_b of other sizes"]
    assert "must be at most 64" in refused["a sequence beyond the position table"]
    assert "input input_word_ids must hold values in [0," in refused["a negative word id"]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory, exported, published, vocab, tiny_config):
    """What export_all writes for the SavedModel formats, and the module's one fresh
    process (_REPLAY_SCRIPT, then _REQUEST_SCRIPT): {"export": the export folder,
    "parity": export_all's answer, "replays": version folder -> replayed outputs,
    "proc": the finished process}."""
    model, _ = exported
    _, _, published_path = published
    tmp = tmp_path_factory.mktemp("fresh")
    out = tmp / "export"
    parity = export_all(ExportRequest(model, str(out), max_seq_len=L, dev_texts=TEXTS * 3,
                                      formats=["saved_model", "saved_model_ids"], latency_runs=1,
                                      task_name="polarity"))
    # The requests go to a pair model: serving_default then takes text and text_b.
    pair_model = tiny_classifier(vocab, tiny_config, seed=2, label_names=LABELS)
    pair = export_saved_model(pair_model, str(tmp / "pair"), L, is_pair=True)

    def jsonable(value):
        if isinstance(value, np.ndarray):  # an empty batch keeps its shape
            return {"zeros": list(value.shape)} if value.size == 0 else value.tolist()
        if isinstance(value, bytes):
            return value.decode("latin-1")
        if isinstance(value, list):
            return [jsonable(v) for v in value]
        return value
    cases = {name: (sig, {k: jsonable(v) for k, v in inputs.items()})
             for name, (sig, inputs, _) in BAD_REQUESTS.items()}
    (tmp / "cases.json").write_text(json.dumps(cases))
    replay = [published_path, str(out / "serving" / "1"), str(out / "serving_ids" / "1")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", _REPLAY_SCRIPT + _REQUEST_SCRIPT, pair,
                           str(tmp / "cases.json"), json.dumps(replay)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    replays = dict(json.loads(line[len("REPLAY "):]) for line in proc.stdout.splitlines()
                   if line.startswith("REPLAY "))
    assert set(replays) == set(replay), proc.stderr[-3000:]
    return {"export": out, "parity": parity, "replays": replays, "proc": proc}
