"""Where the commands write, and how. Every output place of every subcommand (`run`'s out, `data`'s --out,
`report`'s --csv and --plot, `export`'s --csv and --tensorboard) is decided here, before any work is done,
so that a mistyped, protected or read-only place is one line naming the path (exit 2), not a traceback
after the table was printed, and never a loss of the user's files.

The place rule (docs/reference/inputs-and-outputs.md):
- an empty path is refused (it once named the current folder, which a rebuild then replaced);
- an output folder is never the root, the current folder or one of its parents, the home folder or one of
  its parents, a git repository's root or anything in its .git folder, and never a symbolic link;
- an existing non-empty folder is replaced only where the command wrote it (its marker file) and
  --overwrite was given; commands that only add files of their own names into a folder (`fedmpi run`, a
  TensorBoard export) check those names, and replace nothing else;
- an existing file is replaced only with --force (--overwrite for a run), never when it is an input;
- an existing path that is not a regular file (a device node, a FIFO, a socket, or a link to one) is never
  replaced or written, --force or not: the rename below would put a plain file in the node's place;
- two outputs of one command never name the same file (the second would replace the first);
- a path the file system cannot hold (a name over NAME_MAX bytes, a path over PATH_MAX) is refused before
  anything is made, not half-created;
- missing folders on the way are created as `mkdir -p` would, once every check has passed; where creating
  them fails part-way, the folders already made are removed again.

Files are never written through a symbolic link: a new file is made under a unique temporary name in the
target's folder (`temp_beside`: mkstemp, O_CREAT|O_EXCL, so a link planted there is never followed) and
renamed into place with os.replace, which replaces a link at the target instead of writing where it
points. No command writes to one of its own inputs (`check_not_input`)."""

from __future__ import annotations

import os
import stat
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
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=suffix, dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    finally:
        os.close(fd)
    return tmp


def temp_prefix(path, tag="."):
    """`.NAME.` for a temporary file or folder made beside `path`, NAME cut short so that the temporary name
    (prefix, mkstemp's 8 random characters and a suffix) stays far below NAME_MAX whatever `path`'s own name."""
    return f".{os.path.basename(os.path.abspath(path))[:TEMP_NAME_CHARS]}{tag}"


def replace_with(path, write, mode="w", **open_args):
    """Writes a file at `path` by `write(handle)` into a `temp_beside` file renamed over `path` once complete:
    `path` is the old file or the new one, and a link at `path` is replaced, never written through."""
    made = make_parents(path)
    try:
        tmp = temp_beside(path)
    except BaseException:
        remove_folders(made)
        raise
    try:
        with open(tmp, mode, **open_args) as fh:
            result = write(fh)
        replace_file(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        remove_folders(made)
        raise
    return result


def replace_file(tmp, path, option=None):
    """os.replace(tmp, path) once `path` is checked again to be no device node, FIFO or socket (nor a link
    to one): the checks before the work ran earlier, and the rename would replace such a node by a file."""
    check_regular(path, option or "output")
    os.replace(tmp, path)


def check_regular(path, option):
    """InputError where something that is not a regular file or a folder exists at `path` (a link is
    followed: a link to a device is refused too); a dangling link passes (the rename replaces the link)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
                else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        link = f" (through the link to {os.path.realpath(path)})" if os.path.islink(path) else ""
        raise InputError(f"{option} {shown(path)}: is {kind}{link}; fedmpi never replaces or writes into "
                         f"anything but a regular file, --force or not; move it away, or name another path")


def check_length(path, option, room=0):
    """InputError where `path` cannot be created on its file system: a name (of the part not made yet) longer
    than NAME_MAX bytes, or the whole path plus `room` (what goes inside an output folder, or a temporary
    name beside a file) longer than PATH_MAX; checked before anything is made, so nothing is half-created."""
    absolute = os.path.abspath(path)
    folder, missing = absolute, []
    while not os.path.lexists(folder):
        missing.insert(0, os.path.basename(folder))
        folder = os.path.dirname(folder)
    name_max, path_max = _limit(folder, "PC_NAME_MAX", 255), _limit(folder, "PC_PATH_MAX", 4096)
    for name in missing:
        if len(os.fsencode(name)) > name_max:
            raise InputError(f"{option} {shown(path)}: the name {shown(name, 40)} is {len(os.fsencode(name))} "
                             f"bytes, more than this file system allows ({name_max}); name a shorter path")
    if len(os.fsencode(absolute)) + room >= path_max:
        raise InputError(f"{option} {shown(path)}: a path of {len(os.fsencode(absolute))} bytes, too long for "
                         f"this file system ({path_max} at most, less {room} for what is written inside or "
                         f"beside it); name a shorter path")


def _limit(folder, name, default):
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError):
        return default


def shown(path, limit=120):
    """`path` for a message, its middle cut out where it is longer than `limit` characters."""
    text = str(path)
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-(limit // 2 - 3):]}"


def check_distinct(outputs):
    """InputError where two of a command's outputs `outputs` ((option, path) pairs, a file or a folder each)
    name the same place, spelled alike or not, existing or not yet (`same_file`): the second write would
    replace the first (`report --csv x.png --plot x.png`)."""
    seen = []
    for option, path in outputs:
        for other_option, other in seen:
            if same_file(path, other):
                also = other_option if other_option != option else f"another file of {option}"
                raise InputError(f"{option} {shown(path)}: is also named by {also} ({shown(other)}); one output "
                                 f"would replace the other; name different files")
        seen.append((option, path))


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
    check_length(path, option, room=TEMP_ROOM)
    check_regular(path, option)
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
    check_length(path, option, room=FOLDER_ROOM)
    if os.path.lexists(path) and not os.path.isdir(path):
        check_regular(path, option)
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
    """Creates the missing folders above `path`, as `mkdir -p` would (after every check has passed); the
    folders it made, top first (`remove_folders` takes them away again where the write then fails)."""
    return make_folders(os.path.dirname(os.path.abspath(path)))


def make_folders(folder):
    """`mkdir -p folder`; the folders it made, top first. Where it fails part-way, what it made is removed
    before the OSError is raised: a refused or failed output leaves no empty folders behind."""
    made, existing = [], os.path.abspath(folder)
    while not os.path.lexists(existing):
        made.insert(0, existing)
        existing = os.path.dirname(existing)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        remove_folders(made)
        raise
    return made


def remove_folders(made):
    """Removes the folders `made` (top first, as `make_folders` returns them) where they are still empty."""
    for folder in reversed(made or ()):
        try:
            os.rmdir(folder)
        except OSError:
            if os.path.isdir(folder):       # something was put there: it and the folders above it stay
                return


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


# What the length check leaves for names made beside a file (its temporary file) or inside an output folder
# (a run's ckpt/ckpt-NNNNNN.h5, an event file named after the host).
TEMP_NAME_CHARS = 100
TEMP_ROOM = TEMP_NAME_CHARS + 32
FOLDER_ROOM = 256


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
