"""Workloads: prompt sets, either written by the project (JSONL) or recipes materialised here.

`workloads/NAME.toml` is a recipe: prompts cut at natural boundaries (a `def`, a `class`,
a blank line) from held-out files of the local Python standard library, chosen with a
seeded RNG. Materialising is deterministic for a given stdlib; the items are written to
`data_dir()/workloads/NAME-<hash>.jsonl` and `Workload.hash` (sha256 of the items) goes
into every result, so prompt sets from different Python versions are never mixed up.
`workloads/NAME.jsonl` (rows of id, dataset, prompt[, reference]) is used as it is.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..atomic import atomic_write
from ..deployment import ROOT, data_dir
from ..runtime.errors import SpecPilotError, missing_key

CUT_RULES = ("def-class-blank", "def-class")
_HEADER = re.compile(r"[ \t]*(async[ \t]+def|def|class)[ \t]")


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:200]


@dataclass(frozen=True)
class WorkloadItem:
    id: str
    dataset: str
    prompt: str
    reference: str | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    hash: str  # sha256 of the canonical JSON of the items
    items: list[WorkloadItem] = field(default_factory=list)
    source: str = ""  # the recipe or JSONL file it came from
    path: str = ""  # the materialised JSONL file

    def prompts(self) -> list[str]:
        return [it.prompt for it in self.items]

    def prompt_ids(self, tokenizer) -> list[list[int]]:
        return [tokenizer.encode(it.prompt) for it in self.items]


@dataclass(frozen=True)
class Recipe:
    """How to cut a prompt set from the stdlib; see workloads/*.toml."""

    name: str
    seed: int
    count: int
    source: str = "stdlib"
    split: str = "heldout"
    part: str = ""  # which part of the split's files ("" = all of them)
    parts: tuple[str, ...] = ()  # the parts the split's files are divided into, by hash
    cut: str = "def-class-blank"
    min_prompt_chars: int = 200
    max_prompt_chars: int = 1200
    reference_chars: int = 400
    per_file: int = 2
    exclude: tuple[str, ...] = ()
    description: str = ""

    @classmethod
    def from_toml(cls, path: Path) -> Recipe:
        try:
            d = tomllib.loads(path.read_text(encoding="utf-8"))
            r = cls(
                name=d.get("name", path.stem), seed=int(d["seed"]), count=int(d["count"]),
                source=d.get("source", "stdlib"), split=d.get("split", "heldout"),
                part=d.get("part", ""), parts=tuple(d.get("parts", ())),
                cut=d.get("cut", "def-class-blank"),
                min_prompt_chars=int(d.get("min_prompt_chars", 200)),
                max_prompt_chars=int(d.get("max_prompt_chars", 1200)),
                reference_chars=int(d.get("reference_chars", 400)),
                per_file=int(d.get("per_file", 2)), exclude=tuple(d.get("exclude", ())),
                description=d.get("description", ""),
            )
        except OSError as e:
            raise SpecPilotError(f"cannot read workload recipe {path} ({e.strerror})") from None
        except KeyError as e:
            raise missing_key(str(path), e) from None
        except (tomllib.TOMLDecodeError, TypeError, ValueError) as e:
            raise SpecPilotError(f"{path}: bad workload recipe ({type(e).__name__}: "
                                 f"{_one_line(e)})") from None
        if r.source != "stdlib" or r.split not in ("train", "heldout") or r.cut not in CUT_RULES:
            raise SpecPilotError(f"{path}: recipe needs source 'stdlib', split train|heldout and "
                                 f"cut one of {CUT_RULES}")
        if r.part and r.part not in r.parts:
            raise SpecPilotError(f"{path}: part {r.part!r} is not one of parts {list(r.parts)}")
        return r


def cut_points(text: str, rule: str) -> list[int]:
    """Offsets of line starts where a prompt may end: before a def/class line, or (with
    `def-class-blank`) before the first line after a blank line."""
    points, prev_blank, off = [], False, 0
    for line in text.splitlines(keepends=True):
        if off and line.strip() and (_HEADER.match(line) or (rule == "def-class-blank"
                                                             and prev_blank)):
            points.append(off)
        prev_blank = not line.strip()
        off += len(line)
    return points


def _prompt_before(text: str, cut: int, max_chars: int) -> str:
    """The text before `cut`, starting at a line start, at most max_chars long."""
    start = max(0, cut - max_chars)
    if start > 0:
        nl = text.find("\n", start - 1)
        start = nl + 1 if 0 <= nl < cut else cut
    return text[start:cut]


def materialise(recipe: Recipe) -> list[WorkloadItem]:
    """The recipe's items, deterministic for a given standard library."""
    from ..zoo.corpus import corpus_texts, list_files, part_of

    files = corpus_texts(list_files(), recipe.split)
    files = [(rel, t) for rel, t in files
             if not any(rel.startswith(x) for x in recipe.exclude)
             and (not recipe.part or part_of(rel, recipe.parts) == recipe.part)]
    rng = random.Random(recipe.seed)
    rng.shuffle(files)
    items: list[WorkloadItem] = []
    for rel, text in files:
        cands = []
        for c in cut_points(text, recipe.cut):
            prompt = _prompt_before(text, c, recipe.max_prompt_chars)
            if len(prompt) >= recipe.min_prompt_chars and prompt.strip():
                cands.append((c, prompt))
        for c, prompt in sorted(rng.sample(cands, min(recipe.per_file, len(cands)))):
            ref = text[c: c + recipe.reference_chars] or None
            items.append(WorkloadItem(f"{recipe.name}-{len(items):03d}", f"stdlib/{rel}",
                                      prompt, ref))
            if len(items) == recipe.count:
                return items
    if not items:
        raise SpecPilotError(f"workload {recipe.name}: the recipe selects no prompts from this "
                             f"Python's standard library; loosen min_prompt_chars or exclude")
    return items


def items_hash(items: list[WorkloadItem]) -> str:
    blob = json.dumps([asdict(i) for i in items], sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def read_jsonl(path: Path) -> list[WorkloadItem]:
    items = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SpecPilotError(f"cannot read workload {path} ({e.strerror})") from None
    except UnicodeDecodeError:
        raise SpecPilotError(f"{path}: not a UTF-8 text file; a workload JSONL has one JSON "
                             "object (id, prompt) a line") from None
    try:
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            d = json.loads(line)
            items.append(WorkloadItem(str(d["id"]), str(d.get("dataset", path.stem)),
                                      str(d["prompt"]), d.get("reference")))
    except KeyError as e:
        raise missing_key(f"{path} line {n}", e, "field") from None
    except (json.JSONDecodeError, TypeError) as e:
        raise SpecPilotError(f"{path} line {n}: bad workload JSONL ({type(e).__name__}: "
                             f"{_one_line(e)}); rows need id and prompt") from None
    if not items:
        raise SpecPilotError(f"{path}: the workload has no prompts")
    return items


def write_jsonl(items: list[WorkloadItem], path: Path) -> None:
    """Atomic: a temporary file in the same folder, then a rename."""
    with atomic_write(path, encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(asdict(it), ensure_ascii=False) + "\n")


def resolve(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".toml", ".jsonl") and p.is_file():
        return p
    for ext in (".toml", ".jsonl"):
        q = ROOT / "workloads" / f"{name_or_path}{ext}"
        if q.is_file():
            return q
    known = sorted({q.stem for q in (ROOT / "workloads").glob("*.*")
                    if q.suffix in (".toml", ".jsonl")})
    raise SpecPilotError(f"no workload {name_or_path!r}: use one of {known} or a .jsonl path")


def load_workload(name_or_path: str, tokenizer=None) -> Workload:
    """A workload by name (workloads/NAME.toml|.jsonl) or path; recipes are materialised.
    With a tokenizer, every prompt is checked to encode to at least one token."""
    src = resolve(name_or_path)
    if src.suffix == ".toml":
        recipe = Recipe.from_toml(src)
        name, items = recipe.name, materialise(recipe)
        h = items_hash(items)
        out = data_dir() / "workloads" / f"{name}-{h[:12]}.jsonl"
        if not out.is_file():
            write_jsonl(items, out)
    else:
        name, items, out = src.stem, read_jsonl(src), src
        h = items_hash(items)
    if tokenizer is not None:
        empty = [it.id for it in items if not tokenizer.encode(it.prompt)]
        if empty:
            raise SpecPilotError(f"workload {name}: prompt {empty[0]} encodes to no tokens")
    return Workload(name, h, items, str(src), str(out))
