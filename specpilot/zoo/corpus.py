"""The training corpus: Python source of the standard library, listed and split deterministically.

Files are the `.py` files under the stdlib root of the Python that runs (found through
`sysconfig`, its test suite included where installed), sorted by path relative to that
root. Each file's split is a hash of that relative path, so a file is held out on every
machine and every Python version alike; nothing here is downloaded or committed.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..runtime.errors import SpecPilotError

EOT = "<|endoftext|>"
MASK = "<|mask|>"  # the block drafter's placeholder; never in the corpus
HELDOUT_PERCENT = 5
MAX_FILE_CHARS = 300_000  # a few generated tables (pydoc topics) are not code worth learning
SKIP_DIRS = ("site-packages", "lib-dynload", "__pycache__")


@dataclass(frozen=True)
class SourceFile:
    rel: str  # POSIX path relative to the stdlib root
    path: Path
    split: str  # "train" | "heldout"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _bucket(rel: str, salt: str = "") -> int:
    """A stable number in 0..9999 from a relative path (and a salt)."""
    digest = hashlib.sha256((salt + rel).encode()).digest()
    return int.from_bytes(digest[:8], "big") % 10_000


def split_of(rel: str, heldout_percent: int = HELDOUT_PERCENT) -> str:
    return "heldout" if _bucket(rel) < heldout_percent * 100 else "train"


def part_of(rel: str, parts: tuple[str, ...]) -> str:
    """Assign a held-out file to one of `parts` (e.g. dev / gate), disjoint by file."""
    return parts[_bucket(rel, salt="part:") % len(parts)]


def list_files(root: str | Path | None = None) -> list[SourceFile]:
    """Every stdlib `.py` file, sorted by relative path, with its split."""
    root = Path(root) if root else stdlib_root()
    if not root.is_dir():
        raise SpecPilotError(f"no Python standard library at {root}: pass --stdlib DIR")
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).as_posix()
        if any(part in SKIP_DIRS or part.startswith("config-") for part in rel.split("/")[:-1]):
            continue
        if p.is_file():
            out.append(SourceFile(rel, p, split_of(rel)))
    out.sort(key=lambda f: f.rel)
    if not out:
        raise SpecPilotError(f"no .py files under {root}: pass --stdlib DIR")
    return out


def read_source(f: SourceFile) -> str | None:
    """The file's text, or None for files that are not UTF-8 or are too large."""
    try:
        text = f.path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.strip() or len(text) > MAX_FILE_CHARS or EOT in text or MASK in text:
        return None
    return text.replace("\r\n", "\n")


def corpus_texts(files: list[SourceFile], split: str) -> list[tuple[str, str]]:
    """(relative path, text) of the readable files of one split, in file order."""
    out = []
    for f in files:
        if f.split == split:
            text = read_source(f)
            if text is not None:
                out.append((f.rel, text))
    return out
