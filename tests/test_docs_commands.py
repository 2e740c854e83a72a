"""README.md and the tutorials run as written: every command of their ```bash blocks and every ```python block,
in order, in a working folder of its own (a copy of jobs/), and every ```text block after one of them is what
it printed, numbers aside. The convention the pages follow is tests/doc_blocks.py's docstring.

Two lines are not run as written: `make test` (this suite), and `make run` (the quickstart, 30 rounds of a CNN,
about two minutes), whose two commands the test takes from the Makefile and runs for 3 rounds. `sbatch` lines
need a cluster: their options, their script and the config or spec they name are checked here, and what each
script does with them in tests/test_jobs.py and tests/test_sweep_jobs.py. The first study's grid runs once:
README.md and the SLURM tutorial read a copy of its runs (their `fedmpi sweep` line of the same spec then
finds every experiment finished, which is itself the sweep's "the same command continues" path).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import doc_blocks
import pytest
from conftest import ROOT

PAGES = {"README": ROOT / "README.md", "first-study": ROOT / "docs" / "tutorials" / "first-study.md",
         "slurm": ROOT / "docs" / "tutorials" / "slurm.md"}
SMALL_NODE_CPUS = 4      # the first sbatch line of a page must start on a node this small
LARGE_NODE_CPUS = 64     # and none asks more of one node than a large CPU node has
QUICKSTART_ROUNDS = 3    # `make run`'s quickstart in this test (the Makefile's own run has 30)
PAGE_TIMEOUT_S = 1200    # a safety net on a loaded machine; the pages take about a minute each
LANGS = {"bash", "console", "python", "text", "yaml"}


def _sbatch_lines(path):
    return [cmd for block in doc_blocks.blocks(path) if block.lang in ("bash", "console")
            for cmd in doc_blocks.commands(block) if cmd.startswith("sbatch ")]


# --- what the pages say, checked without running them ----------------------------------------------------------

def test_readme_is_a_front_page_of_at_most_200_lines():
    assert len(PAGES["README"].read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=str)
def test_every_block_is_run_shown_or_a_file_of_the_repository(page):
    for block in doc_blocks.blocks(PAGES[page]):
        assert block.lang in LANGS, f"{page} {block.where}: a block in {block.lang!r}, which the test neither runs " \
                                    f"nor knows as shown-only (tests/doc_blocks.py)"
        if block.title and (ROOT / block.title).exists():
            assert block.text == (ROOT / block.title).read_text(), f"{page} {block.where} differs from {block.title}"
        if block.lang in ("bash", "console"):
            assert doc_blocks.commands(block), f"{page} {block.where}: a command block without a command"


@pytest.mark.parametrize("page", PAGES, ids=str)
def test_every_sbatch_line_fits_a_node_and_names_a_valid_config(page):
    lines = _sbatch_lines(PAGES[page])
    for number, command in enumerate(lines):
        job = doc_blocks.sbatch_request(command, ROOT)
        assert job.cpus_per_node <= LARGE_NODE_CPUS, f"{command}: {job.cpus_per_node} CPUs on one node"
        if number == 0:     # the one a reader copies first
            assert int(job.options.get("nodes", 1)) == 1 and job.cpus_per_node <= SMALL_NODE_CPUS, \
                f"{page}'s first sbatch line asks {job.cpus_per_node} CPUs: it cannot start on a small node"
        _check_job_arguments(job, command)


def _check_job_arguments(job, command):
    from fedmpi import config
    from fedmpi.sweep import configs, spec

    name, args = job.script.name, list(job.arguments)
    if name == "slurm_grid.sbatch":
        assert len(configs.build(spec.load(ROOT / args[0]))) > 1
    elif name == "slurm_sweep.sbatch":
        # the script's own plan prints the sbatch line with the --array that covers the grid
        plan = subprocess.run(["bash", str(job.script), "--plan", *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=60)
        assert plan.returncode == 0, plan.stderr
        assert f"--array={job.options['array']} " in plan.stdout, f"{command}\n{plan.stdout}"
    else:
        assert name in ("slurm_cpu.sbatch", "slurm_gpu.sbatch", "slurm_preemptible.sbatch"), command
        config.load(str(ROOT / args[0]), [a for a in args[1:] if "=" in a])
        if name == "slurm_gpu.sbatch":
            assert "gpus-per-node" in job.options and "ntasks-per-node" in job.options


def test_readme_and_slurm_tutorial_start_with_a_small_node_grid():
    for page in ("README", "slurm"):
        first = doc_blocks.sbatch_request(_sbatch_lines(PAGES[page])[0], ROOT)
        assert first.script.name == "slurm_grid.sbatch" and first.cpus_per_node <= SMALL_NODE_CPUS


# --- the pages run ----------------------------------------------------------------------------------------------

def _environment():
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def _working_folder(where):
    where.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "jobs", where / "jobs")
    return where


def _make_run_commands():
    """The recipe of `make run` as the Makefile has it (its install step taken as done), for this Python's
    environment and QUICKSTART_ROUNDS rounds."""
    recipe = subprocess.run(["make", "-s", "-n", "-o", ".venv/.installed", "run"], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert recipe.returncode == 0, recipe.stderr
    lines = [line for line in recipe.stdout.splitlines() if line.strip()]
    assert len(lines) == 2, lines
    assert "fedmpi run jobs/configs/quickstart.yaml" in lines[0] and "fedmpi report " in lines[1], lines
    run, report = (line.replace(".venv/bin/", str(Path(sys.executable).parent) + "/") for line in lines)
    return [f"{run} rounds={QUICKSTART_ROUNDS}", report]


def _run(argv, folder, what, shell=False):
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=folder, env=_environment(), timeout=900)
    printed = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{printed[-4000:]}"
    return printed


def _run_block(block, folder, page):
    """Runs one block of `page`; returns what it printed."""
    if block.lang == "python":
        return _run([sys.executable, "-c", block.text], folder, f"{page} {block.where}")
    printed, chunk = "", []

    def flush():
        nonlocal printed
        if chunk:
            script = "set -e -o pipefail\n" + "\n".join(chunk) + "\n"
            printed += _run(["bash", "-c", script], folder, f"{page} {block.where}: {' / '.join(chunk)}")
            chunk.clear()

    for command in doc_blocks.commands(block):
        if command.startswith("make run"):
            flush()
            for line in _make_run_commands():
                printed += _run(["bash", "-c", line], folder, f"{page} {block.where}: make run: {line}")
        elif doc_blocks.is_run(command):
            chunk.append(command)
    flush()
    return printed


def run_page(page, folder):
    """Every block of the page in order in `folder`; asserts each succeeds and shows what it printed. Returns
    the commands run, for the tests' own checks."""
    ran = []
    for block in doc_blocks.blocks(PAGES[page]):
        if block.title:
            if not (ROOT / block.title).exists():
                (folder / block.title).write_text(block.text)
            continue
        if block.lang not in doc_blocks.RUN_LANGS:
            continue
        printed = _run_block(block, folder, page)
        ran.append(block)
        makes_run = any(c.startswith("make run") for c in doc_blocks.commands(block)) if block.lang == "bash" else False
        for shown in block.output:
            text = shown.text
            if makes_run:       # fewer rounds here: compare the lines without numbers (the table's header)
                text = "\n".join(line for line in text.splitlines() if not re.search(r"\d", line))
            missing = doc_blocks.missing_output(text, printed)
            assert not missing, f"{page} {shown.where} shows lines that {block.where} did not print: {missing}\n" \
                                f"it printed:\n{printed[-4000:]}"
    return ran


