"""Outputs that appear whole or not at all.

Every file or directory ropekit writes for the user is built under a hidden name beside its target
(``.NAME.<pid>-<token>.part``, same directory, so same filesystem) and renamed into place when complete: a
process killed at any moment, a full disk or a file-size limit leaves the target absent (or as it was), never
half-written. The next write to the same target removes what a dead writer left (a live one's work is left
alone), and puts back an old target that a killed ``overwrite`` had moved aside but not yet replaced.

A target is checked before any work starts (:func:`check_target`): a parent that is a file, a read-only
filesystem, a name longer than the filesystem allows, or an existing target that is neither a regular file
nor a directory (a FIFO, a device, a socket: writing "over" one would feed or destroy it) is refused as one
:class:`~ropekit.errors.RopekitError` line. Renames are POSIX ``rename(2)``: atomic within one filesystem; an
existing directory is swapped with the new one in one step where Linux ``renameat2(RENAME_EXCHANGE)`` is there.

Files are created with the mode an ordinary ``open()`` gives (0666 less the umask), not ``mkstemp``'s 0600.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import RopekitError

__all__ = ["PART_SUFFIX", "atomic_dir", "atomic_file", "check_figure_target", "check_target", "clean_leftovers", "filesystem_error",
           "save_figure", "umask_mode"]

PART_SUFFIX = ".part"
_OLD = ".old"  # an overwritten target moved aside: `.NAME.<pid>-<token>.old.part`
#: The longest tail :func:`_part_name` adds to a name (dot, pid up to 7 digits, 12 hex digits, ``.old.part``).
_TAIL = len(".") + 7 + 1 + 12 + len(_OLD) + len(PART_SUFFIX) + 1


def umask_mode(base: int = 0o666) -> int:
    """``base`` less this process's umask: the mode ``open()`` (files) or ``mkdir`` (0o777) would give."""
    try:  # Linux says it without changing it: setting it, even briefly, races with other threads' files
        with open("/proc/self/status", encoding="ascii") as status:
            mask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0)
        os.umask(mask)
    return base & ~mask


def _prefix(target: Path) -> str:
    """The start of every temporary name of ``target``: ``.NAME.``, or a hash of a name too long to extend."""
    if len(os.fsencode(target.name)) + _TAIL <= 255:
        return f".{target.name}."
    return f".~{hashlib.sha256(os.fsencode(target.name)).hexdigest()[:16]}."


def _part_name(target: Path, old: bool = False) -> Path:
    return target.parent / f"{_prefix(target)}{os.getpid()}-{secrets.token_hex(6)}{_OLD if old else ''}{PART_SUFFIX}"


def _shown(path) -> str:
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}…{text[-40:]}"


_LEFTOVER = re.compile(r"(\d+)-[0-9a-f]{12}(\.old)?\.part")


