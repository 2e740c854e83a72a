"""tools/tokenize_instructions.py (issue 54): instruction data and a model folder with its own tokenizer become
the next-token samples of `model.name: causal_lm` in an HDF5 file for `data.name: arrays`. Checked by hand on
a word-level tokenizer: one sample per response token, x the window of tokens before it (left-padded), y the
token; the prompt carries none; the mean cross-entropy over an example's samples is the masked fine-tuning loss
of a Hugging Face model on the same windows; client ids in sorted order; num_classes the model's vocab_size. A
federated run reads the file; bad input is exit 2 with one line, nothing written."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import ROOT, read_metrics, small_config, tool_module, write_config

from fedmpi.cli import main as fedmpi_main

pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytest.importorskip("tokenizers")

tool = tool_module("tokenize_instructions")

WORDS = ["[PAD]", "[UNK]", "[EOS]", "Q:", "A:", "say", "hello", "world", "yes", "no", "maybe", "why", "because",
         "sky", "blue", "sea", "deep"]
ID = {word: i for i, word in enumerate(WORDS)}
TEMPLATE = "Q: {prompt} A: {response}"
ROWS = {  # (user, prompt, response): three users, the client column's values deliberately unsorted
    "train": [("carol", "say hello", "hello world"), ("alice", "why sky", "because blue"),
              ("bob", "say yes", "yes"), ("carol", "why sea", "because deep sea"), ("alice", "say no", "no no"),
              ("bob", "maybe", "maybe yes")],
    "test": [("alice", "say world", "world"), ("bob", "why blue", "because sky"), ("carol", "say sea", "sea")],
}


def _model_folder(folder, with_tokenizer=True, vocab_size=None):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    word_level = Tokenizer(models.WordLevel(vocab=dict(ID), unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, pad_token="[PAD]", unk_token="[UNK]",
                                        eos_token="[EOS]")
    if with_tokenizer:
        tokenizer.save_pretrained(str(folder))
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab_size or len(tokenizer), n_embd=16, n_layer=2, n_head=2, n_positions=16,
                        bos_token_id=ID["[EOS]"], eos_token_id=ID["[EOS]"], pad_token_id=ID["[PAD]"])
    GPT2LMHeadModel(config).save_pretrained(str(folder))
    return folder


def _data_folder(folder, rows=ROWS, names=("user", "instruction", "response")):
    import datasets

    datasets.disable_progress_bars()
    splits = {split: datasets.Dataset.from_dict({name: [row[k] for row in rows[split]]
                                                 for k, name in enumerate(names)}) for split in rows}
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    return folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("instructions")
    return _model_folder(base / "model"), _data_folder(base / "data"), base


def _tokenize(inputs, out, *extra):
    model, data, _ = inputs
    return tool.main(["--model", str(model), "--data", str(data), "--out", str(out), "--template", TEMPLATE,
                      "--client-column", "user", *extra])


def _read(path):
    with h5py.File(path, "r") as f:
        return {key: f[key][()] for key in f}, dict(f.attrs)


def test_one_sample_per_response_token_with_the_window_before_it_by_hand(inputs, capsys):
    out = inputs[2] / "w3.h5"
    assert _tokenize(inputs, out, "--window", "3") == 0
    arrays, attrs = _read(out)
    # "Q: say hello A: hello world" + eos = [3, 5, 6, 4, 6, 7, 2]; the prompt "Q: say hello A: " is 4 tokens,
    # so the samples are the tokens at positions 4, 5, 6 (hello, world, [EOS]), each after its 3 predecessors.
    assert arrays["x_train"][:3].tolist() == [[5, 6, 4], [6, 4, 6], [4, 6, 7]]
    assert arrays["y_train"][:3].tolist() == [ID["hello"], ID["world"], ID["[EOS]"]]
    # every split's sample count: each response's words plus the eos, no prompt token
    for split in ("train", "test"):
        expected = sum(len(response.split()) + 1 for _, _, response in ROWS[split])
        assert len(arrays[f"y_{split}"]) == len(arrays[f"x_{split}"]) == expected
        assert arrays[f"x_{split}"].dtype == arrays[f"y_{split}"].dtype == np.int64
    # client ids: alice 0, bob 1, carol 2 (sorted), one per sample of the example
    per_example = [len(r.split()) + 1 for _, _, r in ROWS["train"]]
    users = {"alice": 0, "bob": 1, "carol": 2}
    assert arrays["client_train"].tolist() == np.repeat([users[u] for u, _, _ in ROWS["train"]],
                                                        per_example).tolist()
    assert arrays["client_test"].tolist() == [0, 0, 1, 1, 1, 2, 2]
    assert int(arrays["num_classes"]) == len(WORDS)
    assert attrs["window"] == 3 and attrs["template"] == TEMPLATE and attrs["pad_id"] == ID["[PAD]"]
    assert attrs["model"] == str(inputs[0]) and attrs["source"] == str(inputs[1]) and attrs["eos_appended"]
    line = capsys.readouterr().out.strip()
    assert "samples (response tokens) train 18, test 7" in line and "3 clients" in line, line


def test_the_default_template_marks_its_prompt_by_the_text_before_the_response(inputs, capsys):
    model, data, base = inputs
    out = base / "default.h5"
    assert tool.main(["--model", str(model), "--data", str(data), "--out", str(out), "--window", "3"]) == 0
    arrays, attrs = _read(out)
    # "### Instruction:\nsay hello\n\n### Response:\nhello world": ###, Instruction:, Response: are unknown (1);
    # the prompt is the 6 tokens up to "Response:\n"; then hello, world and [EOS] are the samples
    assert attrs["template"] == tool.DEFAULT_TEMPLATE and "client_train" not in arrays
    assert arrays["x_train"][:3].tolist() == [[6, 1, 1], [1, 1, 6], [1, 6, 7]]
    assert arrays["y_train"][:3].tolist() == [ID["hello"], ID["world"], ID["[EOS]"]]
    assert "no clients" in capsys.readouterr().out     # and the partition it then needs: iid or dirichlet


def test_a_short_context_is_left_padded_with_the_pad_id(inputs):
    out = inputs[2] / "w6.h5"
    assert _tokenize(inputs, out, "--window", "6", "--no-eos") == 0
    arrays, attrs = _read(out)
    # no eos: "hello", "world" only; 4 and 5 tokens precede them, padded to 6 with [PAD] = 0
    assert arrays["x_train"][:2].tolist() == [[0, 0, 3, 5, 6, 4], [0, 3, 5, 6, 4, 6]]
    assert arrays["y_train"][:2].tolist() == [ID["hello"], ID["world"]] and not attrs["eos_appended"]


def test_the_samples_mean_cross_entropy_is_the_masked_fine_tuning_loss(inputs):
    """Hugging Face's causal-LM loss with labels -100 on the prompt (Shepherd's masking; the model shifts the
    labels itself) equals the cross-entropy of the tool's samples through causal_lm's last-position logits: on
    each response token's window (a sliding context), and on a whole text in one pass where the window is the
    text's whole context (a one-token response after a prompt of `window` tokens)."""
    import torch
    from transformers import AutoModelForCausalLM

    from fedmpi.core.causal_lm import LastTokenLM

    out, whole_out = inputs[2] / "loss3.h5", inputs[2] / "loss4.h5"
    assert _tokenize(inputs, out, "--window", "3") == 0
    assert _tokenize(inputs, whole_out, "--window", "4", "--no-eos") == 0
    arrays, _ = _read(out)
    lm = AutoModelForCausalLM.from_pretrained(str(inputs[0]), local_files_only=True).eval()
    model = LastTokenLM(lm)
    x, y = torch.from_numpy(arrays["x_train"][:3]), torch.from_numpy(arrays["y_train"][:3])
    with torch.no_grad():
        ours = torch.nn.functional.cross_entropy(model(x), y)
        terms = []
        for i in range(3):
            ids = torch.cat([x[i], y[i:i + 1]])[None]
            labels = torch.full_like(ids, -100)
            labels[0, -1] = ids[0, -1]
            terms.append(lm(input_ids=ids, labels=labels).loss)
        # bob's "Q: say yes A: yes" without eos: the 4 prompt tokens, then "yes", the train split's 5th sample
        whole, _ = _read(whole_out)
        assert whole["x_train"][4].tolist() == [3, 5, 8, 4] and whole["y_train"][4] == ID["yes"]
        one = torch.nn.functional.cross_entropy(model(torch.from_numpy(whole["x_train"][4:5])),
                                                torch.from_numpy(whole["y_train"][4:5]))
        text = torch.tensor([[3, 5, 8, 4, 8]])
        reference = lm(input_ids=text, labels=torch.tensor([[-100, -100, -100, -100, 8]])).loss
    assert float(ours) == pytest.approx(float(torch.stack(terms).mean()), rel=1e-6)
    assert float(one) == pytest.approx(float(reference), rel=1e-6)
    assert abs(float(ours) - float(one)) > 1e-3       # two different losses: the comparison has teeth


