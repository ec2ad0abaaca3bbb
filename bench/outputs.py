"""Output paths checked before the work that fills them, for the `wok` commands (bench/cli.py) and
the standalone scripts of bench/: a result found unwritable only at the end (a tune's grid search,
a ramp, a script's measurement) costs the whole run."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

# Made with their parents if missing; every other output is a file whose folder must exist.
FOLDER_OUTPUTS = ("--plots", "--manifests")


class WriteFailed(ValueError):
    """An output that failed when written, past the up-front check (a full disk, a folder removed
    meanwhile); a ValueError, as any bad option value, with the option kept for a caller that can
    save the result elsewhere."""

    def __init__(self, option: str, path, message: str) -> None:
        super().__init__(message)
        self.option = option
        self.path = path


def output_problem(path: Path, folder: bool, parents_made: bool = False) -> str | None:
    """Why `path` cannot be written (None: it looks writable): a file path's folder must exist
    and be writable, and the path must not be a folder; a folder output, or a file whose writer
    makes its folder (`parents_made`), must be makeable under its nearest existing ancestor."""
    path = Path(path)
    if path.exists():
        if folder != path.is_dir():
            return "is not a folder" if folder else "is a folder; expected a file name"
        return None if os.access(path, os.W_OK | (os.X_OK if folder else 0)) else "is not writable"
    place = path.parent
    if folder or parents_made:
        while not place.exists() and place != place.parent:
            place = place.parent
    if not place.exists():
        return f"folder {place} does not exist"
    if not place.is_dir():
        return f"{place} is not a folder"
    if not os.access(place, os.W_OK | os.X_OK):
        return f"folder {place} is not writable"
    return None


def check_outputs(args, *options: str, parents_made: bool = False) -> None:
    """Raise ValueError naming the first of `options` (read off `args`) that cannot be written."""
    for option in options:
        path = getattr(args, option.removeprefix("--").replace("-", "_"))
        if path is None:
            continue
        try:
            why = output_problem(path, option in FOLDER_OUTPUTS, parents_made)
        except OSError as exc:  # a stat refused on the way (a folder that cannot be searched)
            why = exc.strerror or str(exc)
        if why:
            raise ValueError(f"{option} {path}: {why}")


def refuse_unwritable(parser, args, *options: str, parents_made: bool = False) -> None:
    """For a standalone script's command line: refuse an unwritable output as argparse refuses a
    bad value (usage, the message, exit 2), before anything is measured."""
    try:
        check_outputs(args, *options, parents_made=parents_made)
    except ValueError as exc:
        parser.error(str(exc))


@contextmanager
def writing(option: str, path: Path):
    """An output that fails when written (after the up-front check: a full disk, a race) is
    reported as the option's, not as a traceback."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
        raise WriteFailed(option, path, f"{option} {path}: {exc.strerror or exc}{where}") from None
