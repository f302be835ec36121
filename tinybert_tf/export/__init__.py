"""Deployment exports: the format table, SavedModel (TF Serving), TFLite (Android), parity."""
from tinybert_tf.export.common import ExportError, export_task
from tinybert_tf.export.formats import FORMATS, ExportFormat, check_formats, register_format
from tinybert_tf.export.parity import DEFAULT_FORMATS, ExportRequest, export_all, format_table
from tinybert_tf.export.saved_model import custom_ops, export_saved_model
from tinybert_tf.export.serving import publish_version, replay_warmup, write_models_config
from tinybert_tf.export.tflite import FLAVOURS, TEXT_CUSTOM_OPS, TFLiteRunner
from tinybert_tf.export.tflite import convert as convert_tflite
from tinybert_tf.export.tflite_metadata import add_metadata, read_metadata

__all__ = ["DEFAULT_FORMATS", "FLAVOURS", "FORMATS", "TEXT_CUSTOM_OPS", "ExportError",
           "ExportFormat", "ExportRequest", "TFLiteRunner", "add_metadata", "check_formats",
           "convert_tflite", "custom_ops", "export_all", "export_saved_model", "export_task",
           "format_table", "publish_version", "read_metadata", "register_format",
           "replay_warmup", "write_models_config"]