def _owner_alive(pid: int) -> bool:
    """Whether the process that made a leftover still runs (its pid is part of the name)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers(target: str | os.PathLike) -> list[Path]:
    """Remove what dead writers of ``target`` left beside it; restore a moved-aside old target when the
    target itself is missing (a kill between the two renames of an overwrite). Returns the paths removed."""
    target = Path(target)
    parent = target.parent
    prefix = _prefix(target)
    try:
        names = [(n, m) for n in os.listdir(parent) if n.startswith(prefix)
                 for m in [_LEFTOVER.fullmatch(n[len(prefix):])] if m]  # `.model.` must not take `.model.gguf.…`
    except OSError:
        return []
    removed = []
    for name, match in sorted(names, key=lambda item: item[1].group(2) is None):  # restorations first
        if _owner_alive(int(match.group(1))):
            continue
        path = parent / name
        if name.endswith(_OLD + PART_SUFFIX) and not os.path.lexists(target):
            with contextlib.suppress(OSError):
                os.rename(path, target)
                continue
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
    return removed


def _existing_ancestor(path: Path) -> Path:
    for candidate in [path, *path.parents]:
        if os.path.lexists(candidate):
            return candidate
    return Path(".")


def check_target(path: str | os.PathLike, *, what: str = "--out", kind: str = "any", whole: bool = False) -> Path:
    """Refuse, in one line, a target ropekit cannot write whole; return it (made absolute).

    ``kind``: ``file``, ``dir`` or ``any`` — an existing target of the other kind is refused as well. ``whole``: the
    directory is replaced by another in one rename (:func:`atomic_dir`), so it may not be the current directory or
    hold it (``--out .`` or ``--out ''``): the process would go on in the replaced one and read nothing back."""
    target = Path(os.path.abspath(Path(path).expanduser()))
    if whole:
        here = Path(os.path.realpath(os.getcwd()))
        if here == Path(os.path.realpath(target)) or Path(os.path.realpath(target)) in here.parents:
            raise RopekitError(f"{what} '{_shown(path)}' is the current directory or holds it, and ropekit replaces the "
                               "directory it writes whole", "pass a new directory, e.g. --out extended")
    ancestor = _existing_ancestor(target.parent)
    if not ancestor.is_dir():
        raise RopekitError(f"{what} '{_shown(path)}' is under '{ancestor}', which is a file, not a directory",
                           "pass a path inside a directory")
    try:
        name_max = os.pathconf(ancestor, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    long_part = next((p for p in target.relative_to(ancestor).parts if len(os.fsencode(p)) > name_max), None)
    if long_part is not None:
        raise RopekitError(f"{what} '{_shown(path)}': a name of {len(os.fsencode(long_part))} bytes, longer than "
                           f"this filesystem's {name_max}", "pass a shorter name")
    if os.path.islink(target):
        target = Path(os.path.realpath(target))  # write what the link points to; the link stays
    if os.path.lexists(target):
        mode = os.stat(target).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            kind_name = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                         else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
            raise RopekitError(f"{what} '{_shown(path)}' is {kind_name}; ropekit writes only regular files and directories",
                               "pass a new path")
        if kind == "file" and stat.S_ISDIR(mode):
            raise RopekitError(f"{what} '{_shown(path)}' is a directory", "pass a file path")
        if kind == "dir" and stat.S_ISREG(mode):
            raise RopekitError(f"{what} '{_shown(path)}' exists and is a file", "pass a directory path")
    try:
        read_only = bool(os.statvfs(ancestor).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        raise RopekitError(f"{what} '{_shown(path)}' is on a read-only filesystem", "pass a path on a writable filesystem")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise RopekitError(f"{what} '{_shown(path)}': no permission to write in '{ancestor}'", "pass a path you can write")
    try:  # permission bits do not tell everything (root under /proc, a full disk): make and remove an empty file
        fd, probe = tempfile.mkstemp(prefix=".ropekit-probe-", dir=ancestor)
    except OSError as e:
        raise RopekitError(f"{what} '{_shown(path)}': cannot create files in '{ancestor}' ({e.strerror})",
                           "pass a path you can write") from None
    os.close(fd)
    os.unlink(probe)
    return target


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, *, overwrite: bool = False, what: str = "--out") -> Iterator[Path]:
    """Yield a temporary path beside ``target``; when the block ends without an exception, that file (written
    by the block) is given the umask's mode and renamed to ``target``. On any exception it is removed."""
    target = check_target(target, what=what, kind="file")
    if os.path.lexists(target) and not overwrite:
        raise RopekitError(f"{what} '{target}' exists", "pass another path, or --overwrite")
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(target)
    tmp = _part_name(target)
    try:
        yield tmp
        os.chmod(tmp, umask_mode())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _publish_dir(tmp: Path, target: Path, replace: bool, what: str) -> None:
    if os.path.isdir(target) and not any(os.scandir(target)):
        os.rmdir(target)  # an empty directory the user made for the output
    if not os.path.lexists(target):
        os.rename(tmp, target)
        return
    if not replace:
        raise RopekitError(f"{what} '{target}' exists and is not empty", "pass a new directory, or --overwrite")
    if exchange(tmp, target):  # one step: the old directory now has the temporary name
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = _part_name(target, old=True)
    os.rename(target, old)  # a kill before the next rename: the next write puts this back (clean_leftovers)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


