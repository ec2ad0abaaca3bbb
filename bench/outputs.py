"""Output paths checked before the work that fills them, for the `wok` commands (bench/cli.py) and
the standalone scripts of bench/: a result found unwritable only at the end (a tune's grid search,
a ramp, a script's measurement) costs the whole run; and one that fails when written all the same
keeps its result in a temporary file rather than lose it."""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import secrets
import select
import shutil
import stat
import struct
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from ..numerals import ascii_digits

# Made with their parents if missing; every other output is a file whose folder must exist. A
# command whose --plot is a folder of plots (`wok bench ramp`) says so with `folders`: `wok profile`'s
# --plot is one file.
FOLDER_OUTPUTS = ("--manifests", "--log-dir")


class WriteFailed(ValueError):
    """An output that failed when written, past the up-front check (a full disk, a folder removed
    meanwhile, a plot that matplotlib could not draw); a ValueError, as any bad option value, with
    the option kept for a caller that can save the result elsewhere."""

    def __init__(self, option: str, path, message: str) -> None:
        super().__init__(message)
        self.option = option
        self.path = path


def output_problem(path: Path, folder: bool, parents_made: bool = False) -> str | None:
    """Why `path` cannot be written (None: it looks writable): a file path's folder must exist
    and be writable, and the path must not be a folder; a folder output, or a file whose writer
    makes its folder (`parents_made`), must be makeable under its nearest existing ancestor."""
    if str(path) == "-":
        # The Unix habit for stdout: taken as a name, it left a file called `-` in the working
        # folder and nothing on stdout, exit 0. (`./-` still names that file, for whoever means it.)
        return f"writing to standard output is not supported; give a {'folder' if folder else 'file'} path"
    path = Path(path)
    if path.exists():
        if folder != path.is_dir():
            return "is not a folder" if folder else "is a folder; expected a file name"
        if not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
            return "is not writable"
        return _create_problem(path) if folder else None
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
    return _create_problem(place)


def _create_problem(folder: Path) -> str | None:
    """Why no file can be made in `folder`, found by making one and removing it (None: one was made,
    or the folder is append-only: see below).

    os.access answers for the permissions alone: for root it passes /proc, whose files cannot be
    created whatever they say, and a filesystem that refuses new files for its own reasons. An
    append-only folder is not probed, as nothing made there could be removed: a full disk or a quota
    there shows only when the output is written, after the run."""
    if _append_only(folder):
        return None
    try:
        fd, name = tempfile.mkstemp(prefix=".wok-probe-", dir=folder)
    except OSError as exc:
        return f"folder {folder} is not writable: {exc.strerror or exc}"
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass  # made but not removable: a stray empty file, no reason to refuse the output
    return None


def check_outputs(args, *options: str, parents_made: bool = False, folders: Sequence[str] = ()) -> None:
    """Raise ValueError naming the first of `options` (read off `args`) that cannot be written; those of
    FOLDER_OUTPUTS and `folders` are folders."""
    for option in options:
        path = getattr(args, option.removeprefix("--").replace("-", "_"))
        if path is None:
            continue
        if path == "":  # an option read as text, left empty (a variable): not the working directory
            raise ValueError(f"{option}: expected a path; got ''")
        try:
            why = output_problem(path, option in FOLDER_OUTPUTS or option in folders, parents_made)
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
    reported as the option's, not as a traceback. So is any other error of its writer (matplotlib
    failing to draw, a value the serializer refuses): the result measured is no less worth keeping.
    KeyboardInterrupt and SystemExit pass: they are not the output's fault."""
    try:
        yield
    except WriteFailed:
        raise
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
        raise WriteFailed(option, path, f"{option} {path}: {exc.strerror or exc}{where}") from None
    except Exception as exc:
        raise WriteFailed(option, path, f"{option} {path}: {type(exc).__name__}: {exc}") from exc


