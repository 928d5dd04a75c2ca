"""The error a user's mistake raises: `InputError`, caught before any work, whose message names what is wrong and the fix.

The library raises it (a `ValueError`) for bad arguments, files and names; the `hf-specdec` command and
`training.distill` print it as one line and exit with status 2, as argparse does (`--debug`, or `HF_SPECDEC_DEBUG=1`,
shows the traceback). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os


class InputError(ValueError):
    """A mistake in what the user passed (argument, file, line, name); the message says how to fix it."""


def debugging() -> bool:
    return os.environ.get("HF_SPECDEC_DEBUG", "").lower() not in ("", "0", "false", "no")


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def json_lines(path, argument: str):
    """`(line number, object)` for each non-blank line of the JSON-lines file a user passed as `argument`; a missing or
    unreadable file, or a line that is not a JSON object, is an `InputError` naming the file and line."""
    import json
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{argument} {path}: no such file; pass a JSON-lines file (one JSON object per line).") from None
    except IsADirectoryError:
        raise InputError(f"{argument} {path}: is a folder; pass a JSON-lines file (one JSON object per line).") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{argument} {path}: cannot be read ({one_line(error)}).") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}, line {number}: not JSON ({error.msg} at column {error.colno}); each line must be "
                             "one JSON object; fix or delete that line.") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}, line {number}: a JSON {type(row).__name__}, not an object; each line must be one "
                             "JSON object.")
        yield number, row
