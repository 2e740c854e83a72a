"""Issue 39, interrupts: a Ctrl-C at any moment of set-up under `mpiexec -n 2` ends every rank within seconds,
with one `fedmpi: interrupted` line and exit 130 (it once left rank 0 spinning at full CPU for minutes).

One launch per set-up pause point (fedmpi.mpi.signals.SETUP_PAUSES, so a new pause point is covered here
without a new test) and way of pausing: every rank pausing there with the SIGINT sent to the whole process
group, as a terminal's Ctrl-C is (mpiexec then forwards a second one to every rank); and rank 1 alone
pausing, the SIGINT sent to mpiexec only, which forwards it, while rank 0 has run on into whatever waits for
rank 1 (MPI_Init, a collective). The moment is the pause's marker line, not a sleep."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time

import pytest
from conftest import ROOT, fedmpi_cmd
from test_hardening_signals import child_env, config, fedmpi_lines

from fedmpi.core.errors import EXIT_INTERRUPTED
from fedmpi.mpi import signals
from fedmpi.mpi.signals import PAUSE_POINTS, SETUP_PAUSES

# Reaching a pause takes a few seconds of imports on each rank, more on a loaded 2-core machine.
REACH_S = 180
# Every rank ends within a few seconds of the SIGINT (MPI's start on a rank interrupted before it, a
# worker's 2 s grace for rank 0, rank 0's line drained to mpiexec); the bound is generous because a loaded CI
# machine stretches each of those, while the failure it catches is a job that never ends.
END_S = 60
# Rank 0 has passed the pause point when rank 1 pauses there; this long more puts it inside what comes next
# (MPI_Init is entered only once mpi4py's libraries have loaded). Not a timing the result depends on: a
# shorter settle only lets rank 0 hear the signal before it is inside, the easier case.
SETTLE_S = 1.0
# Only the node's first rank loads the data set (fedmpi.data.shared); rank 1 never passes there.
FIRST_RANK_ONLY = {"data"}
CASES = [(where, None) for where in SETUP_PAUSES] + [(where, 1) for where in SETUP_PAUSES
                                                       if where not in FIRST_RANK_ONLY]


def processes_in(cwd):
    """The processes (mpiexec, its proxy, the ranks) whose working folder is `cwd`, this test's own."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/cwd") == str(cwd):
                found.append(int(entry))
        except OSError:
            continue
    return found


def left_running(cwd, deadline):
    """`processes_in(cwd)` once they are gone or at `deadline`: mpiexec may end while the ranks it killed
    after an MPI_Abort are still on their way out."""
    while processes_in(cwd) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_in(cwd)


