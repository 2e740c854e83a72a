"""Errors with a defined exit status (docs/explanation/design.md §1): 2 for bad configuration or input, 75 for a stop
request."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130


class FedmpiError(Exception):
    exit_code = EXIT_FAILED


class ConfigError(FedmpiError):
    """One or more configuration problems; each message names the key, the bad value and what is allowed."""

    exit_code = EXIT_USAGE

    def __init__(self, messages):
        if isinstance(messages, str):
            messages = [messages]
        self.messages = list(messages)
        super().__init__("\n".join(self.messages))


class InputError(FedmpiError):
    """A missing or malformed input file; the message says which file was expected where."""

    exit_code = EXIT_USAGE


class StopRequested(FedmpiError):
    """All ranks agreed to stop at a round boundary (SIGTERM/SIGUSR1); a checkpoint was written."""

    exit_code = EXIT_PREEMPTED


class Diverged(FedmpiError):
    """The loss or the global model became non-finite (runtime.on_nonfinite: stop); status `diverged`."""

    exit_code = EXIT_FAILED


class Refused(FedmpiError):
    """Raised on every rank when a collective check refused the run (set-up vote, --resume); the reason was
    already printed once, by the rank that found it."""

    def __init__(self, code):
        super().__init__("")
        self.exit_code = code


def report_lines(error, rank=None):
    """The lines fedmpi prints for an error: `fedmpi: config error: ...` for configuration, `fedmpi: error:
    ...` for input files, `fedmpi: rank R failed: Type: ...` for anything else."""
    if isinstance(error, FedmpiError):
        kind = "config error" if isinstance(error, ConfigError) else "error"
        return [f"fedmpi: {kind}: {line}" for line in str(error).splitlines()]
    where = f"rank {rank} failed: " if rank is not None else ""
    return [f"fedmpi: {where}{type(error).__name__}: {error}"]
