"""Run files and checkpoints: the HDF5 run log, checkpoints and forks, output directories, file-path
checks."""
