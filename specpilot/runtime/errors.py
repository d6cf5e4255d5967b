"""Errors the runtime raises for bad input; the CLI prints them as one line (exit 2)."""


class SpecPilotError(Exception):
    """A problem with the user's input, explained in one line."""


class CheckpointError(SpecPilotError):
    """A checkpoint directory is missing, corrupt or unsupported."""


class RequestError(SpecPilotError):
    """A generation request is invalid (prompt too long, bad ids, ...)."""