def keep_elsewhere(text: str, failed: WriteFailed) -> str:
    """For a result that is in no file after `failed` (its --json failed, or there was none and
    another output failed): write `text` (its JSON) to a new temporary file wok-bench-*.json rather
    than lose the minutes measured. The line that says so, or why even that could not be done."""
    try:
        fd, name = tempfile.mkstemp(prefix="wok-bench-", suffix=".json")
    except OSError as exc:
        return f"{failed}; nor could the result be kept in a temporary file: {exc}"
    try:
        # A lone surrogate (undecodable bytes of a command-line value) has no UTF-8: written as its
        # backslash escape, which inside a JSON string is JSON's own, rather than lose the result.
        with open(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
    except OSError as exc:  # a full disk: the file made is no copy of the result, only a stray
        with suppress(OSError):
            os.unlink(name)
        return f"{failed}; nor could the result be kept in a temporary file: {exc}"
    return f"{failed}; the result is kept in {name} instead"


Outputs = Sequence[tuple[str, "Path | None", Callable[[dict, Path], None]]]


@contextmanager
def replacing(path: Path, parents_made: bool = False, keep_suffix: bool = True):
    """The path a writer should write for `path`: a new file beside it, renamed over `path` once the
    writer returns. So a file is never seen half written, by a reader polling it or after a write
    that failed (a full disk, Ctrl-C): an earlier result there is kept whole, and a failed write
    leaves nothing. The new file is hidden and keeps `path`'s suffix (a plot's format is read from
    it) unless not `keep_suffix` (a folder others read by suffix: --manifests); it gets the mode and,
    where allowed, the owner a write in place would keep (a new file's: 0666 less the umask). A link
    is written through: the file it points at is replaced. A path naming a descriptor of this
    process (/dev/stdout, /dev/fd/N) gets the whole text written to that descriptor, where it is.
    Written in place as before, unreplaced: what is not a regular file (/dev/null, a pipe), a file
    with other hard links (they would keep the old text), another path in /dev or /proc, and a
    file in a folder that takes no new file or removes none (append-only). `parents_made`: the
    folder is made first if missing (as `output_problem` allows). A writer must write its file:
    one that wrote nothing would leave an empty one."""
    given = real = Path(path)
    part = None  # the new file, once made: removed at the end unless renamed over `path`
    spooled = None  # the path of the file an output bound for a descriptor is written to first
    try:
        fd = _own_descriptor(given)
        if fd is not None:
            # Opened by name it would be a second open file: one that truncates what the shell's
            # `> out.json` made (this process's own writes to it then land over the output), or none
            # at all (a socket: ENXIO). Written through the descriptor, it comes in order with them.
            spool, where = _make_spool(given, keep_suffix)
            spooled = str(where)
            if spool is None:
                part = where  # a file in the temporary folder: removed at the end
            try:
                yield where
                data = where.read_bytes()
            finally:
                if spool is not None:
                    os.close(spool)
            _write_descriptor(fd, data)
            return
        if parents_made:
            given.parent.mkdir(parents=True, exist_ok=True)
        try:
            st = os.stat(given)  # through links, /dev/stdout's to its pipe
        except FileNotFoundError:
            st = None
        # Another process's /proc/PID/fd/N, a file under /dev: the open file or device meant, not a
        # name to put a new file at.
        in_place = st is not None and (
            not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or given.absolute().parts[1:2] in (("dev",), ("proc",))
        )
        if st is not None and not in_place:
            # Refused as a write in place would be (a read-only file, a read-only mount), though the
            # rename would replace it all the same; the error is the open's own.
            os.close(os.open(given, os.O_WRONLY))
        real = Path(os.path.realpath(given))
        if not in_place and _append_only(real.parent):
            in_place = True  # a file made beside it could be neither renamed over it nor removed
        if not in_place:
            try:
                part, mode = _make_beside(real, st, keep_suffix)
            except OSError as exc:
                if st is None or exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                in_place = True  # a folder that takes no new file, its file writable: as before
        if in_place:
            yield given
            return
        yield part
        fd = os.open(part, os.O_RDONLY)
        try:
            if st is not None and (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                with suppress(OSError):  # only root may give a file away; EINVAL: an unmapped id
                    os.fchown(fd, st.st_uid, st.st_gid)
            os.fchmod(fd, mode)  # after the owner (a chown clears set-id bits) and the writer (0444)
            os.fsync(fd)  # on disk before the rename, or a crash could leave an empty file in its place
        finally:
            os.close(fd)
        try:
            os.replace(part, real)
        except OSError as exc:
            # The file takes no rename (bind-mounted: EBUSY, EXDEV; another's in a sticky folder, an
            # append-only folder whose flag `_append_only` cannot read: EPERM): written in place, as
            # before, from the whole new text.
            if st is None or exc.errno not in (errno.EBUSY, errno.EXDEV, errno.EPERM, errno.EACCES):
                raise
            with open(part, "rb") as src, open(real, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            part = None
    except OSError as exc:
        if isinstance(exc.filename, (str, os.PathLike)) and (
            Path(exc.filename).name.startswith(f".{real.name[:100]}.") or str(exc.filename) == spooled
        ):
            # The new file beside it is this output's own business: its error is said as the path's.
            raise OSError(exc.errno, exc.strerror, str(given)) from None
        raise
    finally:
        if part is not None:
            with suppress(OSError):
                os.unlink(part)


_FD_FOLDER = re.compile(r"/proc/(?P<pid>[0-9]+)(?:/task/[0-9]+)?/fd")


def _own_descriptor(path: Path) -> int | None:
    """The descriptor of this process that `path` names (/dev/stdout, /dev/fd/N, /proc/self/fd/N, a
    link to one of them), if it is open; None for any other path. Resolved as the kernel would: its
    folder through its links (/dev/fd to /proc/<pid>/fd; `..` after a link), then its last part
    followed while a link (`out.json -> /dev/stdout`, /dev/stdout itself) until it is one in a
    folder of this process's descriptors."""
    name = os.fspath(path)
    if not os.path.isabs(name):  # not abspath: its `..` taken lexically is not the kernel's
        name = os.path.join(os.getcwd(), name)
    for _ in range(40):  # the kernel's own limit on links followed
        folder, base = os.path.split(name)
        folder = os.path.realpath(folder)
        match = _FD_FOLDER.fullmatch(folder)
        if match is not None:
            if match["pid"] != os.path.basename(os.path.realpath("/proc/self")) or not ascii_digits(base):
                return None
            try:
                fd = int(base)
                os.fstat(fd)
            except (OSError, OverflowError):
                return None  # not open: the path's own error (ENOENT) when the writer opens it
            return fd
        try:
            target = os.readlink(os.path.join(folder, base))
        except OSError:  # not a link (or none there): a path as any other
            return None
        name = os.path.join(folder, target)  # a relative target from the link's folder
    return None


def _make_spool(path: Path, keep_suffix: bool) -> tuple[int | None, Path]:
    """A new file for the writer of an output bound for a descriptor (the descriptor's file may have
    no name a new file can be put beside) and its path. In memory where the system has them
    (memfd: the descriptor's path /proc/self/fd/N, open while the descriptor is): what goes to
    stdout needs no room in the temporary folder, a full one no longer fails it. Else a file in the
    temporary folder, named as `_make_beside`'s are (the descriptor None: removed by the caller)."""
    suffix = path.suffix if keep_suffix else ""
    if hasattr(os, "memfd_create") and not suffix:  # a memfd's path has no suffix to keep
        with suppress(OSError):
            spool = os.memfd_create(f"wok-{path.name[:100]}", os.MFD_CLOEXEC)
            return spool, Path(f"/proc/self/fd/{spool}")
    fd, name = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=f".part{suffix}")
    os.close(fd)
    return None, Path(name)


def _write_descriptor(fd: int, data: bytes) -> None:
    """`data` written whole to `fd` after what this process wrote to its standard streams so far."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with suppress(OSError, ValueError):  # a closed or broken stream has nothing to keep first
                stream.flush()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # a non-blocking pipe that is full: wait until its reader reads
            poll = select.poll()  # not select.select: it refuses descriptors from 1024 up
            poll.register(fd, select.POLLOUT)
            poll.poll()


# FS_IOC_GETFLAGS (linux/fs.h: _IOR('f', 1, long)) in the ioctl encoding of most architectures; those
# that encode the direction otherwise would read it as another request (powerpc's: FS_IOC_SETFLAGS).
_FS_IOC_GETFLAGS = (2 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 1
_FS_APPEND_FL = 0x20
_OTHER_IOCTL_ENCODING = ("alpha", "mips", "parisc", "ppc", "sparc")


def _append_only(folder: Path) -> bool:
    """Whether `folder` is append-only (Linux's `chattr +a`): a file made in it can be neither
    renamed nor removed. False where that cannot be read (another system or architecture, a file
    system without the flags, a folder not open for reading)."""
    if sys.platform != "linux" or platform.machine().startswith(_OTHER_IOCTL_ENCODING):
        return False
    import fcntl

    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    flags = bytearray(8)  # the kernel writes an int into it, at its start
    try:
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags)
    except OSError:  # ENOTTY, EINVAL, EOPNOTSUPP: a file system without these flags
        return False
    finally:
        os.close(fd)
    return bool(struct.unpack_from("i", flags)[0] & _FS_APPEND_FL)


def _make_beside(path: Path, st: os.stat_result | None, keep_suffix: bool) -> tuple[Path, int]:
    """A new empty file beside `path` named for it (hidden; a long name cut short), writable by its
    owner while written; and the mode it is to get once written: `st`'s (the file it replaces),
    else 0666 less the umask, as a write in place would leave."""
    while True:
        tail = f".part{path.suffix}" if keep_suffix else ".part"
        part = path.with_name(f".{path.name[:100]}.{secrets.token_hex(4)}{tail}")
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # another's of the same 32 random bits
            continue
        try:
            mode = stat.S_IMODE(st.st_mode) if st is not None else stat.S_IMODE(os.fstat(fd).st_mode)
            os.fchmod(fd, 0o600)
        except BaseException:
            os.unlink(part)
            raise
        finally:
            os.close(fd)
        return part, mode


def write_outputs(
    result: dict, outputs: Outputs, parents_made: bool = False, folders: Sequence[str] = ()
) -> tuple[WriteFailed, bool] | None:
    """Each (option, path, writer) whose path is given, in order (--json first), each file whole or
    not at all (`replacing`; `parents_made` as there; a folder's writer, FOLDER_OUTPUTS' and `folders`',
    given the folder). None when all were written; else the first failure, and whether --json's file
    (written before it) holds the result."""
    held = False
    for option, path, write in outputs:
        if not path:
            continue
        try:
            with writing(option, path):
                if option in FOLDER_OUTPUTS or option in folders:
                    write(result, path)
                else:
                    with replacing(Path(path), parents_made) as where:
                        write(result, where)
        except WriteFailed as exc:
            return exc, held
        held = held or option == "--json"
    return None


def write_final(result: dict, outputs: Outputs, parents_made: bool = False) -> str | None:
    """A standalone script's last writes (`write_outputs`, `parents_made` as there). None when all
    were written; else the line to print for the first that failed, the result kept by
    `keep_elsewhere` unless --json's file holds it."""
    failed = write_outputs(result, outputs, parents_made)
    if failed is None:
        return None
    exc, held = failed
    return str(exc) if held else keep_elsewhere(result_text(result), exc)


def finish_json(result: dict, path, prefix: str) -> int:
    """A standalone script's exit status after its last write, `result` to --json's `path`
    (`report.write_json`, by `write_final`): 0 when written, or when there is no path; else 1, the
    line `write_final` gave printed to stderr after `prefix` (how the script labels its lines)."""
    from .report import write_json

    failed = write_final(result, [("--json", path, write_json)])
    if failed:
        print(f"{prefix}{failed}", file=sys.stderr)
        return 1
    return 0


# A list of plain numbers (bools, nulls; NaN and ±Infinity where `allow_nan` lets them through)
# as json.dumps(indent=2) writes it, one item a line. An opening bracket then a line break is always
# a list's own (a string's line break is written \\n), and a line of letters, digits and -+. only
# can be nothing but such an item: an object's member begins with its key's quote, a string item
# with its quote, a list or object item with its bracket or brace.
_ITEM = r"[-+.0-9A-Za-z]+"
_FLAT_LIST = re.compile(rf"\[\n(?: *{_ITEM},\n)* *{_ITEM}\n *\]")


def _one_line(match: re.Match) -> str:
    """The list `_FLAT_LIST` matched, on one line: "1,\\n    2" is split at whitespace, ", " apart."""
    return "[" + " ".join(match[0][1:-1].split()) + "]"


def json_text(value, **dumps) -> str:
    """`value` as indented JSON text (`json.dumps` with `dumps`), non-ASCII kept as itself, ending
    in a newline; every result and plan file is written so. A list of plain numbers (bools, nulls)
    stands on one line: a step's histogram, timeline or batches hold thousands, and at one a line
    they made most of a file (a two-step ramp with --server-timing: 98 KB, 39 KB so). Only the
    whitespace between tokens differs from json.dumps' own, so the text reads back as the same
    value. A lone surrogate (a command-line value's undecodable bytes, by surrogateescape) has no
    UTF-8, and no file could hold it: it fails to encode alone, and its backslash escape, \\udcXX,
    is JSON's own escape for it (it can only stand inside a JSON string), which reads back as the
    same str."""
    text = _FLAT_LIST.sub(_one_line, json.dumps(value, indent=2, ensure_ascii=False, **dumps))
    return text.encode("utf-8", "backslashreplace").decode("utf-8") + "\n"


def write_json_text(value, path, **dumps) -> None:
    """`value` to `path` as `json_text` with `dumps`, in UTF-8: the --json writer of a script that
    keeps json.dumps' own NaN and Infinity (`report.write_json` writes them as null)."""
    Path(path).write_text(json_text(value, **dumps), encoding="utf-8")


def result_text(result: dict) -> str:
    """`result`'s JSON for `keep_elsewhere`. When --json failed because its serializer refused a
    value (the same would refuse it here), a looser one writes that value as its repr rather than
    lose the rest."""
    from .report import to_json

    try:
        return to_json(result)
    except Exception:
        pass
    try:
        return json_text(result, default=repr)
    except Exception:  # a value that even repr cannot make JSON of (a cycle): the text of it all
        return repr(result) + "\n"
