#!/usr/bin/env python3
"""Turn instruction data into the next-token samples of `model.name: causal_lm`: an HDF5 file for
`data.name: arrays`, tokenized with the model folder's own tokenizer.

    python tools/tokenize_instructions.py --model ~/models/my-gpt2 --data ~/data/instructions --out ~/data/sft.h5
        [--window 64] [--prompt-column instruction] [--response-column response] [--client-column user]
        [--template TEXT] [--no-eos] [--overwrite]
    fedmpi run CONFIG data.name=arrays data.root=~/data/sft.h5 model.name=causal_lm model.path=~/models/my-gpt2

--model is a Hugging Face model folder holding its tokenizer (AutoTokenizer and AutoConfig, local_files_only);
the config's vocab_size must cover every id the tokenizer gives. --data is a `datasets.DatasetDict` saved with
save_to_disk, splits `train` and `test`, with text columns for the prompt and the response and, with
--client-column, a column naming each example's client (any value: a user, a task category); the k-th distinct
value in sorted order (over both splits) becomes client id k, the natural users of `partition.scheme: natural`.
Without --client-column the file has no client ids and the partition must be `iid` or `dirichlet`.

One example is the text `template.format(prompt=..., response=...)` tokenized (the tokenizer's own special
tokens included), followed by the tokenizer's eos token unless --no-eos (or the tokenizer has none). Its
first P tokens are the prompt, P being the length of the tokenized text before the template's `{response}`
(the prompt prefix, tokenized alone): the rule of FederatedGPT-Shepherd's main.py (generate_and_tokenize_prompt,
train_on_inputs False: labels -100 on the first len(tokenize(user_prompt)) tokens). Every later token t_i
(i >= P, and i >= 1: the first token of a text has nothing before it) is one sample: y = t_i, x = the `window`
tokens t_{i-window} .. t_{i-1}, left-padded where fewer precede it with the tokenizer's pad id, else its eos id,
else 0.

The mean cross-entropy over an example's samples is then the supervised fine-tuning loss on its response
tokens (labels -100 on the prompt, the mean over the response tokens), each response token predicted from at
most the `window` tokens before it. Where `window` tokens or more precede a token it is exactly that loss's
term; where fewer do, the model also reads the left padding (causal_lm passes no attention mask, and the real
tokens sit at positions window-k .. window-1 instead of 0 .. k-1), which a padded Hugging Face loss would mask:
choose a pad the model treats as a separator, or a window no longer than the prompts. Two differences from
Shepherd: a long text keeps every response token (its context slides) where Shepherd cuts the text at
cutoff_len, dropping its tail; and the mean in a federated run is over all of a client's samples (tokens), not
a mean of per-example means. The cost: one forward pass over `window` tokens per response token (a response of
R tokens is R samples of `window` tokens, where one pass over the whole text would predict them all), so a
round costs about R times what one pass over each example would.

The file holds x_train, x_test (int64, N x window), y_train, y_test (int64), client_train, client_test (int64,
with --client-column), num_classes (the model's vocab_size), and attributes `source` (the --data folder),
`model` (the --model folder), `template`, `window`, `pad_id`, `eos_appended`. A summary line tells the examples,
samples, clients and how many samples had their context cut to the window. It is written into a temporary
file beside --out and renamed into place at the end. Every check comes first (exit 2 with one line; nothing
written): --out outside this repository, an .h5 or .hdf5 name, not an existing file unless --overwrite; the
model folder's tokenizer and config; the data folder, its splits and columns; the template's fields.
"""

from __future__ import annotations

import argparse
import os
import string
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path.insert(0, ROOT)

from fedmpi.core.errors import FedmpiError  # noqa: E402
from fedmpi.core.output_paths import check_file, make_parents, remove_folders, replace_file, temp_beside  # noqa: E402
from fedmpi.core.tool_outputs import OneLineParser, is_within  # noqa: E402
from fedmpi.core.tool_outputs import ToolUsageError as UsageError  # noqa: E402

DEFAULT_TEMPLATE = "### Instruction:\n{prompt}\n\n### Response:\n{response}"
SPLITS = ("train", "test")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model")


def parse(argv):
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a Hugging Face model folder with its tokenizer")
    p.add_argument("--data", required=True, help="a datasets.DatasetDict folder (save_to_disk), splits train, test")
    p.add_argument("--out", required=True, help="the HDF5 file to write (.h5 or .hdf5, outside this repository)")
    p.add_argument("--window", type=int, default=64, help="context tokens per sample (default 64)")
    p.add_argument("--prompt-column", default="instruction", help="the prompt's column (default instruction)")
    p.add_argument("--response-column", default="response", help="the response's column (default response)")
    p.add_argument("--client-column", default=None, help="the column naming each example's client (default none)")
    # The default is applied after parsing: its line breaks would break the generated command-line reference.
    p.add_argument("--template", default=None, help="the text of an example, with the fields {prompt} and "
                   "{response}; default: " + repr(DEFAULT_TEMPLATE)[1:-1] + " (an Alpaca-style template)")
    p.add_argument("--no-eos", action="store_true", help="do not append the tokenizer's eos token to a response")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = p.parse_args(argv)
    args.template = DEFAULT_TEMPLATE if args.template is None else args.template
    return args


