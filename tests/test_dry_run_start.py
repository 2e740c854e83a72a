"""H11: `fedmpi run --dry-run` runs the checks the real start runs: the place `out` and what it holds, and the
checkpoint checks of --resume and --fork-from. `fedmpi run --resume --dry-run` passed a resume that `--resume`
refused (a changed client.lr, seed or model). Each case is started both ways; the exit status and the first
line must agree."""

from __future__ import annotations

import pytest
from conftest import small_config, write_config

from fedmpi.cli import main


def _outcome(argv, capsys):
    """(exit status, the first 'fedmpi:' line) of `fedmpi ARGV` in this process, its `out` claims dropped after."""
    from fuzz_harness import release_claims

    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    finally:
        release_claims()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedmpi:")]
    return code, (lines[0] if lines else None)


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A finished run with a checkpoint after each of its 2 rounds, and its config."""
    from fuzz_harness import release_claims

    base = tmp_path_factory.mktemp("dry-start")
    cfg = small_config(base / "out", rounds=2, data={"name": "synthetic"}, partition={"clients": 8, "scheme": "iid"},
                       server={"clients_per_round": 4}, checkpoint={"every": 1, "keep": 5})
    path = write_config(base / "run.yaml", cfg)
    try:
        assert main(["run", str(path)]) == 0
    finally:
        release_claims()
    return path, base


RESUME_REFUSED = [["client.lr=0.1"], ["seed=2"], ["model.name=mlp"], ["rounds=1"], ["partition.clients=10"],
                  ["algorithm.name=fedprox"], ["runtime.wire_dtype=bfloat16"], ["--overwrite"]]


@pytest.mark.parametrize("change", RESUME_REFUSED, ids=[" ".join(c) for c in RESUME_REFUSED])
def test_a_resume_the_real_start_refuses_is_refused_by_the_dry_run(parent, capsys, change):
    path, base = parent
    real = _outcome(["run", str(path), *change, "--resume"], capsys)
    dry = _outcome(["run", str(path), *change, "--resume", "--dry-run"], capsys)
    assert real[0] == 2 and real[1] is not None, real
    assert dry == real


def _fork_cases(base):
    parent = base / "out"
    return [(["seed=5"], f"{parent}@1", "child"), (["model.name=mlp"], f"{parent}@1", "child"),
            ([], f"{parent}@7", "child"), ([], f"{base / 'nowhere'}@1", "child"),
            ([], f"{parent}@1", "out")]       # the parent itself as the fork's out


@pytest.mark.parametrize("case", range(5))
def test_a_fork_the_real_start_refuses_is_refused_by_the_dry_run(parent, capsys, case):
    path, base = parent
    change, spec, out = _fork_cases(base)[case]
    argv = ["run", str(path), *change, f"out={base / out}", "--fork-from", spec]
    real = _outcome(argv, capsys)
    dry = _outcome([*argv, "--dry-run"], capsys)
    assert real[0] == 2 and real[1] is not None, real
    assert dry == real
    assert not (base / "child").exists()


def test_an_existing_run_without_resume_or_overwrite_is_refused_by_both(parent, capsys):
    path, _ = parent
    real = _outcome(["run", str(path)], capsys)
    assert real[0] == 2 and "already holds a run" in real[1]
    assert _outcome(["run", str(path), "--dry-run"], capsys) == real


def test_what_the_real_start_accepts_the_dry_run_accepts(parent, capsys):
    path, base = parent
    fork = [f"out={base / 'fork'}", "--fork-from"]
    for argv in (["rounds=3", "--resume"], ["--overwrite"], [*fork, f"{base / 'out'}@1"],
                 ["client.lr=0.1", *fork, f"{base / 'out'}@2"]):
        assert _outcome(["run", str(path), *argv, "--dry-run"], capsys) == (0, None), argv


def test_the_dry_run_prints_its_summary_first_and_the_resolved_config_only_on_request(tmp_path, capsys):
    """Smaller item c: `--dry-run` printed ~180 lines of resolved YAML before the model, split, privacy and memory
    lines (and before any error). The summary comes first; the YAML only with --show-config, after it, whole."""
    from fedmpi import config

    cfg = small_config(tmp_path / "out", rounds=2, data={"name": "synthetic"},
                       partition={"clients": 8, "scheme": "iid"}, server={"clients_per_round": 4})
    path = write_config(tmp_path / "run.yaml", cfg)
    capsys.readouterr()
    assert main(["run", str(path), "--dry-run"]) == 0
    plain = capsys.readouterr().out.splitlines()
    assert plain[0].startswith("model: ") and any(line.startswith("memory estimate") for line in plain), plain[:3]
    assert not any(line.startswith(("seed: ", "rounds: ", "out: ")) for line in plain), plain
    assert len(plain) < 40 and plain[-1] == "resolved config: add --show-config to print it"
    assert main(["run", str(path), "--dry-run", "--show-config"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[:len(plain) - 1] == plain[:-1]                # the same summary first, then the whole config
    assert config.from_yaml("\n".join(shown[len(plain) - 1:])) == config.load(str(path), [])


def test_a_dry_run_refused_says_so_without_printing_the_config_first(tmp_path, capsys):
    cfg = small_config(tmp_path / "out", rounds=2, data={"name": "synthetic"},
                       partition={"clients": 8, "scheme": "iid"}, server={"clients_per_round": 4})
    path = write_config(tmp_path / "run.yaml", cfg)
    capsys.readouterr()
    assert main(["run", str(path), "--dry-run", "model.name=myfl_absent_x.nets:Net"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "model.name" in captured.err, captured
    assert main(["run", str(path), "--show-config"]) == 2
    assert "add --dry-run" in capsys.readouterr().err
