"""Static checks on a candidate's overlay: guilty until proven fast *and* correct.

Edits may only touch the editable runtime and kernel files. Within them, an edit may not
add or remove code that deals with timing, synchronisation, streams, the process or the
file system, nor add try/except fallbacks (the known ways to fool a benchmark), and the
resulting file must still compile. A tuned kernel table (`specpilot/kernels/tuned/*.json`,
data, not code) must parse as a `TunedTable` whose every entry is a valid kernel config.
"""

from __future__ import annotations

import difflib
import json
import re

from ..engines import OVERLAY_DIRS, is_tuned_table
from .candidate import stock_file

#: repo path prefixes a candidate may edit
EDITABLE = OVERLAY_DIRS
#: files under EDITABLE that are still off limits (knob parsing, errors, harness glue)
FORBIDDEN_FILES = ("specpilot/runtime/errors.py", "specpilot/runtime/knobs.py",
                   "specpilot/runtime/tokenizer.py", "specpilot/kernels/tuning.py",
                   "specpilot/runtime/server.py")

#: (pattern, why) — matched against every added or removed line
BANNED = [
    (r"\btime\.|\bperf_counter\b|\bmonotonic\b|\bprocess_time\b|import time\b", "timing"),
    (r"\bsynchronize\b|\bEvent\(|elapsed_time", "synchronisation"),
    (r"\bStream\b|\.stream\(|current_stream|default_stream", "CUDA streams"),
    (r"^\s*try\s*:|^\s*except\b|^\s*finally\s*:|contextlib\.suppress", "try/except fallback"),
    ((r"\bimport\s+(os|sys|subprocess|socket|pickle|shutil|importlib|builtins|ctypes)\b|"
     r"\bfrom\s+(os|sys|subprocess|socket|pickle|shutil|importlib|builtins|ctypes)\b"),
     "process/system access"),
    (r"__import__|\beval\(|\bexec\(|\bopen\(|\bglobals\(\)|sys\.modules|setattr\(\s*(time|torch)",
     "dynamic code or file access"),
    ((r"\bspecpilot\.(bench|forcing|agents|engines|trace|costmodel)\b|"
     r"from\s+\.\.+(bench|forcing|agents|engines|trace|costmodel)\b"), "the evaluation harness"),
    (r"lru_cache|\bfunctools\.cache\b|_CACHE\s*=|@cache\b", "caching results across calls"),
]


def changed_lines(old: str, new: str) -> list[str]:
    """Lines added or removed between two versions of a file."""
    out = []
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
        if line.startswith(("+++", "---", "@@")):
            continue
        if line[:1] in "+-":
            out.append(line[1:])
    return out


def check_path(path: str) -> str | None:
    if is_tuned_table(path):
        return None
    if not path.startswith(EDITABLE) or not path.endswith(".py"):
        return f"edits {path}, outside the editable runtime/kernel files"
    if path in FORBIDDEN_FILES:
        return f"edits {path}, which candidates may not change"
    return None


def check_overlay(overlay: dict[str, str]) -> list[str]:
    """Every reason the overlay is unacceptable (empty when it passes)."""
    problems = []
    for path in sorted(overlay):
        why = check_path(path)
        if why:
            problems.append(why)
            continue
        if is_tuned_table(path):
            problems += check_table(path, overlay[path])
            continue
        try:
            old = stock_file(path)
        except Exception as e:  # noqa: BLE001 - report, do not crash the search
            problems.append(str(e))
            continue
        new = overlay[path]
        for line in changed_lines(old, new):
            for pat, what in BANNED:
                if re.search(pat, line):
                    problems.append(f"{path}: touches {what}: {line.strip()[:80]!r}")
                    break
        try:
            compile(new, path, "exec")
        except SyntaxError as e:
            problems.append(f"{path}: does not compile (line {e.lineno}: {e.msg})")
    return problems


def check_table(path: str, text: str) -> list[str]:
    """Why a tuned kernel table is unacceptable (empty when it is a valid table)."""
    from ..kernels.w12_triton import KernelConfig

    try:
        d = json.loads(text)
        if not isinstance(d, dict) or not isinstance(d.get("device"), str) \
                or not isinstance(d.get("entries"), dict) or set(d) - {"device", "entries"}:
            return [f"{path}: a tuned table is {{device, entries}} and nothing else"]
        for key, e in d["entries"].items():
            if not re.fullmatch(r"(w12|bf16|cublas):\d+x\d+:b\d+", key):
                raise ValueError(f"bad key {key!r}")
            KernelConfig.from_dict(e["config"])
            float(e["median_us"])
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        return [f"{path}: not a valid tuned kernel table ({type(e).__name__}: {str(e)[:80]})"]
    return []


def check_edit_paths(paths) -> list[str]:
    return [w for w in (check_path(p) for p in paths) if w]
