#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py): W1 and W3 on the GPU in deterministic mode against the
# reference, -n 2 = -n 3, resume, and the CUDA-aware MPI path; one table. At most 8 minutes on one GPU.
#   bench/gpu_check.sh              on a GPU machine (without a visible GPU it runs as --dry-run)
#   bench/gpu_check.sh --dry-run    the same checks on the CPU with 2 rounds (CI runs this)
# Uses $PYTHON, else the repository's .venv, else python3; mpiexec is looked up beside that Python first.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$here/../.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
export PATH="$(dirname "$python"):$PATH"
exec "$python" "$here/gpu_check.py" "$@"