_RENAME_EXCHANGE = 2  # linux/fs.h


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the kernel, the C library
    or the filesystem cannot, and the caller falls back to two renames."""
    global _renameat2
    if _renameat2 is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            _renameat2 = libc.renameat2
            _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        except (OSError, AttributeError):
            _renameat2 = False
    if _renameat2 is False:
        return False
    at_cwd = -100  # AT_FDCWD
    return _renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0


_renameat2 = None


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, *, replace: bool = False, what: str = "--out") -> Iterator[Path]:
    """Yield a new empty directory beside ``target``; when the block ends without an exception it becomes
    ``target`` in one rename. An empty existing ``target`` is replaced; a non-empty one only with ``replace``
    (moved aside, the new one renamed in, the old one deleted). On any exception the new directory is removed."""
    target = check_target(target, what=what, kind="dir", whole=True)
    if os.path.isdir(target) and any(os.scandir(target)) and not replace:
        raise RopekitError(f"{what} '{target}' exists and is not empty", "pass a new directory, or --overwrite")
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(target)
    tmp = _part_name(target)
    tmp.mkdir()
    try:
        yield tmp
        _publish_dir(tmp, target, replace, what)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


#: The first bytes of every PNG file (the PNG specification, §5.2).
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_figure_target(path: str | os.PathLike, *, what: str = "--plot") -> Path:
    """Refuse, in one line and before any work, a figure path that is not a writable ``.png`` file (an existing
    file of another kind is never replaced by a PNG); return it (made absolute)."""
    if Path(path).suffix.lower() != ".png":
        raise RopekitError(f"{what} '{_shown(path)}' is not a .png path", "pass a file name ending in .png")
    target = check_target(path, what=what, kind="file")
    if target.is_file() and target.stat().st_size:
        with open(target, "rb") as f:
            if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:  # an earlier figure is replaced; other content is not
                raise RopekitError(f"{what} '{_shown(path)}' exists and is not a PNG image", "pass a new file name")
    return target


def save_figure(fig, path: str | os.PathLike, **savefig_kwargs) -> Path:
    """``fig.savefig`` to ``path`` through :func:`atomic_file` (replacing an earlier figure): a killed plot leaves
    the old PNG or none, never a truncated one. The format follows the path's suffix (the temporary name's is
    ``.part``)."""
    path = Path(path)
    savefig_kwargs.setdefault("format", path.suffix.lstrip(".").lower() or "png")
    with atomic_file(path, overwrite=True, what="figure") as tmp:
        fig.savefig(tmp, **savefig_kwargs)
    return path


#: Errors of the filesystem a user can cause or fix (a path, a permission, space, a limit), not ropekit bugs.
_USER_ERRNOS = {errno.ENOTDIR: "a part of the path is a file, not a directory",
                errno.EROFS: "read-only filesystem", errno.ENAMETOOLONG: "name too long",
                errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                errno.EISDIR: "is a directory", errno.EEXIST: "exists", errno.ENOENT: "no such file or directory",
                errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                errno.EFBIG: "file too large for this process's file-size limit (ulimit -f)",
                errno.EMFILE: "too many open files", errno.ELOOP: "too many levels of symbolic links"}


#: How Rust's std::io::Error ends its message (safetensors and tokenizers raise their own exception types).
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")

#: SQLite's primary result code for a write its file has no room for, "database or disk is full"
#: (https://sqlite.org/rescode.html#full): the ENOSPC of a study's store, which reports no errno.
_SQLITE_FULL = 13


def _sqlite_full(exc: BaseException) -> bool:
    """True for SQLite's "database or disk is full", also when a statement after it failed in its turn (SQLite rolls
    the transaction back itself, so the store's own ``ROLLBACK`` then raises "no transaction is active")."""
    sqlite3 = sys.modules.get("sqlite3")  # not imported: no error can be SQLite's (and the CLI starts without it)
    seen = 0
    while sqlite3 is not None and isinstance(exc, sqlite3.Error) and seen < 8:
        code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+; an extended code, the primary one its low byte
        full = code & 0xFF == _SQLITE_FULL if isinstance(code, int) else "database or disk is full" in str(exc)
        if full:
            return True
        exc, seen = exc.__context__, seen + 1  # only through SQLite's own errors: another exception is not explained
    return False


def filesystem_error(exc: BaseException) -> RopekitError | None:
    """A :class:`RopekitError` line for an OSError the user's environment caused (also one a Rust extension
    reports as text, ``… (os error 27)``, and SQLite's full disk, which a study's store raises without an errno),
    else None."""
    if isinstance(exc, OSError):
        number, where = exc.errno, exc.filename
    elif _sqlite_full(exc):
        number, where = errno.ENOSPC, None  # the disk the database, its log or SQLite's temporary files are on
    else:
        found = _RUST_OS_ERROR.search(str(exc))
        number, where = (int(found.group(1)) if found else None), None
    if number not in _USER_ERRNOS:
        return None
    where = _shown(where) if where is not None else None
    problem = f"'{where}': {_USER_ERRNOS[number]}" if where else f"cannot write: {_USER_ERRNOS[number]}"
    return RopekitError(problem, "check the path, its permissions and the free space, then run again")
