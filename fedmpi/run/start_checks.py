"""What a real start of `fedmpi run` checks before it builds anything, for `--dry-run` to check alike without
taking, writing or moving anything: the place `out` and what it holds (fedmpi.io.outdir.claim's refusals, with
--overwrite and --resume as given), and the checkpoint a --resume or a --fork-from would start from (the same
choice and checks as fedmpi.io.resume.choose and fedmpi.io.fork.choose: the stored config against this one,
the run file, the stored arrays). A dry run that passes is a start these checks would let through."""

from __future__ import annotations


def check_start(cfg, overwrite=False, resume=False, fork_from=None):
    """The checks of the start (exit 2 on a refusal, naming what differs); the checkpoint path the run would
    start from, or None for a fresh run."""
    from fedmpi.io import outdir

    outdir.check_claim(cfg.out, overwrite, resume)
    if resume:
        from fedmpi.io.resume import choose

        return choose(cfg).path
    if fork_from:
        from fedmpi.io.fork import choose

        return choose(cfg, fork_from).path
    return None


def check_start_model(path, cfg, dim):
    """The checkpoint's arrays against the model this config builds (`dim` entries): what loading it into the
    run would refuse first."""
    from fedmpi.io.resume import check_contents

    if path is not None:
        check_contents(path, cfg, dim)
