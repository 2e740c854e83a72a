"""Out-of-tree algorithms (issue 11 item 3): a package outside fedmpi, written by the tests into a
temporary folder (its class and keys, nothing else), run by `algorithm.name: extpkg.tiny:TinyMomentum` under
`mpiexec -n 3` with checkpoints and a bit-identical --resume, and found through the entry-point group
`fedmpi.algorithms` from a `*.dist-info` beside it (importlib.metadata, no pip install). An algorithm written
against the AlgorithmContext (`extpkg.context:Coverage`, issue 23: seed, N, the client schedule and the
participation history on both sides) runs at -n 3 with a bit-identical --resume and equals -n 1. Classes
that break the contract they declare, on the class or on the instance, are refused with exit 2, naming the
problem, before anything is written.
"""

from __future__ import annotations

import sys

import extension_runs as ext
import h5py
import numpy as np
import pytest
from conftest import read_global, read_metrics, run_fedmpi, small_config, write_config

import fedmpi
from fedmpi import config
from fedmpi.algorithms import algorithm_context
from fedmpi.algorithms.registry import lookup
from fedmpi.cli import main
from fedmpi.core import rng
from fedmpi.core.errors import ConfigError

CONTEXT = "extpkg.context:Coverage"


@pytest.fixture(scope="module")
def runs(request):
    return ext.shared(request)


@pytest.fixture
def external_package(tmp_path, monkeypatch):
    """The package importable in this process, and its entry point visible to importlib.metadata."""
    site = ext.write_external_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in [m for m in sys.modules if m == "extpkg" or m.startswith("extpkg.")]:
        del sys.modules[name]


# --- under mpiexec -n 3 -------------------------------------------------------------------------------------

@pytest.mark.mpi
def test_external_algorithm_runs_with_its_state_in_the_checkpoints(runs):
    metrics, attrs = read_metrics(runs["external"])
    assert attrs["status"] == "finished" and attrs["world_size"] == 3
    assert attrs["algorithm"] == "extpkg.tiny:TinyMomentum" and len(metrics["round"]) == ext.R
    assert np.all(np.isfinite(metrics["test_loss"])) and metrics["test_acc"][-1] > 0.5   # chance is 0.1
    with h5py.File(runs["external"] / "ckpt" / f"ckpt-{ext.EVERY}.h5", "r", locking=False) as f:
        dim = f["global"].shape[0]
        velocity = f["server/m"][()]
        assert velocity.dtype == np.float64 and velocity.shape == (dim,) and np.any(velocity != 0)
        # Two rounds of five clients: between five and ten clients trained, and only they have a vector.
        assert 5 <= len(f["clients"]) <= 10
        for cid in f["clients"]:
            last = f["clients"][cid]["last"][()]
            assert last.dtype == np.float32 and last.shape == (dim,) and np.any(last != 0)


@pytest.mark.mpi
def test_external_algorithm_resumes_bit_identically(runs):
    whole, _ = read_metrics(runs["external"])
    resumed, attrs = read_metrics(runs["external-resumed"])
    assert attrs["status"] == "finished" and len(resumed["round"]) == ext.R
    for metric in ("test_acc", "test_loss", "train_loss", "bytes_up", "client_lr", "server_lr"):
        assert np.array_equal(resumed[metric], whole[metric]), metric
    assert np.array_equal(read_global(runs["external-resumed"]), read_global(runs["external"]))


@pytest.mark.mpi
def test_entry_point_runs_the_same_class(runs):
    by_name, attrs = read_metrics(runs["entry_point"])
    by_path, _ = read_metrics(runs["external"])
    assert attrs["algorithm"] == ext.ENTRY_POINT
    assert np.array_equal(by_name["test_loss"], by_path["test_loss"])
    assert np.array_equal(read_global(runs["entry_point"]), read_global(runs["external"]))


@pytest.mark.mpi
def test_one_rank_equals_three(runs, external_package):
    """fedmpi.simulate (-n 1: every client on one rank) against the -n 3 run (clients on two workers)."""
    result = fedmpi.simulate(runs["configs"]["external"])
    metrics, _ = read_metrics(runs["external"])
    np.testing.assert_allclose(result.metrics["test_loss"], metrics["test_loss"], rtol=1e-5)
    np.testing.assert_allclose(result.model, read_global(runs["external"]), rtol=1e-5, atol=1e-7)


@pytest.mark.mpi
def test_context_algorithm_resumes_bit_identically_with_its_history_counts(runs):
    whole, attrs = read_metrics(runs["context"])
    resumed, _ = read_metrics(runs["context-resumed"])
    assert attrs["status"] == "finished" and attrs["world_size"] == 3 and attrs["algorithm"] == CONTEXT
    assert np.all(np.isfinite(whole["test_loss"])) and whole["test_acc"][-1] > 0.3   # chance is 0.1
    for metric in ("test_acc", "test_loss", "train_loss", "coverage", "client_lr", "server_lr"):
        assert np.array_equal(resumed[metric], whole[metric]), metric
    assert np.array_equal(read_global(runs["context-resumed"]), read_global(runs["context"]))
    # The server's counts come from context.history on rank 0: the standard draw of each round so far.
    seed, n, s = 1, 12, 5
    with h5py.File(runs["context"] / "ckpt" / f"ckpt-{ext.EVERY}.h5", "r", locking=False) as f:
        times = f["server/times"][()]
    want = np.zeros(n)
    for t in range(ext.EVERY):
        want[rng.select_clients(seed, t, n, s)] += 1
    assert times.dtype == np.float64 and np.array_equal(times, want)
    seen = np.zeros(n, dtype=bool)
    for t in range(ext.R):
        seen[rng.select_clients(seed, t, n, s)] = True
        assert whole["coverage"][t] == seen.mean()


