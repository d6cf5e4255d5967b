"""Errors the runtime raises for bad input; the CLI prints them as one line (exit 2). Also
the input checks every command shares (`check_dir`, `check_cuda`, `missing_key`)."""

from __future__ import annotations

from pathlib import Path


class SpecPilotError(Exception):
    """A problem with the user's input, explained in one line."""


class CheckpointError(SpecPilotError):
    """A checkpoint directory is missing, corrupt or unsupported."""


class RequestError(SpecPilotError):
    """A generation request is invalid (prompt too long, bad ids, ...)."""


def check_dir(path: str | Path, what: str, hint: str = "", where: str = "",
              error: type[SpecPilotError] = SpecPilotError) -> Path:
    """`path` when it is a directory, else a one-line `error` that says which way it is
    not: "X is a file, not a <what>" or "<what> X does not exist" (then ": <hint>", what
    to give instead; `where` goes first, e.g. "--out FILE: ")."""
    p = Path(path)
    if not p.is_dir():
        a = "an" if what[0] in "aeiou" else "a"
        msg = f"{p} is a file, not {a} {what}" if p.exists() else f"{what} {p} does not exist"
        raise error(f"{where}{msg}{': ' + hint if hint else ''}")
    return p


def check_cuda(device: str) -> None:
    """For `device` cuda, a one-line error when this machine has no CUDA device (torch is
    imported only then)."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SpecPilotError("--device cuda was asked for but no CUDA device is available: "
                                 "use --device cpu, or a machine with a GPU")


def missing_key(where: str, e: KeyError, kind: str = "key") -> SpecPilotError:
    """The one-line error for a required key (or field) a file lacks, from its KeyError."""
    return SpecPilotError(f"{where}: missing required {kind} {e.args[0]!r}")
