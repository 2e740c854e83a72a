"""model.name: causal_lm under mpiexec (issue 54): the LoRA example gives the same results at -n 1, 2 and 3, the
ranks of a node hold one copy of the frozen base (views of one shared window), and --resume / --fork-from refuse
a base other than the one the run trained on. Small GPT-2s (width 32, 2 layers) on the LEAF Shakespeare test
files; every draw seeded."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, mpiexec, read_global, read_metrics, run_fedmpi, write_config
from dataset_files import write_leaf

from fedmpi.config import LoraConfig, ModelConfig
from fedmpi.core import shared_base
from fedmpi.core.models import build_model
from fedmpi.mpi.shared_arrays import SHARED_ALIGN

pytestmark = pytest.mark.mpi
pytest.importorskip("transformers")
pytest.importorskip("peft")

ARCH = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 80}
EXAMPLE = ROOT / "jobs" / "configs" / "shakespeare_lora.yaml"


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm") / "shakespeare"
    write_leaf(root, "shakespeare", users_train=(12, 9, 10), users_test=(3, 3, 2))
    return root


@pytest.fixture(scope="module")
def example_runs(shakespeare):
    """The example config at rounds=2 on -n 1, 2 and 3."""
    outs = {}
    for n in (1, 2, 3):
        outs[n] = shakespeare.parent / f"example-n{n}"
        run_fedmpi(n, "run", EXAMPLE, f"data.root={shakespeare}", f"out={outs[n]}", "rounds=2", "--overwrite")
    return outs


def test_the_example_gives_the_same_results_at_every_n(example_runs):
    metrics, attrs = read_metrics(example_runs[1])
    glob = read_global(example_runs[1])
    # the adapters alone: 2 layers of A [8, 32] and B [96, 8] on c_attn; 3 clients a round upload them whole
    assert attrs["dim"] == 2 * (8 * 32 + 96 * 8) == glob.size
    assert np.all(metrics["bytes_up"] == 3 * 4 * attrs["dim"]) and len(metrics["round"]) == 2
    assert len(attrs["base_sha256"]) == 64 and np.isfinite(metrics["test_loss"][-1])    # evaluated at the end
    assert np.any(glob[512:768] != 0)      # B (zero at the start) moved: the adapters trained
    for n in (2, 3):
        m, a = read_metrics(example_runs[n])
        assert a["world_size"] == n and a["base_sha256"] == attrs["base_sha256"]
        assert np.array_equal(read_global(example_runs[n]), glob)
        for key in ("train_loss", "test_loss", "test_acc", "bytes_up"):
            assert np.array_equal(m[key], metrics[key], equal_nan=True), (n, key)


SHARE_SCRIPT = """
import json, sys
import numpy as np, torch
from mpi4py import MPI
from fedmpi.config import LoraConfig, ModelConfig
from fedmpi.core import shared_base
from fedmpi.core.flat import FlatModel
from fedmpi.core.models import build_model
from fedmpi.mpi.comm import make_comm

comm = make_comm()
comm.node_local(0)
torch.manual_seed(0)
model = build_model(ModelConfig(name="causal_lm", arch=json.loads(sys.argv[1])), (80,), 80, LoraConfig()).eval()
x = torch.from_numpy(np.random.default_rng(0).integers(0, 80, (2, 80)))
with torch.no_grad():
    before = model(x)
private = {n: t.clone() for n, t in shared_base.frozen_tensors(model).items()}
shared_base.share_base(model, comm)
flat = FlatModel(model)      # as set-up makes it next: the views must stay views
buffer, _ = comm._windows[-1].Shared_query(0)
start = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
end = start + len(buffer)
frozen = shared_base.frozen_tensors(model)
inside = all(start <= t.data_ptr() and t.data_ptr() + t.numel() * 4 <= end for t in frozen.values())
same = all(torch.equal(t, private[n]) for n, t in frozen.items())
lm = model.lm.base_model.model
tied = lm.lm_head.weight.data_ptr() == lm.transformer.wte.weight.data_ptr()
with torch.no_grad():
    after = model(x)
