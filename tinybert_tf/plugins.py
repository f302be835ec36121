"""Registries and plugins: one rule for every table a plugin can add to.

The package's registries (loss terms, task types and `--task` names, data
sources, heads, export formats, strategies) all add entries through
`register(table, name, obj, what=..., replace=...)` (or a decorator made by
`class_decorator` for tables of named classes: task phases, general recipes): a
name already taken by another object is refused unless the newcomer says it replaces it
(`replace=True`), so a plugin never silently swaps a built-in (a term named
`attn`, the task `sst-2`, the format `float32`). Registering the same object
again (or a class of the same module and name: a reloaded module) is allowed.

`load(modules)` imports `--plugins` modules and remembers their files, so an
error raised later by a plugin's code (a term's `build`, a source's `load`)
is reported as the plugin's, naming its module, file and line
(`innermost_plugin_frame`), not as an internal error of the package.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from typing import Any, Callable, MutableMapping, Optional, Sequence

# Loaded plugin module name -> its file (or package folder).
_LOADED: dict[str, str] = {}


class PluginError(ValueError):
    """A plugin cannot be imported, or registers a name it may not take."""


def _identity(obj: Any) -> tuple[str, str]:
    return (getattr(obj, "__module__", "") or "", getattr(obj, "__qualname__", "") or repr(obj))


def register(table: MutableMapping[str, Any], name: str, obj: Any, *, what: str,
             replace: bool = False) -> Any:
    """table[name] = obj, refusing to replace another object unless `replace`.

    what: the kind of entry for the message ("loss term", "export format", ...).
    """
    old = table.get(name)
    if old is not None and old is not obj and _identity(old) != _identity(obj) and not replace:
        if _is_named(obj):
            where = getattr(sys.modules.get(_identity(obj)[0]), "__file__", None)
            new = f"{_identity(obj)[1]} by {_identity(obj)[0]}" + (f" ({where})" if where
                                                                  else "")
        else:  # an instance: its class's module is ours; say where it was registered
            caller = _caller()
            new = f"another {type(obj).__qualname__}" + (f" at {caller}" if caller else "")
        raise PluginError(
            f"{what} {name!r} is already registered ({_label(old)}); registering {new} "
            f"would replace it silently. Choose another name, or say it replaces the "
            f"existing one (replace=True).")
    table[name] = obj
    return obj


def class_decorator(instances: MutableMapping[str, Any], classes: MutableMapping[str, type],
                    *, what: str) -> Callable[..., Any]:
    """A class decorator for a registry of named objects (`@register_phase`,
    `@register_phase(replace=True)`): registers the class by its `name` under
    `register`'s rule (classes are compared, not instances) and one instance of it
    in `instances`, the table the package reads."""
    def decorator(cls: Optional[type] = None, *, replace: bool = False) -> Any:
        def add(c: type) -> type:
            if not getattr(c, "name", ""):
                raise ValueError(f"{c.__name__}: a registered {what} needs a `name`.")
            register(classes, c.name, c, what=what, replace=replace)
            instances[c.name] = c()
            return c
        return add(cls) if cls is not None else add
    return decorator


def _is_named(obj: Any) -> bool:
    """A class or function (it has a qualified name), not an instance."""
    return isinstance(getattr(obj, "__qualname__", None), str)


def _label(obj: Any) -> str:
    """A short name for messages: MODULE.NAME of a class or function, "a MODULE.TYPE"
    of an instance (whose repr may run to hundreds of characters)."""
    if _is_named(obj):
        module = getattr(obj, "__module__", "") or ""
        return f"{module}.{obj.__qualname__}" if module else obj.__qualname__
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"


def _caller() -> str:
    """"FILE, line N" of the innermost frame outside this package and importlib: the
    code that called a register function; "" when the package registers itself."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not os.path.abspath(filename).startswith(package):
            return f"{filename}, line {frame.f_lineno}"
        frame = frame.f_back
    return ""


def load(modules: Sequence[str]) -> None:
    """Import `--plugins` modules (they register their objects on import). Any error
    of the import names the plugin and, where the error is in its code, the file and
    line."""
    for name in modules:
        name = name.strip()
        if not name:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                raise PluginError(f"--plugins={name}: cannot import it: no such module ({e}); "
                                  "give a module on "
                                  "PYTHONPATH, e.g. my_project.distill_terms.") from None
            raise PluginError(f"--plugins={name}: cannot import it: {_where(e)}"
                              f"ModuleNotFoundError: {e}; install what it imports.") from None
        except PluginError as e:
            raise PluginError(f"--plugins={name}: {e}") from None
        except SystemExit as e:  # sys.exit() on import would end the tool without a word
            where = _where(e).rstrip(": ")
            raise PluginError(f"--plugins={name}: importing it called sys.exit({e.code!r})"
                              f"{f' ({where})' if where else ''}; a plugin module must only define "
                              "and register its objects on import: remove the exit, or put "
                              "its script code under `if __name__ == \"__main__\":`.") from None
        except Exception as e:  # noqa: BLE001  (a plugin may raise anything on import)
            raise PluginError(f"--plugins={name}: cannot import it: {_where(e)}"
                              f"{type(e).__name__}: {' '.join(str(e).split())[:400]}; fix the "
                              "plugin.") from None
        path = getattr(module, "__file__", None) or ""
        if os.path.basename(path) == "__init__.py":
            path = os.path.dirname(path)
        if path:
            _LOADED[name] = os.path.abspath(path)


def _where(e: BaseException) -> str:
    """"FILE, line N: " of the innermost frame (a SyntaxError's own file and line)."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}, line {e.lineno}: "
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return ""
    return f"{frames[-1].filename}, line {frames[-1].lineno}: "


def loaded() -> dict[str, str]:
    """Plugin module -> file (or package folder) of the plugins loaded so far."""
    return dict(_LOADED)


def _owner(filename: str) -> Optional[str]:
    path = os.path.abspath(filename)
    for name, where in _LOADED.items():
        if path == where or path.startswith(where + os.sep):
            return name
    return None


# How TensorFlow quotes the user code of an error raised while tracing a tf.function.
_QUOTED_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')


def innermost_plugin_frame(e: BaseException) -> Optional[tuple[str, str, int, str]]:
    """(plugin, file, line, function) of the innermost traceback frame of `e` (or of
    the errors it was raised from) that lies in a loaded plugin's code; None if none.
    Errors raised while TensorFlow traced a function quote their frames in the
    message (autograph runs a converted copy of the code): those count too."""
    if not _LOADED:
        return None
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            name = _owner(frame.filename)
            if name is not None:
                return name, frame.filename, int(frame.lineno or 0), frame.name
        for filename, line, function in reversed(_QUOTED_FRAME.findall(str(e))):
            name = _owner(filename)
            if name is not None:
                return name, filename, int(line), function
        e = e.__cause__ or e.__context__
    return None