def test_a_federated_run_reads_the_file(inputs, tmp_path):
    out = inputs[2] / "w3.h5"
    if not out.exists():
        assert _tokenize(inputs, out, "--window", "3") == 0
    cfg = small_config(tmp_path / "run", rounds=2, data={"name": "arrays", "root": str(out)},
                       partition={"scheme": "natural", "clients": 3}, server={"clients_per_round": 3},
                       model={"name": "causal_lm", "path": str(inputs[0])}, lora={"rank": 4},
                       client={"lr": 0.05, "batch_size": 4, "epochs": 1})
    assert fedmpi_main(["run", str(write_config(tmp_path / "sft.yaml", cfg))]) == 0
    metrics, _ = read_metrics(tmp_path / "run")
    loss = np.asarray(metrics["test_loss"], dtype=float)
    assert metrics["round"].tolist() == [0, 1] and np.isfinite(loss).all()
    # a causal_lm run records its perplexity exp(mean test cross-entropy) whatever the data; a 17-word model barely
    # trained is about uniform (17)
    ppl = np.asarray(metrics["test_perplexity"], dtype=float)
    np.testing.assert_allclose(ppl, np.exp(loss), rtol=1e-12)
    assert 0.5 * len(WORDS) < ppl[-1] < 2 * len(WORDS)
    # the natural clients are the users: alice's, bob's and carol's response tokens (words + eos)
    with h5py.File(tmp_path / "run" / "run.h5", "r") as f:
        assert f["partition/samples"][()].tolist() == [3 + 3, 2 + 3, 3 + 4]