def split_template(template):
    """The template's text before `{response}` (with `{prompt}` in it) and after; UsageError unless the fields
    are exactly one {prompt} before one {response}."""
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as e:
        raise UsageError(f"--template {template!r}: not a format string ({e}); use {{prompt}} and "
                         f"{{response}}") from None
    if sorted(fields) != ["prompt", "response"] or fields[0] != "prompt" or template.count("{response}") != 1:
        raise UsageError(f"--template {template!r}: must hold {{prompt}} then {{response}}, once each, and no "
                         f"other field (found {fields}); write a literal brace as {{{{ or }}}}")
    marker = "\0response\0"
    prefix, suffix = template.replace("{response}", marker, 1).split(marker)
    return prefix, suffix


def load_tokenizer(folder):
    """(tokenizer, vocab_size, the model's position count or None) of the model folder."""
    if not os.path.isdir(folder):
        raise UsageError(f"--model {folder}: no such folder; name a Hugging Face model folder with its tokenizer")
    try:
        from transformers import AutoConfig, AutoTokenizer
        from transformers.utils import logging as transformers_logging
    except ImportError:
        raise UsageError("this tool needs transformers: pip install 'fedmpi[llm]'") from None
    transformers_logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:
        raise UsageError(f"--model {folder}: no readable config.json ({type(e).__name__}); name the folder "
                         f"save_pretrained wrote") from None
    # transformers 5 builds an empty tokenizer of the config's model type where the folder has no tokenizer
    # files, rather than failing: look for them first, and refuse a tokenizer without a vocabulary.
    files = [name for name in TOKENIZER_FILES if os.path.isfile(os.path.join(folder, name))]
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True) if files else None
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise UsageError(f"--model {folder}: holds no tokenizer that AutoTokenizer can read ({type(e).__name__}); "
                         f"save the model's tokenizer into it (tokenizer.save_pretrained)") from None
    if tokenizer is None or len(tokenizer) < 2:
        raise UsageError(f"--model {folder}: holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}, or an "
                         f"empty vocabulary); save the model's tokenizer into it (tokenizer.save_pretrained)")
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < len(tokenizer):
        raise UsageError(f"--model {folder}: the config's vocab_size ({vocab}) does not cover the tokenizer's "
                         f"{len(tokenizer)} ids; use the tokenizer made for this model")
    positions = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return tokenizer, vocab, positions


def load_examples(folder, columns):
    """{split: {role: list}} of the DatasetDict at `folder`, `columns` {role: column name or None}."""
    try:
        import datasets
    except ImportError:
        raise UsageError("this tool needs datasets: pip install 'fedmpi[hf]'") from None
    if not os.path.isdir(folder):
        raise UsageError(f"--data {folder}: no such folder; name a datasets.DatasetDict folder (save_to_disk)")
    datasets.disable_progress_bars()
    try:
        data = datasets.load_from_disk(folder)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise UsageError(f"--data {folder}: not a saved Hugging Face data set ({type(e).__name__}); name a "
                         f"folder that DatasetDict.save_to_disk wrote") from None
    if not isinstance(data, datasets.DatasetDict) or not set(SPLITS) <= set(data):
        found = sorted(data) if isinstance(data, datasets.DatasetDict) else "a single Dataset"
        raise UsageError(f"--data {folder}: needs a DatasetDict with the splits train and test (found {found})")
    out = {}
    for split in SPLITS:
        out[split] = {}
        for role, column in columns.items():
            if column is None:
                continue
            if column not in data[split].column_names:
                raise UsageError(f"--{role}-column {column}: no such column in --data {folder} split {split} "
                                 f"(columns: {', '.join(data[split].column_names)})")
            values = data[split][column]
            bad = [v for v in values if v is None] if role == "client" else [
                v for v in values if not isinstance(v, str)]
            if bad:
                what = "text" if role != "client" else "a value (no null)"
                raise UsageError(f"--{role}-column {column}: split {split} holds {bad[0]!r}; every row needs {what}")
            out[split][role] = list(values)
    return out


def client_ids(examples):
    """{split: int64 ids}: the k-th distinct client value (sorted, over both splits) is id k."""
    values = set(examples["train"]["client"]) | set(examples["test"]["client"])
    try:
        order = sorted(values)
    except TypeError:
        order = sorted(values, key=repr)        # mixed types: a fixed order all the same
    index = {value: k for k, value in enumerate(order)}
    return {split: np.array([index[v] for v in examples[split]["client"]], dtype=np.int64) for split in SPLITS}


