"""Flagfiles as bin/ tools read them: `--flagfile=FILE` expanded in place, a nested
one resolved against the including file's folder (then the current folder), so the
shipped configs work from any folder. absl's own expansion resolves every path
against the current folder, hence this module.

A value that starts with `~/` (or an item of a comma list that does) is the home
folder's, on the command line and in flagfiles: the shell expands `~` only at the
start of a word, not in `--output_dir=~/runs`, and absl keeps it as it is, so such a
run wrote into a folder named `~` in the current one.

A flagfile line in a shell's habits (a quoted value, a comment after the value) is
refused naming the file and line: absl would take the quotes or the comment as part
of the value.
"""
from __future__ import annotations

import os
import posixpath
import re
from typing import Optional, Sequence

from tinybert_tf import files


class FlagfileError(ValueError):
    """A flagfile that cannot be read: names the file (and the line that included it)."""


_FLAGFILE_PREFIXES = ("--flagfile=", "-flagfile=")


def expand_flagfiles(argv: Sequence[str]) -> list[str]:
    """argv with every `--flagfile=PATH` replaced by the flags it holds, recursively.

    absl resolves a flagfile named inside another flagfile against the current
    folder, so a config that includes `td_common.cfg` works only from one folder.
    Here a nested path is resolved against the including file's folder first
    (then, for flagfiles written for absl's rule, the current folder), so the
    shipped configs run from anywhere. File format as absl's: one flag per line,
    blank lines and lines starting with `#` or `//` ignored; a UTF-8 byte-order
    mark (Windows editors write one) is dropped. Arguments after `--` are kept
    as they are. argv[0] is the program name.

    Raises FlagfileError naming the missing file, the flagfile and line that
    named it, and every place looked in; or an include cycle.
    """
    out: list[str] = list(argv[:1])
    args = list(argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out.extend(args[i:])
            break
        path = _flagfile_path(arg)
        if path is None and arg in ("--flagfile", "-flagfile") and i + 1 < len(args):
            path, i = args[i + 1], i + 1
        if path is None:
            out.append(home_expanded(arg))
        else:
            out.extend(_read_flagfile(path, None, ()))
        i += 1
    return out


def command_line_names(argv: Sequence[str]) -> set[str]:
    """The flag names argv gives itself, not through a flagfile, as typed (`noquantize`
    for `--noquantize`); argv[0] is the program name, and nothing after `--` counts."""
    names: set[str] = set()
    for arg in argv[1:]:
        if arg == "--":
            break
        if (arg.startswith("-") and _flagfile_path(arg) is None
                and arg not in ("--flagfile", "-flagfile")):
            names.add(arg.lstrip("-").partition("=")[0])
    return names


def home_expanded(arg: str) -> str:
    """`--name=~/x` -> `--name=/home/me/x`, each item of a comma list alike; anything
    else unchanged."""
    name, eq, value = arg.partition("=")
    if not (eq and name.startswith("-") and "~" in value):
        return arg
    items = [os.path.expanduser(v) if v == "~" or v.startswith("~/") else v
             for v in value.split(",")]
    return f"{name}={','.join(items)}"


def _flagfile_path(arg: str) -> Optional[str]:
    for prefix in _FLAGFILE_PREFIXES:
        if arg.startswith(prefix):
            return arg[len(prefix):]
    return None


def _locate(path: str, including: Optional[str], where: str) -> str:
    """The flagfile `path` names: absolute/URL as is; a relative path against the
    including file's folder, then the current folder."""
    path = os.path.expanduser(path)
    if files.is_remote(path) or os.path.isabs(path):
        candidates = [path]
    else:
        candidates = []
        if including is not None:
            base = (posixpath.dirname(including) if files.is_remote(including)
                    else os.path.dirname(os.path.abspath(including)))
            candidates.append(posixpath.join(base, path) if files.is_remote(base)
                              else os.path.join(base, path))
        candidates.append(os.path.abspath(path))
    for candidate in candidates:
        if files.isfile(candidate):
            return candidate
    looked = " or ".join(dict.fromkeys(candidates))
    raise FlagfileError(f"Unable to open flagfile {path}{where}: no such file (looked for "
                        f"{looked}); fix the path (a flagfile named inside another is "
                        "relative to that file's folder).")


def _read_flagfile(path: str, including: Optional[str], chain: tuple[str, ...],
                   line_no: int = 0) -> list[str]:
    where = f" (named at {including}:{line_no})" if including else ""
    found = _locate(path, including, where)
    if found in chain:
        cycle = " -> ".join((*chain, found))
        raise FlagfileError(f"{found}{where}: flagfiles include each other ({cycle}); "
                            "remove one of the --flagfile lines.")
    try:
        data = files.read_bytes(found)
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FlagfileError(f"{found}: not UTF-8 text ({e.reason} at byte {e.start}); "
                            f"save the flagfile as UTF-8: {files.reencode_hint(data)}.") from None
    except OSError as e:
        raise FlagfileError(f"Unable to open flagfile {found}{where}: "
                            f"{e.strerror or e}.") from None
    flags_out: list[str] = []
    for n, raw in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#") or line.startswith("//"):
            continue
        problem = _shell_habit(line)
        if problem:
            raise FlagfileError(f"{found}:{n}: {line}: {problem}")
        nested = _flagfile_path(line)
        if nested is not None:
            flags_out.extend(_read_flagfile(nested, found, (*chain, found), n))
        else:
            flags_out.append(home_expanded(line))
    return flags_out


_COMMENT = re.compile(r"\s#")


def _shell_habit(line: str) -> str:
    """What is wrong with a flagfile line written as for a shell ("" when nothing): no
    shell reads a flagfile, so quotes and a trailing `# comment` were part of the value
    (`--output_dir="runs/x"` wrote into a folder named `"runs`)."""
    name, eq, value = line.partition("=")
    if not (eq and name.startswith("-")):
        return ""
    if _COMMENT.search(value):
        return ("a flagfile value runs to the end of its line, so the comment would be part "
                "of it; put the comment on a line of its own.")
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return (f"no shell reads a flagfile, so the quotes would be part of the value; write "
                f"{name}={value[1:-1]}.")
    return ""
