"""Deployment exports: SavedModel (TF Serving), TFLite (Android), parity checks."""
from tinybert_tf.export.common import FORMATS, TFLITE_FORMATS, ExportError, check_formats
from tinybert_tf.export.parity import export_all, format_table
from tinybert_tf.export.saved_model import custom_ops, export_saved_model
from tinybert_tf.export.tflite import TFLiteRunner, convert as convert_tflite

__all__ = ["FORMATS", "TFLITE_FORMATS", "ExportError", "check_formats", "export_all",
           "format_table", "custom_ops", "export_saved_model", "TFLiteRunner",
           "convert_tflite"]
