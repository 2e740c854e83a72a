"""Checkpoints are not trusted on load (issue 29, finding 3): with the checksum recomputed after a dataset was
rewritten, a checkpoint whose contents do not fit this run (wrong dtype, shape, length, non-finite values,
attribute types) is refused with exit 2 naming the dataset, the expected and the found shape, before run.h5
is touched; the stored config is compared as data and nothing it names is imported; checkpoint files are
written under unique temporary names without following symlinks."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import ROOT, mpiexec, run_fedmpi, small_config, write_config

from fedmpi import config
from fedmpi.algorithms.state import ClientVectors, ServerVectors, declared_specs
from fedmpi.config import ServerConfig
from fedmpi.core.errors import EXIT_USAGE, ConfigError
from fedmpi.io import checkpoint, fork, resume
from fedmpi.io.checkpoint_checks import BadCheckpoint, check_entry, check_like
from fedmpi.io.store import RunLog
from fedmpi.round.server_opt import build_optimizer

PROBE = "trust_probe_module"


def tamper(path, edit):
    """Applies `edit(f)` to the checkpoint file, then recomputes its checksum so that `verify` passes: the
    checks under test are the contents checks, not the checksum."""
    with h5py.File(path, "r+", locking=False) as f:
        edit(f)
        f.attrs["checksum"] = checkpoint.checksum_of(f)
    checkpoint.verify(path)


def replace(name, value):
    def edit(f):
        del f[name]
        f[name] = value
    return edit


def set_attr(name, value):
    def edit(f):
        f.attrs[name] = value
    return edit


def probe_module(folder, marker):
    """A plug-in module that leaves `marker` behind when it is imported."""
    (folder / f"{PROBE}.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")


# -- one process: the checks that need no model -------------------------------------------------------------

def make_cfg(out, **sections):
    return config.from_dict(small_config(out, **{"rounds": 4, "checkpoint": {"every": 2, "keep": 2}, **sections}))


def write_ckpt(cfg, k=2, dim=10):
    w = checkpoint.CheckpointWriter(cfg, k, wall_s=1.0, world_size=1)
    w.put_server_side({"global": np.arange(dim, dtype=np.float32),
                       "optimizer": {"m": np.zeros(dim, dtype=np.float64)}})
    w.put_client(0, {"c_i": np.ones(dim, dtype=np.float32)})
    path = w.commit(cfg.checkpoint.keep)
    log = RunLog.create(os.path.join(cfg.out, "run.h5"), cfg, 1, ["host"], {})
    for t in range(k):
        log.append({"round": t, "test_acc": 0.5})
    log.finish("finished")
    return path


@pytest.mark.parametrize("edit,named", [
    (replace("global", np.arange(10, dtype=np.int8)), r"/global .*dtype int8; expected .*float"),
    (replace("global", np.float32(3.0)), r"/global .*shape \(\) and dtype float32; expected a non-empty vector"),
    (replace("global", np.array([0, np.nan] + [0] * 8, dtype=np.float32)), r"/global .*1 non-finite .*index 1"),
    (replace("optimizer/m", np.full(10, np.inf)), r"/optimizer/m .*10 non-finite"),
    (replace("optimizer/m", np.zeros(10, dtype=np.int64)), r"/optimizer/m .*dtype int64; expected .*float"),
    (set_attr("wall_s", "soon"), r"attribute wall_s is 'soon' \(str\); expected a finite number"),
    (set_attr("wall_s", np.nan), r"attribute wall_s is nan"),
    (set_attr("round", "2"), r"attribute round is '2' \(str\); expected an integer >= 0"),
    (set_attr("round", 2.0), r"attribute round is 2.0 \(float64\); expected an integer"),
    (replace("clients/0/c_i", np.array(["x"], dtype="S1")), r"/clients/0/c_i has dtype \|S1"),
])
def test_resume_refuses_bad_contents_with_a_valid_checksum(tmp_path, edit, named):
    cfg = make_cfg(tmp_path)
    path = write_ckpt(cfg)
    tamper(path, edit)
    with pytest.raises(BadCheckpoint, match=named) as refused:
        resume.choose(cfg, say=lambda text: None)
    assert refused.value.exit_code == EXIT_USAGE and path in str(refused.value)


def test_a_good_checkpoint_still_passes(tmp_path):
    cfg = make_cfg(tmp_path)
    path = write_ckpt(cfg)
    point = resume.choose(cfg, say=lambda text: None)
    assert (point.round, point.path, point.wall_s) == (2, path, 1.0)


def test_shape_refusal_names_dataset_expected_and_found():
    """Not "has 610 entries, the model 610": the dataset, the found shape and dtype, the expected ones."""
    with pytest.raises(BadCheckpoint) as refused:
        check_entry("C.h5", "global", np.zeros(610, dtype=np.int8), (610,), np.float32, True, "the global model")
    assert str(refused.value) == ("checkpoint C.h5: /global (the global model) has shape (610,) and dtype int8; "
                                  "expected shape (610,) of float values (float32)")
    with pytest.raises(BadCheckpoint, match=r"/server/c .*has shape \(609,\) and dtype float32; expected shape "
                                            r"\(610,\) of float values \(float32\)"):
        check_entry("C.h5", "server/c", np.zeros(609, dtype=np.float32), (610,), np.float32, True, "state c")


def test_on_nonfinite_continue_keeps_non_finite_models_resumable(tmp_path):
    cfg = make_cfg(tmp_path, runtime={"threads": 1, "progress": "lines", "on_nonfinite": "continue"})
    path = write_ckpt(cfg)
    tamper(path, replace("global", np.full(10, np.nan, dtype=np.float32)))
    assert resume.choose(cfg, say=lambda text: None).path == path


def test_declared_state_specs_allocate_nothing_and_say_lengths_and_dtypes():
    adam = build_optimizer(ServerConfig(optimizer="adam"), 7, 5)
    assert adam.expected_state() == {"m": ((5,), np.dtype(np.float64)), "v": ((5,), np.dtype(np.float64))}
    assert adam.moments._vectors == {}                    # nothing allocated by asking
    assert build_optimizer(ServerConfig(optimizer="sgd"), 7, 5).expected_state() == {}

    class Owner:
        def __init__(self):
            self.server = ServerVectors(c=5)
            self.controls = ClientVectors("c_i", length=5)
            self.free = ClientVectors("z")

    owner = Owner()
    assert declared_specs(owner, ServerVectors) == {"c": ((5,), np.dtype(np.float32))}
    assert declared_specs(owner, ClientVectors) == {"c_i": ((5,), np.dtype(np.float32)), "z": (None, np.float32)}


def test_state_with_a_fresh_template_keeps_its_dimensions_and_kinds():
    """Participation and stage state: lengths may change (clients in flight), dimensions and kinds not."""
    fresh = {"sim_time_s": np.zeros(1), "in_flight_cid": np.zeros(0, dtype=np.int64)}
    check_like("C.h5", "participation", {"sim_time_s": np.ones(1), "in_flight_cid": np.arange(3)}, fresh, "p")
    with pytest.raises(BadCheckpoint, match=r"/participation/sim_time_s \(p\) has shape \(1,\) and dtype int8; "
                                            r"expected 1-d float values \(float64\)"):
        check_like("C.h5", "participation", {"sim_time_s": np.ones(1, dtype=np.int8)}, fresh, "p")
    with pytest.raises(BadCheckpoint, match=r"in_flight_cid .*shape \(2, 2\)"):
        check_like("C.h5", "participation", {"in_flight_cid": np.zeros((2, 2), dtype=np.int64)}, fresh, "p")


def _store_plugin_config(tmp_path, monkeypatch, cfg, path):
    """Rewrites checkpoint `path`'s stored config to name the importable plug-in PROBE:Algo (checksum kept);
    returns the file PROBE's module creates if it is ever imported."""
    marker = tmp_path / "imported"
    probe_module(tmp_path, marker)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = re.sub(r"(algorithm:\n  name:) fedavg", rf"\1 {PROBE}:Algo", cfg.to_yaml())
    assert PROBE in text
    tamper(path, set_attr("config", text))
    return marker


