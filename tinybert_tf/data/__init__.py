"""Data: general corpora (text, Wikipedia XML, TFDS, TFRecords), GLUE tasks, metrics.

Submodules import TensorFlow lazily where they can, so `glue` and `metrics`
load quickly for tools that only read TSV files.
"""