@pytest.mark.mpi
@pytest.mark.parametrize("where, rank", CASES, ids=[f"{w}-{'rank1' if r else 'all'}" for w, r in CASES])
def test_ctrl_c_at_any_moment_of_set_up_ends_every_rank_with_one_line(tmp_path, where, rank):
    cfg, out = config(tmp_path)
    extra = {"FEDMPI_TEST_SLEEP_AT": where, "FEDMPI_TEST_SLEEP_S": "600"}      # the SIGINT cuts it short
    if rank is not None:
        extra["FEDMPI_TEST_SLEEP_RANK"] = str(rank)
    proc = subprocess.Popen(fedmpi_cmd(2, "run", cfg), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=tmp_path, start_new_session=True, env=child_env(**extra))
    seen = b""
    try:
        deadline = time.monotonic() + REACH_S
        # Every rank that pauses there is paused before the signal goes (one still starting Python, before
        # fedmpi's first line, signals.install_early, would die of it with a traceback), and the others have
        # passed there, into what waits for rank 1.
        events = [f"fedmpi-test: paused at {where}".encode()] * (2 if rank is None and where not in FIRST_RANK_ONLY
                                                                 else 1)
        events += [f"fedmpi-test: passed {where}".encode()] if rank is not None else []
        while any(seen.count(e) < events.count(e) for e in events):
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(proc.stdout.fileno(), 4096) if ready else b""
            assert chunk, f"no pause at {where}; output so far: {seen.decode(errors='replace')}"
            seen += chunk
        if rank is not None:
            time.sleep(SETTLE_S)
        sent = time.monotonic()
        if rank is None:
            os.killpg(proc.pid, signal.SIGINT)      # the terminal's Ctrl-C: mpiexec, its proxy, every rank
        else:
            proc.send_signal(signal.SIGINT)         # mpiexec alone, which forwards it to every rank
        try:
            rest, _ = proc.communicate(timeout=END_S)
        except subprocess.TimeoutExpired:
            left = processes_in(tmp_path)
            pytest.fail(f"still running {END_S} s after the SIGINT at {where}: {len(left)} processes; "
                        f"output: {seen.decode(errors='replace')}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = (seen + rest).decode(errors="replace")
    assert proc.returncode == EXIT_INTERRUPTED, text
    lines = fedmpi_lines(text)
    assert len(lines) == 1 and lines[0] in ("fedmpi: interrupted", "fedmpi: interrupted (SIGINT on rank 0)"), text
    assert "Traceback" not in text and "BAD TERMINATION" not in text, text
    left = left_running(tmp_path, sent + END_S)
    assert not left, f"{len(left)} processes left {time.monotonic() - sent:.1f} s after the SIGINT: {text}"
    assert not (out / "run.h5").exists() or where == "broadcast", text


def test_every_pause_point_is_registered_and_every_registered_one_is_in_the_code():
    # What the launches above are generated from: a pause added in the code without its name in PAUSE_POINTS
    # fails every run that passes it (test_pause refuses the name); a name without a pause would be a test
    # that can never reach its moment.
    called = set()
    for path in (ROOT / "fedmpi").rglob("*.py"):
        called |= set(re.findall(r'test_pause\("(\w+)"\)', path.read_text()))
    for path in (ROOT / "fedmpi" / "mpi").glob("*.py"):      # the communicator's methods, in comm and node_comm
        called |= set(re.findall(r"@arrive_first\n    def (\w+)", path.read_text()))
    assert called == set(PAUSE_POINTS)
    with pytest.raises(ValueError, match="not one of signals.PAUSE_POINTS"):
        signals.test_pause("nowhere")


def test_a_pause_is_its_ranks_alone_and_comes_once(monkeypatch, capfd):
    monkeypatch.setattr(signals, "_paused", set())
    for name, value in (("FEDMPI_TEST_SLEEP_AT", "claim"), ("FEDMPI_TEST_SLEEP_S", "0"),
                        ("FEDMPI_TEST_SLEEP_RANK", "1"), ("PMI_RANK", "0")):
        monkeypatch.setenv(name, value)
    signals.test_pause("claim")
    signals.test_pause("claim")
    assert capfd.readouterr().err == "fedmpi-test: passed claim\n"     # (the event a test waits for)
    monkeypatch.setattr(signals, "_paused", set())      # another process: rank 1
    monkeypatch.setenv("PMI_RANK", "1")
    signals.test_pause("claim")
    signals.test_pause("claim")
    assert capfd.readouterr().err == "fedmpi-test: paused at claim\n"


def test_a_pause_ends_once_the_file_it_waits_for_exists(monkeypatch, capfd, tmp_path):
    # FEDMPI_TEST_SLEEP_UNTIL: a pause of 600 s that returns here at once (were the file ignored, the test's
    # timeout would end it); test_hardening_mpi holds a job at a pause this way while another one starts.
    go = tmp_path / "go"
    go.write_text("")
    monkeypatch.setattr(signals, "_paused", set())
    for name, value in (("FEDMPI_TEST_SLEEP_AT", "claim"), ("FEDMPI_TEST_SLEEP_S", "600"),
                        ("FEDMPI_TEST_SLEEP_UNTIL", str(go))):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("FEDMPI_TEST_SLEEP_RANK", raising=False)
    signals.test_pause("claim")
    assert capfd.readouterr().err == "fedmpi-test: paused at claim\n"


def test_a_rank_of_several_ignores_later_ctrl_cs_before_the_runs_handlers(monkeypatch):
    # mpiexec forwards the terminal's Ctrl-C to ranks the terminal reached already: the second one used to
    # end the rank at once, before MPI_Init if it came early, and the ranks inside theirs waited forever.
    # A process on its own still ends at once on a second one.
    before = signal.getsignal(signal.SIGINT)
    try:
        for size, then in (("2", signal.SIG_IGN), ("1", signals._interrupt_now)):
            monkeypatch.setenv("PMI_SIZE", size)
            with pytest.raises(KeyboardInterrupt):
                signals._early_interrupt(signal.SIGINT, None)
            assert signal.getsignal(signal.SIGINT) is then
    finally:
        signal.signal(signal.SIGINT, before)
