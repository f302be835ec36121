"""tinybert_tf: TinyBERT / DistilBERT distillation for Keras 3 on TensorFlow.

Importing the package imports no TensorFlow: every public name below is loaded on
first use. A `bin/` tool imports `tinybert_tf.startup` first, which loads TensorFlow
its own way (see that module).

Keras's own format (`model.save("x.keras")`, `keras.models.load_model("x.keras")`)
needs our serializable classes registered (`tinybert_tf>BertModel`, the optimizer's
schedules). `import tinybert_tf` registers them when keras is already imported
(`import keras, tinybert_tf`); with the package imported first, `import
tinybert_tf.models` registers them. Either way `import tinybert_tf` alone stays cheap.
"""
import os as _os
import sys as _sys

_os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# The modules that register keras serializable classes (`register_keras_serializable`).
_KERAS_OBJECTS = ("tinybert_tf.models.encoder", "tinybert_tf.distill.optimizer")

if "keras" in _sys.modules:  # keras is there already: registering costs nothing more
    import importlib as _importlib

    for _name in _KERAS_OBJECTS:
        _importlib.import_module(_name)

__version__ = "0.1.0"
__all__ = ["BertConfig", "PRESETS", "get_config", "load_model", "load_tokenizer", "save_model"]

# Public name -> the module that holds it (each imports TensorFlow).
_LAZY = {"BertConfig": "config", "PRESETS": "config", "get_config": "config",
         "load_model": "models.checkpoint", "load_tokenizer": "models.checkpoint",
         "save_model": "models.checkpoint"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"tinybert_tf.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tinybert_tf' has no attribute {name!r}")
