#!/usr/bin/env bash
# One fedmpi experiment on this machine under MPI: rank 0 is the server, every other rank hosts clients.
#
#   jobs/workstation.sh CONFIG.yaml [key=value ...] [--resume | --overwrite | --dry-run]
#   NP=5 OVERRIDES="rounds=200 seed=1" jobs/workstation.sh jobs/configs/quickstart.yaml
#
# Everything after the config goes to `fedmpi run` unchanged (overrides and flags alike).
#
# Rank count, unless NP is set: 1 + the number of GPUs where there are GPUs (one worker per GPU; the
# server shares the first one, it only aggregates and evaluates), else 1 + the usable cores capped at
# MAX_WORKERS: the server sleeps while the clients train, so the cores go to the workers, and beyond a
# few workers per round's clients more ranks only idle.
#
# Environment:
#   NP            total ranks (server + workers); default as above
#   MAX_WORKERS   cap on CPU workers when NP is not set (default 8)
#   OVERRIDES     extra key=value overrides, space-separated, appended after the arguments
#   MPIEXEC       the MPI launcher (default: mpiexec on PATH, else the repository's .venv/bin/mpiexec)
#   MPIEXEC_ARGS  extra launcher arguments, space-separated, e.g. "-bind-to core"
#   FEDMPI        the fedmpi command (default: fedmpi on PATH, else .venv/bin/fedmpi, else python3 -m fedmpi)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv_bin=$here/../.venv/bin

if [[ $# -lt 1 ]]; then
    echo "usage: $0 CONFIG.yaml [key=value ...] [--resume | --overwrite | --dry-run]" >&2
    exit 2
fi

# Prefer what is on PATH (an activated environment, a site module), then this checkout's .venv.
find_tool() {
    if command -v "$1" > /dev/null; then
        echo "$1"
    elif [[ -x $venv_bin/$1 ]]; then
        echo "$venv_bin/$1"
    fi
}

count_gpus() {
    # CUDA_VISIBLE_DEVICES restricts what torch sees, so it wins over the hardware count.
    if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
        local ids
        IFS=, read -r -a ids <<< "$CUDA_VISIBLE_DEVICES"
        echo "${#ids[@]}"
    elif command -v nvidia-smi > /dev/null; then
        nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true
    else
        echo 0
    fi
}

if [[ -z ${NP:-} ]]; then
    gpus=$(count_gpus)
    if ((gpus > 0)); then
        NP=$((gpus + 1))
    else
        workers=$(nproc)
        if ((workers > ${MAX_WORKERS:-8})); then workers=${MAX_WORKERS:-8}; fi
        NP=$((workers + 1))
    fi
fi

launcher=${MPIEXEC:-$(find_tool mpiexec)}
if [[ -z $launcher ]]; then
    echo "$0: no mpiexec on PATH or in $venv_bin; set MPIEXEC or install MPI (pip install mpich)" >&2
    exit 2
fi
if [[ -n ${FEDMPI:-} ]]; then
    read -r -a fedmpi <<< "$FEDMPI"
elif tool=$(find_tool fedmpi) && [[ -n $tool ]]; then
    fedmpi=("$tool")
else
    fedmpi=(python3 -m fedmpi)
fi
read -r -a launcher_args <<< "${MPIEXEC_ARGS:-}"
read -r -a env_overrides <<< "${OVERRIDES:-}"

cmd=("$launcher" -n "$NP" ${launcher_args[@]+"${launcher_args[@]}"} "${fedmpi[@]}" run "$@"
     ${env_overrides[@]+"${env_overrides[@]}"})
echo "+ ${cmd[*]}" >&2
exec "${cmd[@]}"
