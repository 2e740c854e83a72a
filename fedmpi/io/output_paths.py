"""Where the analysis commands write (CSV tables, PNG figures, TensorBoard folders): checked before any
work is done, so that a mistyped or read-only place is one line naming the path (exit 2), not a
traceback after the table has been printed."""

from __future__ import annotations

import os

from fedmpi.core.errors import InputError


def check_file(path, option):
    """Raises InputError (naming `option` and `path`) unless a file can be created or replaced at `path`.

    Probed by opening the file for appending (a file that did not exist is removed again), because
    permission bits say nothing for root or on a read-only mount."""
    if os.path.isdir(path):
        raise InputError(f"{option} {path}: is a folder; name a file in it, "
                         f"e.g. {os.path.join(path, 'out' + _suffix(option))}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"{option} {path}: folder {folder} does not exist; create it first")
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise InputError(f"{option} {path}: cannot write there ({e.strerror or e})") from None
    if not existed:
        os.remove(path)


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
    probe = os.path.join(folder, f".fedmpi-write-probe-{os.getpid()}")
    try:
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise InputError(f"{option} {named}: cannot write there ({e.strerror or e})") from None


def sibling(path, tag):
    """FILE.png -> FILE-TAG.png: the further figures of one --plot go beside the first one."""
    stem, ext = os.path.splitext(path)
    return f"{stem}-{tag}{ext or '.png'}"


def _suffix(option):
    return {"--csv": ".csv", "--plot": ".png", "--out": ".png"}.get(option, "")
