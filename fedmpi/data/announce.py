"""What set-up says about the data set it loads: a line when loading starts, naming the source and
where it reads from, and one when it ends, with its size (clients, samples, bytes) and the seconds it took.
Rank 0 prints them (fedmpi.run.setup), unless `runtime.progress: off`; a loading of half a minute was silent.
The lines start with `data:`, not `fedmpi:`, which marks a run's outcome (an error, an interruption)."""

from __future__ import annotations

from fedmpi.core.config_checks import show
from fedmpi.data import leaf_binary

MB = 1e6


def _form(data):
    """How the source is read, where that is worth saying (Shakespeare's binary form or its JSON)."""
    if data.name != "shakespeare" or not data.root:
        return ""
    if leaf_binary.present(data.root):
        return " (binary, memory-mapped)"
    return " (LEAF JSON; a folder `fedmpi data shakespeare` builds has a binary form that loads in seconds)"


def loading_line(data) -> str:
    """The line before loading: the source's name, its folder or file, and the form it is read in."""
    where = f" from {show(data.root, 300)}" if data.root else ""
    return f"data: loading {data.name}{where}{_form(data)}"


def data_bytes(dataset) -> int:
    """Bytes of the data set's arrays: inputs, labels and the natural users' index arrays."""
    arrays = [dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test]
    for users in (dataset.users, dataset.test_users):
        arrays += list(users or ())
    return int(sum(a.nbytes for a in arrays))


def loaded_line(dataset, clients, seconds) -> str:
    """The line after loading: `clients` (the natural users where the source has them, else the partition's
    clients), the training and test samples, the arrays' bytes, the seconds."""
    kind = "natural clients" if dataset.users is not None else "clients"
    if dataset.users is not None:
        clients = len(dataset.users)
    return (f"data: {dataset.name} loaded in {seconds:.2f} s: {clients:,} {kind}, {len(dataset.y_train):,} "
            f"training and {len(dataset.y_test):,} test samples, {data_bytes(dataset) / MB:,.1f} MB")
