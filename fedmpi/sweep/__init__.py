"""`fedmpi sweep SPEC.yaml`: a grid of experiments in one MPI launch (docs/how-to/sweeps.md).

The spec (`spec`) expands into experiments, each a config (`configs`: every problem of every experiment at once);
the launch's world is split into groups of ranks on MPI's own means (`dispatch`: a dispatcher rank hands the
next experiment, largest first, to whichever ranks are free; `group`: the experiment runs on its group's
communicator through `fedmpi run`'s own code path); data sets are loaded once per node (`data`); the sweep's
folder holds one run folder per experiment and `index.csv` (`index`), from which a new start of the same spec
continues (`state`); `results` reads back what a sweep left, experiment by experiment (the paper tools' tables).
"""
