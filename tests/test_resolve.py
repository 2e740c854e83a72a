"""Issue 37: resolve, then build. `fedmpi.run.resolve` judges a config against the shapes of its data set and
model, purely: importing it and calling it for every registered algorithm leaves torch unimported; it reports
every problem at once; and `--dry-run` and a real run's set-up, which both call it and nothing else for
validation, refuse a config with the same lines, for every registered algorithm under a hostile combination
of keys (generated from the registry, so a new algorithm is covered without an edit here)."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout

import pytest
import yaml
from conftest import ROOT

from fedmpi import config
from fedmpi.algorithms.registry import REGISTRY
from fedmpi.core.model_shape import ModelShape
from fedmpi.data.data_shape import DataShape
from fedmpi.run.resolve import problems, resolve

# A two-layer model with a normalization layer and a projection head, as a value (no torch needed).
MODEL = ModelShape(dim=672, n_params=670, entries=(("0.weight", 0, 600), ("0.bias", 600, 10), ("1.weight", 610, 10),
                                                   ("1.bias", 620, 10), ("3.weight", 630, 30), ("3.bias", 660, 3),
                                                   ("1.running_mean", 663, 9)),
                   linear_layers=("0", "3"), norm_layers=("1",), forward_rep=True, output=(1, 3))
DATA = DataShape(name="synthetic", input_shape=(60,), num_classes=3, n_train=400, n_test=100)


def _cfg(**sections):
    return config.from_dict({"partition": {"clients": 10}, "server": {"clients_per_round": 4}, **sections})


def test_resolving_every_registered_algorithm_leaves_torch_unimported():
    script = textwrap.dedent(f"""
        import sys
        from fedmpi import config
        from fedmpi.algorithms.registry import REGISTRY
        from fedmpi.core.model_shape import ModelShape
        from fedmpi.data.data_shape import DataShape
        from fedmpi.run.resolve import problems
        model = {MODEL!r}
        data = {DATA!r}
        seen = 0
        for name in REGISTRY:
            cfg = config.from_dict({{"algorithm": {{"name": name}}, "partition": {{"clients": 10}},
                                    "server": {{"clients_per_round": 4, "secure_aggregation": "secagg"}},
                                    "attack": {{"name": "sign_flip", "fraction": 0.2}}}})
            problems(cfg, data, model)
            seen += 1
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))[:5]
        print(seen)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) == len(REGISTRY)


def test_the_zoo_names_model_shape_keeps_are_the_builders():
    from fedmpi.core.model_shape import ZOO_MODELS
    from fedmpi.core.models import BUILDERS

    assert tuple(BUILDERS) == ZOO_MODELS


def test_a_good_config_resolves_to_its_plan():
    plan = resolve(_cfg(attack={"name": "sign_flip", "clients": [1, 7]}), DATA, MODEL)
    assert plan.algorithm is REGISTRY["fedavg"]
    assert (plan.num_clients, plan.malicious, plan.personal) == (10, (1, 7), ())
    central = resolve(_cfg(algorithm={"name": "central"}), DATA, MODEL)
    assert central.num_clients == 1
    fedbn = resolve(_cfg(algorithm={"name": "fedbn"}), DATA, MODEL)
    assert fedbn.personal == ("1.weight", "1.bias", "1.running_mean")      # the norm layer's entries


def test_every_problem_is_reported_at_once():
    cfg = _cfg(runtime={"wire_dtype": "bfloat16"}, client={"compress": {"name": "topk", "fraction": 0.1}},
               attack={"name": "backdoor", "target": 5, "fraction": 0.2}, model={"personal": ["9.*"]})
    found = problems(cfg, DATA, ModelShape(**{**MODEL.__dict__, "output": (1, 4)}))
    wanted = ("runtime.wire_dtype: bfloat16 cannot follow client.compress", "attack.target = 5",
              "model.personal: pattern '9.*' matches none", "not (1, 3) for its 3 classes")
    for text in wanted:
        assert sum(text in line for line in found) == 1, (text, found)
    with pytest.raises(config.ConfigError) as refused:
        resolve(cfg, DATA, MODEL)
    assert len(refused.value.messages) == len(found) - 1        # the model's output was right this time


def test_a_model_that_cannot_take_the_inputs_is_named_with_the_data():
    broken = ModelShape(**{**MODEL.__dict__, "output": None, "forward_error": "mat1 and mat2 shapes cannot be "
                                                                              "multiplied", "sample": "shape (5,)"})
    (line,) = problems(_cfg(), DATA, broken)
    assert "model.name = 'lr' cannot take data.name = 'synthetic'" in line and "mat1 and mat2" in line


# -- the two paths agree: --dry-run and a real run's set-up refuse with the same lines ----------------------
HOSTILE = {"server": {"clients_per_round": 2, "sampling": "poisson", "secure_aggregation": "secagg",
                      "aggregator": "median"},
           "runtime": {"wire_dtype": "float16", "threads": 1, "progress": "off"},
           "client": {"vectorize": "on", "batch_size": 10}, "attack": {"name": "min_max", "fraction": 0.5}}


def _lines(argv):
    from fedmpi.cli import main

    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(argv)
    return code, [line for line in err.getvalue().splitlines() if line.startswith("fedmpi: config error")]


@pytest.mark.parametrize("algorithm", sorted(REGISTRY))
def test_dry_run_and_set_up_refuse_alike(algorithm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mapping = {"seed": 1, "rounds": 1, "out": str(tmp_path / "run"), "data": {"name": "synthetic"},
               "partition": {"clients": 2, "scheme": "iid", "samples_per_client": 20}, "model": {"name": "lr"},
               "algorithm": {"name": algorithm}, **HOSTILE}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(mapping))
    dry = _lines(["run", str(path), "--dry-run"])
    real = _lines(["run", str(path)])
    assert dry[0] == real[0] == 2
    assert dry[1] == real[1] and dry[1], (dry, real)
    assert not (tmp_path / "run").exists()      # refused before anything was written