def token_ids(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def pad_id(tokenizer):
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def example_samples(tokens, prompt_len, window, pad):
    """(x [R, window], y [R]) of one tokenized example whose first `prompt_len` tokens are the prompt, and the
    number of its samples whose context was cut to the window."""
    tokens = np.asarray(tokens, dtype=np.int64)
    padded = np.concatenate([np.full(window, pad, dtype=np.int64), tokens])
    positions = np.arange(max(prompt_len, 1), len(tokens))
    x = padded[positions[:, None] + np.arange(window)]        # padded[i .. i+window-1] = t_{i-window} .. t_{i-1}
    return x, tokens[positions], int((positions > window).sum())


def tokenize_split(tokenizer, prompts, responses, template, window, pad, eos):
    """(x, y, per-example sample counts, samples cut) of one split."""
    prefix, _ = split_template(template)
    xs, ys, counts, cut = [], [], [], 0
    for prompt, response in zip(prompts, responses):
        tokens = token_ids(tokenizer, template.format(prompt=prompt, response=response))
        if eos is not None and (not tokens or tokens[-1] != eos):
            tokens.append(eos)
        prompt_len = len(token_ids(tokenizer, prefix.format(prompt=prompt)))
        x, y, n_cut = example_samples(tokens, prompt_len, window, pad)
        xs.append(x)
        ys.append(y)
        counts.append(len(y))
        cut += n_cut
    return (np.concatenate(xs) if xs else np.zeros((0, window), np.int64),
            np.concatenate(ys) if ys else np.zeros(0, np.int64), np.array(counts, dtype=np.int64), cut)


def check(args):
    """Every check on the options and the output place, before any input is read."""
    if args.window < 1:
        raise UsageError(f"--window {args.window}: must be 1 or more")
    if is_within(args.out, ROOT):
        raise UsageError(f"--out {args.out}: inside this repository ({ROOT}); name a file outside it")
    if not args.out.endswith((".h5", ".hdf5")):
        raise UsageError(f"--out {args.out}: data.name arrays reads HDF5 by its suffix; name a .h5 or .hdf5 file")
    check_file(args.out, "--out", replace=args.overwrite, force_flag="--overwrite")
    split_template(args.template)


def prepare(args):
    """Everything the file holds, computed and checked before anything is written: ({name: array}, attrs, summary)."""
    check(args)
    tokenizer, vocab, positions = load_tokenizer(args.model)
    if positions is not None and args.window > positions:
        raise UsageError(f"--window {args.window}: longer than the model's {positions} positions; use at most that")
    columns = {"prompt": args.prompt_column, "response": args.response_column, "client": args.client_column}
    examples = load_examples(args.data, columns)
    pad = pad_id(tokenizer)
    eos = None if args.no_eos else tokenizer.eos_token_id
    arrays, counts, cut = {}, {}, 0
    clients = client_ids(examples) if args.client_column else None
    for split in SPLITS:
        x, y, per_example, n_cut = tokenize_split(tokenizer, examples[split]["prompt"], examples[split]["response"],
                                                  args.template, args.window, pad, eos)
        if len(y) == 0:
            raise UsageError(f"--data {args.data}: split {split} gives no response tokens (every response is empty "
                             f"or the split has no rows)")
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, y
        counts[split], cut = (len(per_example), len(y)), cut + n_cut
        if args.client_column:
            arrays[f"client_{split}"] = np.repeat(clients[split], per_example)
    arrays["num_classes"] = np.int64(vocab)
    attrs = {"source": os.path.abspath(args.data), "model": os.path.abspath(args.model), "template": args.template,
             "window": args.window, "pad_id": pad, "eos_appended": eos is not None}
    clients = (f"{len(set(np.concatenate(list(clients.values())).tolist()))} clients "
               f"(column {args.client_column}; partition.scheme natural)" if args.client_column else
               "no clients (no --client-column; partition.scheme must be iid or dirichlet)")
    summary = (f"examples train {counts['train'][0]}, test {counts['test'][0]}; samples (response tokens) train "
               f"{counts['train'][1]}, test {counts['test'][1]}; {clients}; {cut} samples with their context cut "
               f"to the window of {args.window}; num_classes {vocab}")
    return arrays, attrs, summary


def write(path, arrays, attrs):
    """The HDF5 file at `path`, through a temporary file beside it renamed into place once complete."""
    import h5py

    made = make_parents(path)
    tmp = temp_beside(path)
    try:
        with h5py.File(tmp, "w") as f:
            for name, value in arrays.items():
                f.create_dataset(name, data=value)
            for name, value in attrs.items():
                f.attrs[name] = value
        replace_file(tmp, path, "--out")
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        remove_folders(made)
        raise


def run(args, say=print):
    arrays, attrs, summary = prepare(args)
    write(args.out, arrays, attrs)
    say(f"{summary}; written to {os.path.abspath(args.out)} (data.name: arrays, data.root: that file)")
    return arrays, attrs


def main(argv=None):
    try:
        run(parse(argv))
    except FedmpiError as e:
        print(f"tokenize_instructions: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
