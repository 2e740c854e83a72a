"""Where the commands write, and how. Every output place of every subcommand (`run`'s out, `data`'s --out,
`report`'s --csv and --plot, `export`'s --csv and --tensorboard) is decided here, before any work is done,
so that a mistyped, protected or read-only place is one line naming the path (exit 2), not a traceback
after the table was printed, and never a loss of the user's files.

The place rule (docs/reliability in the README):
- an empty path is refused (it once named the current folder, which a rebuild then replaced);
- an output folder is never the root, the current folder or one of its parents, the home folder or one of
  its parents, a git repository's root or anything in its .git folder, and never a symbolic link;
- an existing non-empty folder is replaced only where the command wrote it (its marker file) and
  --overwrite was given; commands that only add files of their own names into a folder (`fedmpi run`, a
  TensorBoard export) check those names, and replace nothing else;
- an existing file is replaced only with --force (--overwrite for a run), never when it is an input;
- missing folders on the way are created as `mkdir -p` would, once every check has passed.

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
    make_parents(path)
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
    """Raises InputError (naming `option` and `path`) unless a file can be created or replaced at `path`
    under the place rule (module docstring): a non-empty path that is no folder, none of `inputs`, whose
    nearest existing folder is writable (missing folders are made by `make_parents` when the file is
    written), and (`replace` False) with nothing there yet unless `force_flag` was given.

    Probed with a temporary file in the folder (removed again), because permission bits say nothing for
    root or on a read-only mount; the file at `path` itself is never opened (it may be a link)."""
    _check_not_empty(path, option, "out" + (_suffix(option) or ".csv"))
    if os.path.isdir(path):
        raise InputError(f"{option} {path}: is a folder; name a file in it, "
                         f"e.g. {os.path.join(path, 'out' + _suffix(option))}")
    check_not_input(path, option, inputs)
    if not replace and os.path.lexists(path):
        raise InputError(f"{option} {path}: already exists; replace it with {force_flag}, or name another file")
    _probe(_existing_folder(path, option), option, path)


def check_folder(path, option, owned=None, overwrite=False, overwrite_flag="--overwrite"):
    """Raises InputError unless `path` may become the command's output folder (the place rule, module
    docstring). `owned` is None for a command that only adds files of its own names to a folder (`fedmpi run`,
    TensorBoard exports: they check those names themselves), else a function telling whether an existing
    folder is one this command wrote (its marker file): such a folder is replaced only with `overwrite`, any
    other non-empty folder never. Missing folders on the way are made later by `make_parents`."""
    check_place(path, option)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise InputError(f"{option} {path}: is a file, not a folder")
    if os.path.isdir(path):
        if owned is not None and os.listdir(path):
            if not owned(path):
                raise InputError(f"{option} {path}: holds files that this command did not write; name a new or "
                                 f"empty folder (nothing there is replaced or deleted)")
            if not overwrite:
                raise InputError(f"{option} {path}: holds an earlier output of this command; replace it with "
                                 f"{overwrite_flag}, or name a new folder")
        _probe(path, option, path)
    else:
        _probe(_existing_folder(path, option), option, path)


def check_place(path, option):
    """The part of the place rule every output folder obeys, whoever owns it: not empty, not protected
    (`protected_place`), not a symbolic link."""
    _check_not_empty(path, option, "a new folder such as runs/NAME")
    real = os.path.realpath(path)
    why = protected_place(real)
    if why:
        raise InputError(f"{option} {path}: is {why}; fedmpi writes its output into a folder of its own there, "
                         f"name one, e.g. {os.path.join(path, 'out')}")
    if os.path.islink(path.rstrip(os.sep) or path):
        raise InputError(f"{option} {path}: is a symbolic link (to {real}); fedmpi never writes through one, "
                         f"name the folder itself")


def check_store_uri(uri, option):
    """The place rule for a tracker's store given as a URI (MLflow's `runtime.tracking_uri`): a local file
    store (`file:` or a bare path) must be a place `check_place` accepts; a server URI writes nothing here."""
    from urllib.parse import unquote, urlparse

    if uri is None:
        return
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        check_place(unquote(parsed.path) if parsed.scheme else uri, option)


def make_parents(path):
    """Creates the missing folders above `path`, as `mkdir -p` would (after every check has passed)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def protected_place(real):
    """Why the folder `real` (a resolved path) may never be a command's output folder, or None: the root,
    the current folder or one of its parents, the home folder or one of its parents, a git repository's root
    or its .git folder. An output there would mix with (and a replacement would remove) what the user keeps
    there; `os.path.isdir('')` being False once let an empty --out replace the current folder."""
    here = os.path.realpath(os.getcwd())
    home = os.path.realpath(os.path.expanduser("~"))
    if real == os.path.realpath(os.sep):
        return "the root folder"
    if real == here:
        return "the current folder"
    if _is_below(here, real):
        return "a parent of the current folder"
    if real == home:
        return "your home folder"
    if _is_below(home, real):
        return "a parent of your home folder"
    if os.path.lexists(os.path.join(real, ".git")):
        return "the root of a git repository"
    if ".git" in real.split(os.sep):
        return "inside a git repository's .git folder"
    return None


def _is_below(path, folder):
    return path != folder and os.path.commonpath([path, folder]) == folder


def _check_not_empty(path, option, example):
    if not isinstance(path, str) or not path.strip():
        raise InputError(f"{option} {path!r}: an empty path; name the place to write, e.g. {example}")


def _existing_folder(path, option):
    """The nearest existing folder at or above `path`'s folder (missing ones are created when writing);
    InputError where a file stands in the way."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise InputError(f"{option} {path}: {folder} is a file, not a folder")
    return folder


def _probe(folder, option, named):
    try:
        fd, probe = tempfile.mkstemp(prefix=".fedmpi-write-probe-", dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise InputError(f"{option} {named}: cannot write there ({folder}: {e.strerror or e})") from None


def sibling(path, tag):
    """FILE.png -> FILE-TAG.png: the further figures of one --plot go beside the first one."""
    stem, ext = os.path.splitext(path)
    return f"{stem}-{tag}{ext or '.png'}"


# What matplotlib's savefig can write, by file suffix (its own list; checked without importing it).
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp",
                   ".pgf")


def check_figure(path, option, inputs=(), replace=True, force_flag="--force"):
    """`check_file` for a figure, whose suffix must also name a format matplotlib writes. An input named as
    the figure (`--plot run.h5`) is told so first: that, not its suffix, is the mistake."""
    check_not_input(path, option, inputs)
    if not str(path).lower().endswith(FIGURE_SUFFIXES):
        raise InputError(f"{option} {path}: a figure's name ends in one of {', '.join(FIGURE_SUFFIXES)}, "
                         f"e.g. {os.path.splitext(str(path))[0] or 'curves'}.png")
    check_file(path, option, inputs=inputs, replace=replace, force_flag=force_flag)


def _suffix(option):
    return {"--csv": ".csv", "--plot": ".png", "--out": ".png"}.get(option, "")