def _refused(capsys, argv, *words):
    assert tool.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines


def test_bad_input_is_one_line_and_nothing_written(inputs, tmp_path, capsys):
    model, data, _ = inputs
    out = tmp_path / "out.h5"
    common = ["--model", str(model), "--data", str(data), "--out", str(out), "--window", "3"]
    _refused(capsys, [*common, "--prompt-column", "question"], "--prompt-column question", "no such column")
    _refused(capsys, [*common, "--client-column", "team"], "--client-column team")
    single = tmp_path / "single"
    import datasets
    datasets.Dataset.from_dict({"instruction": ["a"], "response": ["b"]}).save_to_disk(str(single))
    _refused(capsys, [*common, "--data", str(single)], "--data", "DatasetDict")
    _refused(capsys, [*common, "--data", str(tmp_path / "absent")], "--data")
    bare = _model_folder(tmp_path / "bare", with_tokenizer=False)
    _refused(capsys, [*common, "--model", str(bare)], "--model", "tokenizer")
    small = _model_folder(tmp_path / "small", vocab_size=len(WORDS) - 1)
    _refused(capsys, [*common, "--model", str(small)], "--model", "vocab_size (16)", "17 ids")
    _refused(capsys, [*common[:4], "--window", "3", "--out", str(ROOT / "sft.h5")], "--out", "inside this repository")
    _refused(capsys, [*common, "--template", "{prompt} only"], "--template")
    _refused(capsys, [*common, "--window", "40"], "--window 40", "16 positions")
    _refused(capsys, [*common[:4], "--window", "3", "--out", str(tmp_path / "out.npz")], "--out", ".h5")
    assert not out.exists() and not (ROOT / "sft.h5").exists()
    out.write_bytes(b"mine")
    _refused(capsys, [*common, "--template", TEMPLATE], "--out", "--overwrite")
    assert out.read_bytes() == b"mine"
    assert tool.main([*common, "--template", TEMPLATE, "--overwrite"]) == 0
    assert len(_read(out)[0]["y_train"]) == 18 and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
