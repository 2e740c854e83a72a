"""One experiment from start to end: the run loop on every rank (`launch`), the in-process API
(`fedmpi.simulate`), progress output and memory accounting."""
