"""Files written whole or not at all: a temporary file beside the target, renamed over it."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = None) -> Iterator:
    """A file object whose contents replace `path` when the block ends without an error (the
    temporary file is removed otherwise): a reader never sees half a file, and an old file
    survives a failed write. Mode 0644 (mkstemp makes 0600; results are meant to be shared)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj) -> None:
    """`obj` as indented JSON, written atomically."""
    with atomic_write(path) as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
