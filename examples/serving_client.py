#!/usr/bin/env python3
"""Classify raw text with a tinybert_tf model served by TF Serving, over gRPC.

Needs only `pip install tensorflow-serving-api` (it brings TensorFlow, grpcio
and the protos); it does not import tinybert_tf, so it runs on any client box.

    python examples/serving_client.py --host=localhost:8500 --model=tinybert \
        --text="a great fun film" --text="the plot was awful"
    # pair tasks: one --text_b per --text
    python examples/serving_client.py --model=mrpc --text="A cat sat." --text_b="A cat was sitting."

Prints one JSON object per text: the label, the probabilities (or the score of
a regressor) and the logits, as the `serving_default` signature returns them.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

import grpc
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

TEXT_SIGNATURE = "serving_default"


def build_request(model: str, texts: Sequence[str], texts_b: Optional[Sequence[str]] = None,
                  signature: str = TEXT_SIGNATURE,
                  version: Optional[int] = None) -> predict_pb2.PredictRequest:
    """A PredictRequest for the raw-text signature: `text` (and `text_b`) string [B]."""
    if not texts:
        raise ValueError("--text: give at least one text to classify.")
    if texts_b and len(texts_b) != len(texts):
        raise ValueError(f"--text_b: {len(texts_b)} given for {len(texts)} --text; a pair task "
                         "needs one --text_b per --text.")
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(list(texts), dtype=tf.string))
    if texts_b:
        request.inputs["text_b"].CopyFrom(tf.make_tensor_proto(list(texts_b), dtype=tf.string))
    return request


def predict(host: str, request: predict_pb2.PredictRequest,
            timeout: float = 10.0) -> predict_pb2.PredictResponse:
    """Send `request` to TF Serving's gRPC port at `host` (host:port)."""
    with grpc.insecure_channel(host) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return stub.Predict(request, timeout=timeout)


def response_rows(response: predict_pb2.PredictResponse) -> list[dict]:
    """The response's [B, ...] outputs as one JSON-ready dict per example."""
    arrays = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
    rows = []
    for i in range(len(next(iter(arrays.values())))):
        row = {}
        for key in sorted(arrays):
            value = arrays[key][i]
            row[key] = value.decode("utf-8") if isinstance(value, bytes) else value.tolist()
        rows.append(row)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="localhost:8500", help="TF Serving gRPC host:port")
    parser.add_argument("--model", default="tinybert", help="model name (--model_name / config)")
    parser.add_argument("--text", action="append", required=True, help="a text; repeatable")
    parser.add_argument("--text_b", action="append", help="second segment (pair tasks)")
    parser.add_argument("--signature", default=TEXT_SIGNATURE)
    parser.add_argument("--version", type=int, help="a version to pin (default: served one)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds")
    args = parser.parse_args(argv)
    try:
        request = build_request(args.model, args.text, args.text_b, args.signature,
                                args.version)
    except ValueError as e:
        parser.error(str(e))
    try:
        response = predict(args.host, request, args.timeout)
    except grpc.RpcError as e:
        print(f"{args.host}: {e.code().name}: {e.details()} (is tensorflow_model_server running "
              f"with --port on that address and serving model {args.model!r}?)",
              file=sys.stderr)
        return 1
    for text, row in zip(args.text, response_rows(response), strict=True):
        print(json.dumps({"text": text, **row}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