@pytest.fixture(scope="module")
def first_study(tmp_path_factory):
    """The first-study tutorial, run as written in a folder of its own."""
    folder = _working_folder(tmp_path_factory.mktemp("first-study"))
    return folder, run_page("first-study", folder)


def _with_first_study_runs(first_study, where):
    folder = _working_folder(where)
    shutil.copytree(first_study[0] / "runs" / "first-study", folder / "runs" / "first-study")
    return folder


@pytest.mark.mpi
@pytest.mark.timeout(PAGE_TIMEOUT_S)
def test_the_first_study_runs_as_written(first_study):
    folder, ran = first_study
    index = (folder / "runs" / "first-study" / "index.csv").read_text().splitlines()
    assert len(index) == 1 + 12 and all(",finished," in row for row in index[1:])
    assert (folder / "runs" / "first-study.png").stat().st_size > 0
    assert (folder / "runs" / "first-study-acc.pdf").stat().st_size > 0
    assert "± 95% CI" in (folder / "runs" / "first-study-table.csv").read_text()
    assert [b.lang for b in ran].count("python") == 1


@pytest.mark.mpi
@pytest.mark.timeout(PAGE_TIMEOUT_S)
def test_the_readme_runs_as_written(first_study, tmp_path):
    folder = _with_first_study_runs(first_study, tmp_path / "readme")
    run_page("README", folder)
    for run in ("quickstart", "beta01", "clipped"):
        assert (folder / "runs" / run / "run.h5").is_file(), run
    assert (folder / "my_fedavg.py").is_file()


@pytest.mark.mpi
@pytest.mark.timeout(PAGE_TIMEOUT_S)
def test_the_slurm_tutorial_runs_as_written(first_study, tmp_path):
    folder = _with_first_study_runs(first_study, tmp_path / "slurm")
    ran = run_page("slurm", folder)
    assert len(ran) >= 3


def test_the_convention_reads_commands_files_and_outputs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('```bash\nfedmpi run a.yaml \\\n    rounds=3   # a comment\n# only a comment\nsbatch x\n```\n'
                    '```text\nround 3/3  acc 0.9100\n...\n```\n'
                    '```python title="m.py"\nX = 1\n```\n```console\n$ fedmpi report runs\nrun  final_acc\n```\n'
                    '```yaml\nbase: x\n```\n```text\nnot an output\n```\n')
    bash, shown, file, console, yaml, text = doc_blocks.blocks(page)
    assert doc_blocks.commands(bash) == ["fedmpi run a.yaml rounds=3   # a comment", "sbatch x"]
    assert [doc_blocks.is_run(c) for c in doc_blocks.commands(bash)] == [True, False]
    assert bash.output == [shown] and file.title == "m.py" and console.output == [] and yaml.output == []
    assert doc_blocks.commands(console) == ["fedmpi report runs"] and text.lang == "text"
    assert doc_blocks.missing_output(shown.text, "round 30/30   acc 0.9660\n") == []
    assert doc_blocks.missing_output(shown.text, "round 3/3  loss 0.9\n") == ["round 3/3  acc 0.9100"]
