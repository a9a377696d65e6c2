"""The exceptions of `pipeweave`: `Error` for input the user can fix (its message is the line
the CLI prints after `error: `), `PassBug` for a pass that broke a plan (named in the message)."""


class Error(ValueError):
    """Bad input: an expression, an option, a file or a plan pipeweave cannot use. The message
    is the line `pipeweave` prints after `error: ` for the same input."""


class PassBug(Error):
    """A pass produced an invalid plan, changed what its contract says it leaves alone, or
    failed on a plan that met its contract: a bug in that pass, which the message names."""
