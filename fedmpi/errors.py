"""Errors with a defined exit status (DESIGN §1): 2 for bad configuration or input, 75 for a stop request."""

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