@pytest.mark.mpi
def test_context_algorithm_one_rank_equals_three(runs, external_package):
    result = fedmpi.simulate(runs["configs"]["context"])
    metrics, _ = read_metrics(runs["context"])
    np.testing.assert_array_equal(result.metrics["coverage"], metrics["coverage"])
    np.testing.assert_allclose(result.metrics["test_loss"], metrics["test_loss"], rtol=1e-5)
    np.testing.assert_allclose(result.model, read_global(runs["context"]), rtol=1e-5, atol=1e-7)


# --- lookup and refusals, in-process ------------------------------------------------------------------------

def test_entry_point_and_module_path_name_the_same_class(external_package):
    import extpkg.tiny

    assert lookup(ext.ENTRY_POINT) is extpkg.tiny.TinyMomentum
    assert lookup("extpkg.tiny:TinyMomentum") is extpkg.tiny.TinyMomentum
    with pytest.raises(ConfigError, match=f"available: .*{ext.ENTRY_POINT}"):
        lookup("tiny_momentun")
    with pytest.raises(ConfigError, match="cannot load extpkg.nowhere:Algo"):
        lookup("extpkg.nowhere:Algo")


@pytest.mark.parametrize("cls,problem", [
    ("VectorizableWithHook", "declares vectorizable but has its own protocol, gradient or step hook, or loss"),
    ("NoAccumulate", "leaves abstract hooks unimplemented: accumulate"),
    ("VectorizableWithInstanceHook", "algorithm class extpkg.broken.VectorizableWithInstanceHook declares "
                                     "vectorizable = True but sets grad_hook on the instance"),
])
def test_a_class_that_breaks_its_contract_is_refused_with_exit_2(external_package, tmp_path, capsys, cls, problem):
    cfg = write_config(tmp_path / "broken.yaml",
                       small_config(tmp_path / "out", algorithm={"name": f"extpkg.broken:{cls}"}))
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"algorithm.name = 'extpkg.broken:{cls}'" in err and problem in err
    assert not (tmp_path / "out" / "run.h5").exists() and not (tmp_path / "out" / "ckpt").exists()


@pytest.mark.mpi
def test_undeclared_client_state_is_refused_at_set_up_with_one_line(tmp_path):
    site = ext.write_external_package(tmp_path / "site")
    cfg = write_config(tmp_path / "state.yaml", small_config(
        tmp_path / "out", algorithm={"name": "extpkg.broken:UndeclaredClientState"}))
    proc = run_fedmpi(3, "run", cfg, env={"PYTHONPATH": ext.pythonpath(site)}, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fedmpi:")]   # (not the data's progress)
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "keeps per-client vectors (memory)" in lines[0] and "keeps_client_state" in lines[0]
    assert not (tmp_path / "out" / "run.h5").exists() and not (tmp_path / "out" / "ckpt").exists()


@pytest.mark.parametrize("hook", ["grad_hook", "step_hook", "loss_fn"])
def test_a_per_instance_training_hook_on_a_vectorizable_class_is_refused(external_package, hook):
    """The class passes registration (no hook on the class); the instance sets one in __init__."""
    from extpkg.broken import VectorizableWithInstanceHook

    class NotVectorizable(VectorizableWithInstanceHook):
        vectorizable = False

    assert lookup("extpkg.broken:VectorizableWithInstanceHook") is VectorizableWithInstanceHook
    cfg = config.from_dict({})
    context = algorithm_context(cfg, 2, 2)
    for cls in (VectorizableWithInstanceHook, NotVectorizable):
        algo = cls(cfg.algorithm, context)
        algo.grad_hook = None          # None is no hook
        algo.verify_declarations()
        setattr(algo, hook, lambda *args: None)
        if cls is NotVectorizable:     # a class that is not vectorizable may set any hook on its instance
            algo.verify_declarations()
            continue
        with pytest.raises(ConfigError, match=f"declares vectorizable = True but sets {hook} on the instance") as e:
            algo.verify_declarations()
        assert e.value.exit_code == 2


def test_a_fixed_cohort_declaration_must_be_a_reason():
    from fedmpi.algorithms.fedavg import FedAvg
    from fedmpi.algorithms.registry import check_declarations

    class Flagged(FedAvg):
        fixed_cohort_only = True       # a flag, not the reason the message needs

    with pytest.raises(TypeError, match="fixed_cohort_only must be a str"):
        check_declarations(Flagged)