def test_stored_config_is_compared_without_importing_what_it_names(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path / "run")
    marker = _store_plugin_config(tmp_path, monkeypatch, cfg, write_ckpt(cfg))
    with pytest.raises(ConfigError, match=rf"differs .* in algorithm.name(.|\n)*checkpoint '{PROBE}:Algo', "
                                          r"now 'fedavg'"):
        resume.choose(cfg, say=lambda text: None)
    assert not marker.exists() and PROBE not in sys.modules


def test_a_fork_reads_its_parents_config_without_importing_what_it_names(tmp_path, monkeypatch):
    parent = make_cfg(tmp_path / "parent")
    path = write_ckpt(parent)
    marker = _store_plugin_config(tmp_path, monkeypatch, parent, path)
    point = fork.choose(make_cfg(tmp_path / "child"), f"{tmp_path / 'parent'}@2")
    assert point.round == 2 and point.partial and not marker.exists() and PROBE not in sys.modules
    tamper(path, replace("global", np.arange(10, dtype=np.int8)))
    with pytest.raises(BadCheckpoint, match=r"/global .*dtype int8"):
        fork.choose(make_cfg(tmp_path / "child"), f"{tmp_path / 'parent'}@2")


def test_checkpoint_temporary_files_are_unique_and_never_follow_a_symlink(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    a, b = checkpoint.CheckpointWriter(cfg, 2, 0.0, 1), checkpoint.CheckpointWriter(cfg, 2, 0.0, 1)
    assert a.tmp != b.tmp and os.path.basename(a.tmp).startswith(".ckpt-2-")
    a.discard()
    b.discard()
    # A symlink planted under the very name a writer picks is refused, not followed (O_EXCL | O_NOFOLLOW).
    monkeypatch.setattr(checkpoint.secrets, "token_hex", lambda n: "feedf00d")
    planted = tmp_path / "ckpt" / f".ckpt-4-{os.getpid()}-feedf00d.h5.tmp"
    os.symlink(victim, planted)
    with pytest.raises(FileExistsError):
        checkpoint._create_temporary(str(tmp_path / "ckpt"), 4)
    assert victim.read_text() == "keep me" and os.path.islink(planted)


# -- MPI: the checks against the model, the algorithm and the optimizer, on the rank that loads --------------

# Several `fedmpi run` commands in one launch, going on after a refusal; rank 0 writes the exit codes.
DRIVER = r"""
import json, sys
from fedmpi.cli import main
from mpi4py import MPI
codes = [main(["run", *args]) for args in json.loads(sys.argv[1])]
if MPI.COMM_WORLD.Get_rank() == 0:
    open(sys.argv[2], "w").write(json.dumps(codes))
"""


def run_cases(n, steps, codes_path, env, timeout=420):
    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, "-c", DRIVER,
                           json.dumps([[str(a) for a in step] for step in steps]), str(codes_path)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
    assert proc.returncode == 0 and codes_path.exists(), (
        f"launch -n {n} exited {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-5000:]}")
    return json.loads(codes_path.read_text()), proc.stderr


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def status(run):
    with h5py.File(run / "run.h5", "r", locking=False) as f:
        return str(f.attrs["status"])


def client_with_control(path):
    with h5py.File(path, "r", locking=False) as f:
        return sorted(f["clients"], key=int)[0]


def halve(name):
    def edit(f):
        value = f[name][()]
        del f[name]
        f[name] = value[: value.shape[0] // 2]
    return edit


def drop(name):
    def edit(f):
        del f[name]
    return edit


def case_edits(ckpt):
    """{case: (edit of the checkpoint, what the refusal must say)} for a SCAFFOLD + Adam run."""
    cid = client_with_control(ckpt)
    with h5py.File(ckpt, "r", locking=False) as f:
        dim, n_params, n_c = f["global"].shape[0], f["optimizer/m"].shape[0], f[f"clients/{cid}/c_i"].shape[0]
    return {
        "int8_global": (replace("global", np.zeros(dim, dtype=np.int8)),
                        rf"/global \(the global model\) has shape \({dim},\) and dtype int8; expected shape "
                        rf"\({dim},\) of float values"),
        "short_global": (halve("global"), rf"/global .*has shape \({dim // 2},\) .*expected shape \({dim},\)"),
        "client_control": (halve(f"clients/{cid}/c_i"),
                           rf"/clients/{cid}/c_i \(client {cid}'s c_i\) has shape \({n_c // 2},\) and dtype "
                           rf"float32; expected shape \({n_params},\)"),
        "adam_moment": (halve("optimizer/v"), rf"/optimizer/v .*has shape \({n_params // 2},\) and dtype float64; "
                                              rf"expected shape \({n_params},\) of float values \(float64\)"),
        "server_control": (halve("server/c"), rf"/server/c .*has shape \({n_params // 2},\).*expected shape "
                                              rf"\({n_params},\)"),
        "missing_moment": (drop("optimizer/m"), r"/optimizer/m .*is missing; expected shape"),
        "string_wall_s": (set_attr("wall_s", "12.5"), r"attribute wall_s is '12.5' \(str\)"),
        "plugin_config": (None, r"differs .* in algorithm.name"),
    }


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A finished SCAFFOLD run with server.optimizer adam: server control, client controls and moments."""
    tmp = tmp_path_factory.mktemp("trust")
    run = tmp / "parent"
    cfg = write_config(tmp / "parent.yaml", small_config(
        run, rounds=2, checkpoint={"every": 2, "keep": 2}, algorithm={"name": "scaffold"},
        server={"clients_per_round": 12, "optimizer": "adam", "lr": 0.01}))
    run_fedmpi(3, "run", cfg)
    return tmp, cfg, run


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_resume_refuses_checkpoints_that_do_not_fit_before_touching_run_h5(parent, tmp_path, n):
    _, cfg, run = parent
    marker = tmp_path / "imported"
    probe_module(tmp_path, marker)
    cases = case_edits(run / "ckpt" / "ckpt-2.h5")
    steps, runs = [], {}
    for name, (edit, _) in cases.items():
        out = runs[name] = tmp_path / name
        shutil.copytree(run, out)
        ckpt = out / "ckpt" / "ckpt-2.h5"
        if edit is None:        # the stored config names a plug-in that must never be imported
            text = h5py.File(ckpt, "r", locking=False).attrs["config"]
            edit = set_attr("config", re.sub(r"(algorithm:\n  name:) scaffold", rf"\1 {PROBE}:Algo", text))
        tamper(ckpt, edit)
        steps.append([cfg, f"out={out}", "rounds=3", "--resume"])
    fork_out = tmp_path / "fork"        # a fork loads through the same checks: nothing is created in its out
    steps.append([cfg, f"out={fork_out}", "rounds=3", "--fork-from", f"{runs['client_control']}@2"])
    good = tmp_path / "good"
    shutil.copytree(run, good)
    steps.append([cfg, f"out={good}", "rounds=3", "--resume"])      # the untampered copy still resumes
    before = {name: digest(out / "run.h5") for name, out in runs.items()}
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    codes, stderr = run_cases(n, steps, tmp_path / "codes.json", env)
    assert codes == [EXIT_USAGE] * (len(cases) + 1) + [0], stderr
    for name, (_, said) in cases.items():
        assert re.search(said, stderr), (name, said, stderr[-3000:])
        assert digest(runs[name] / "run.h5") == before[name] and status(runs[name]) == "finished", name
    assert not marker.exists(), "the stored config's module:Class was imported"
    assert not (fork_out / "run.h5").exists()
    assert "Traceback" not in stderr
    assert status(good) == "finished"
    with h5py.File(good / "run.h5", "r", locking=False) as f:
        assert f["metrics/round"].shape[0] == 3


# -- issue 39: every dataset a resume reads is checked before it is used ------------------------------------

def test_state_with_a_fresh_template_is_not_emptied_and_keeps_single_values_single():
    fresh = {"sim_time_s": np.zeros(1), "in_flight_cid": np.zeros(0, dtype=np.int64), "w": np.zeros(3)}
    check_like("C.h5", "participation", {"in_flight_cid": np.zeros(0, dtype=np.int64), "w": np.ones(5)}, fresh, "p")
    for stored, said in [({"sim_time_s": np.zeros(0)}, r"sim_time_s \(p\) has shape \(0,\) .*, shape \(1,\)"),
                         ({"sim_time_s": np.zeros(3)}, r"sim_time_s \(p\) has shape \(3,\)"),
                         ({"w": np.zeros(0)}, r"/participation/w \(p\) has shape \(0,\) .*, at least one value"),
                         ({"sim_time_s": np.array([np.nan])}, r"sim_time_s \(p\) has 1 non-finite values")]:
        with pytest.raises(BadCheckpoint, match=said):
            check_like("C.h5", "participation", stored, fresh, "p")
    check_like("C.h5", "server", {"loss": np.array([np.nan])}, {"loss": np.array([np.nan])}, "s", finite=False)


CLOCK = {"speed": {"kind": "lognormal", "value": 5.0, "sigma": 0.7},
         "bandwidth": {"kind": "lognormal", "up": 2.0e+5, "down": 1.0e+6, "sigma": 0.7}}


def empty(name):
    def edit(f):
        value = f[name][()]
        del f[name]
        f[name] = value.reshape(-1)[:0].reshape((0,) + value.shape[1:]) if value.ndim else np.zeros(0, value.dtype)
    return edit


@pytest.mark.mpi
def test_resume_refuses_any_emptied_dataset_naming_checkpoint_and_dataset(tmp_path):
    """Each dataset of a SCAFFOLD + Adam checkpoint under a simulated clock (/participation/sim_time_s) emptied
    in turn (one client's state standing for all), and the clock made NaN or three values: every resume
    exits 2 with one line naming the checkpoint and the dataset, before run.h5 is touched (main: an
    IndexError for the emptied clock)."""
    run = tmp_path / "parent"
    cfg = write_config(tmp_path / "parent.yaml", small_config(
        run, rounds=2, checkpoint={"every": 2, "keep": 2}, algorithm={"name": "scaffold"}, clients=CLOCK,
        server={"clients_per_round": 4, "optimizer": "adam", "lr": 0.01}))
    run_fedmpi(1, "run", cfg)
    ckpt = run / "ckpt" / "ckpt-2.h5"
    cid = client_with_control(ckpt)
    names = []
    with h5py.File(ckpt, "r", locking=False) as f:
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) and (
            not name.startswith("clients/") or name.startswith(f"clients/{cid}/")) else None)
    assert "participation/sim_time_s" in names and "global" in names
    cases = {name: empty(name) for name in names}
    cases["nan clock"] = replace("participation/sim_time_s", np.array([np.nan]))
    cases["three clocks"] = replace("participation/sim_time_s", np.zeros(3))
    steps, outs = [], {}
    for i, (case, edit) in enumerate(cases.items()):
        out = outs[case] = tmp_path / f"case{i}"
        shutil.copytree(run, out)
        tamper(out / "ckpt" / "ckpt-2.h5", edit)
        steps.append([cfg, f"out={out}", "rounds=3", "--resume"])
    before = {case: digest(out / "run.h5") for case, out in outs.items()}
    codes, stderr = run_cases(1, steps, tmp_path / "codes.json", {})
    assert codes == [EXIT_USAGE] * len(cases), stderr[-5000:]
    lines = [line for line in stderr.splitlines() if line.startswith("fedmpi:")]
    assert len(lines) == len(cases) and "Traceback" not in stderr, stderr[-5000:]
    for line, (case, out) in zip(lines, outs.items()):
        name = "participation/sim_time_s" if case.endswith("clock" + "s" * case.startswith("three")) else case
        assert f"checkpoint {out / 'ckpt' / 'ckpt-2.h5'}: /{name} " in line, (case, line)
        assert digest(out / "run.h5") == before[case] and status(out) == "finished", case
