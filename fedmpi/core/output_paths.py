"""Where the commands write, and how: the analysis commands' places (CSV tables, PNG figures, TensorBoard
folders) are checked before any work is done, so that a mistyped or read-only place is one line naming
the path (exit 2), not a traceback after the table has been printed.

Files are never written through a symbolic link: a new file is made under a unique temporary name in the
target's folder (`temp_beside`: mkstemp, O_CREAT|O_EXCL, so a link planted there is never followed) and
renamed into place with os.replace, which replaces a link at the target instead of writing where it
points. No command writes to one of its own inputs (`check_not_input`)."""

from __future__ import annotations

import os
import tempfile

from fedmpi.core.errors import InputError


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temp_beside(path, suffix=".tmp"):
    """The path of a new, empty file with a unique name in `path`'s folder (created with O_EXCL, so never a
    link or an existing file), with the permissions a plain `open` would have given (mkstemp's are 0600)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=suffix, dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    finally:
        os.close(fd)
    return tmp


def replace_with(path, write, mode="w", **open_args):
    """Writes a file at `path` by `write(handle)` into a `temp_beside` file renamed over `path` once complete:
    `path` is the old file or the new one, and a link at `path` is replaced, never written through."""
    tmp = temp_beside(path)
    try:
        with open(tmp, mode, **open_args) as fh:
            result = write(fh)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return result


def same_file(a, b):
    """Whether paths `a` and `b` name the same file (a link or another spelling of the path included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_not_input(path, option, inputs):
    """InputError unless `path` is none of the command's input files `inputs`: an output never replaces
    what the command reads (`fedmpi export RUN --csv RUN/run.h5`)."""
    for source in inputs:
        if same_file(path, source):
            raise InputError(f"{option} {path}: is {source}, an input of this command; writing there would "
                             f"destroy it; name another file")


def check_file(path, option, inputs=(), replace=True, force_flag="--force"):
    """Raises InputError (naming `option` and `path`) unless a file can be created or replaced at `path`:
    it is no folder, its folder exists and is writable, it is none of `inputs`, and (`replace` False) no
    file exists there yet unless `force_flag` was given.

    Probed with a temporary file in the folder (removed again), because permission bits say nothing for
    root or on a read-only mount; the file at `path` itself is never opened (it may be a link)."""
    if os.path.isdir(path):
        raise InputError(f"{option} {path}: is a folder; name a file in it, "
                         f"e.g. {os.path.join(path, 'out' + _suffix(option))}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"{option} {path}: folder {folder} does not exist; create it first")
    check_not_input(path, option, inputs)
    if not replace and os.path.lexists(path):
        raise InputError(f"{option} {path}: already exists; replace it with {force_flag}, or name another file")
    _probe(folder, option, path)


def check_folder(path, option):
    """Raises InputError unless `path` is a writable folder or can be created as one (its parent exists)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"{option} {path}: is a file, not a folder")
    if not os.path.isdir(path):
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise InputError(f"{option} {path}: folder {parent} does not exist; create it first")
        _probe(parent, option, path)
    else:
        _probe(path, option, path)


def _probe(folder, option, named):
    try:
        fd, probe = tempfile.mkstemp(prefix=".fedmpi-write-probe-", dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise InputError(f"{option} {named}: cannot write there ({e.strerror or e})") from None


def sibling(path, tag):
    """FILE.png -> FILE-TAG.png: the further figures of one --plot go beside the first one."""
    stem, ext = os.path.splitext(path)
    return f"{stem}-{tag}{ext or '.png'}"


def _suffix(option):
    return {"--csv": ".csv", "--plot": ".png", "--out": ".png"}.get(option, "")