# one memory: what the node's first rank writes into its view, the others read in theirs
wte = lm.transformer.wte.weight
MPI.COMM_WORLD.Barrier()
if comm.rank == 0:
    with torch.no_grad():
        wte[0, 0] = 1234.5
MPI.COMM_WORLD.Barrier()
seen = float(wte[0, 0])
grad = any(t.requires_grad for t in frozen.values())
rows = MPI.COMM_WORLD.gather(dict(inside=inside, same=same, tied=tied, seen=seen, bytes=len(buffer), dim=flat.dim,
                                  forward=bool(torch.equal(before, after)), grad=grad))
if comm.rank == 0:
    print(json.dumps(rows))
comm.close()
"""


def test_the_ranks_of_a_node_hold_views_of_one_base():
    proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-c", SHARE_SCRIPT, json.dumps(ARCH)],
                          capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="causal_lm", arch=ARCH), (80,), 80, LoraConfig())
    frozen = shared_base.frozen_tensors(model)
    base_bytes = sum(t.numel() * 4 for t in frozen.values())
    assert len(rows) == 3
    for row in rows:
        assert row["inside"] and row["same"] and row["tied"] and row["forward"] and not row["grad"]
        assert row["dim"] == 2 * (8 * 32 + 96 * 8)        # the adapters alone in the flat vector
        assert row["seen"] == 1234.5        # rank 0's write is in every rank's view: one copy on the node
        # the base once: each tensor starts on a page (fedmpi.mpi.shared_arrays.SHARED_ALIGN)
        assert base_bytes <= row["bytes"] < base_bytes + SHARED_ALIGN * len(frozen)


def _saved_base(folder, seed):
    torch.manual_seed(seed)
    model = build_model(ModelConfig(name="causal_lm", arch=ARCH), (80,), 80, LoraConfig(rank=None))
    model.lm.save_pretrained(folder)


def test_resume_and_fork_refuse_another_base_and_resume_equals_no_interruption(shakespeare, tmp_path):
    base = tmp_path / "base"
    _saved_base(base, seed=1)
    mapping = {"seed": 4, "rounds": 2, "out": str(tmp_path / "run"),
               "data": {"name": "shakespeare", "root": str(shakespeare)},
               "partition": {"clients": 3, "scheme": "natural"},
               "model": {"name": "causal_lm", "path": str(base)}, "lora": {"rank": 4},
               "client": {"lr": 0.5, "batch_size": 4, "steps": 2}, "server": {"clients_per_round": 2},
               "checkpoint": {"every": 1}, "runtime": {"threads": 1, "progress": "off"}}
    cfg = write_config(tmp_path / "lm.yaml", mapping)
    run_fedmpi(2, "run", cfg, "--overwrite")
    run_fedmpi(2, "run", cfg, f"out={tmp_path / 'straight'}", "rounds=3", "--overwrite")

    _saved_base(base, seed=2)       # the same folder, other weights: the config (and its hash) unchanged
    for args in (("rounds=3", "--resume"), (f"out={tmp_path / 'fork'}", f"--fork-from={tmp_path / 'run'}@1")):
        proc = run_fedmpi(2, "run", cfg, *args, check=False)
        assert proc.returncode == 2, proc.stderr[-2000:]
        text = proc.stdout + proc.stderr
        assert f"model.path = '{base}'" in text and "frozen base model differs" in text, text[-2000:]
        assert args[-1].split("=")[0] in text
    assert not (tmp_path / "fork").exists()

    _saved_base(base, seed=1)       # the base it trained on: resuming is allowed and changes nothing
    run_fedmpi(3, "run", cfg, "rounds=3", "--resume")
    assert np.array_equal(read_global(tmp_path / "run"), read_global(tmp_path / "straight"))
    resumed, attrs = read_metrics(tmp_path / "run")
    straight, _ = read_metrics(tmp_path / "straight")
    assert np.array_equal(resumed["test_loss"], straight["test_loss"]) and len(resumed["round"]) == 3
