"""An early Ctrl-C during torch's import (found on a clean clone under load, issue 38): raised inside a
pybind11 callback of torch's import it made C++ call std::terminate (the rank aborted, "BAD TERMINATION");
now it is recorded and raised at the next set-up step (`signals.raise_deferred`). Elsewhere it is raised at once."""

from __future__ import annotations

import os
import signal
import types

import pytest

from fedmpi.mpi import signals


def frames(*names):
    """A chain of fake frames, innermost first, running code from the given file names."""
    frame = None
    for name in reversed(names):
        frame = types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename=name), f_back=frame)
    return frame


@pytest.fixture
def early(monkeypatch):
    monkeypatch.setattr(signals, "_deferred", [])
    monkeypatch.setattr(signals, "_interrupts", [])
    previous = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, previous)


def test_during_torchs_import_the_interrupt_waits_for_the_next_step(early):
    torch_init = f"{os.sep}venv{os.sep}torch{os.sep}distributed{os.sep}__init__.py"
    inside = frames(torch_init, "<frozen importlib._bootstrap>", "/x/fedmpi/core/rng.py", "/x/fedmpi/cli.py")
    assert signals._early_interrupt(signal.SIGINT, inside) is None        # no raise inside the import
    with pytest.raises(KeyboardInterrupt):
        signals.raise_deferred()
    signals.raise_deferred()        # once only


def test_elsewhere_it_is_raised_at_once(early):
    for frame in (frames("/x/fedmpi/cli.py"), frames("<frozen importlib._bootstrap>", "/x/fedmpi/cli.py"),
                  frames(f"{os.sep}v{os.sep}torch{os.sep}nn.py", "/x/fedmpi/cli.py")):
        with pytest.raises(KeyboardInterrupt):
            signals._early_interrupt(signal.SIGINT, frame)
    signals.raise_deferred()        # nothing deferred
