"""Deployments: one TOML per deployment in `deployments/`, parsed into a frozen dataclass.

Relative paths in a deployment resolve against the project root (the folder that holds
`deployments/`), so a fresh clone runs its shipped deployments as they are.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .runtime.cli_commands import DEVICES
from .runtime.errors import SpecPilotError, missing_key
from .runtime.knobs import Knobs

ROOT = Path(os.environ.get("SPECPILOT_ROOT", Path(__file__).resolve().parents[1]))
DTYPES = ("float32", "bfloat16", "float16")  # the names `runtime.loader.DTYPES` maps
DRAFTER_KINDS = ("draft", "block", "ngram", "oracle")


def data_dir() -> Path:
    """Machine-local, regenerable state: `$SPECPILOT_DATA` or ~/.cache/specpilot."""
    d = Path(os.environ.get("SPECPILOT_DATA", Path.home() / ".cache" / "specpilot"))
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        bad_kind = isinstance(e, (FileExistsError, NotADirectoryError))
        what = "is not a folder" if bad_kind else f"cannot be made ({e.strerror})"
        raise SpecPilotError(f"the data folder {d} {what}: point SPECPILOT_DATA at a "
                             "writable folder") from None
    return d


@dataclass(frozen=True)
class DrafterSpec:
    kind: str  # "draft" | "block" | "ngram" | "oracle"
    path: str = ""  # checkpoint directory (resolved), empty for ngram
    params: dict = field(default_factory=dict)

    @property
    def spec(self) -> str:
        """The runtime's drafter string: ngram | draft:DIR | block:DIR | oracle:k=v,..."""
        if self.kind == "oracle" and self.params:
            return "oracle:" + ",".join(f"{k}={v}" for k, v in self.params.items())
        return self.kind if not self.path else f"{self.kind}:{self.path}"


@dataclass(frozen=True)
class Deployment:
    name: str
    device: str  # "cpu" | "cuda"
    target: str  # checkpoint directory (resolved), or "random:<preset>" for perf-only
    drafter: DrafterSpec
    alternatives: tuple[DrafterSpec, ...] = ()
    gpu: str = ""
    dtype: str = "float32"
    batch_sizes: tuple[int, ...] = (1,)
    dev_workload: str = ""
    gate_workload: str = ""
    max_new_tokens: int = 128
    knobs: Knobs = field(default_factory=Knobs)
    perf_only: bool = False
    description: str = ""
    source: str = ""

    @property
    def drafters(self) -> tuple[DrafterSpec, ...]:
        return (self.drafter, *self.alternatives)

    def stock_knobs(self) -> Knobs:
        """What a user gets without SpecPilot: the deployment's drafter and stock knobs."""
        return self.knobs.with_(drafter=self.drafter.spec)


def _resolve(p: str) -> str:
    if not p or p.startswith("random:"):
        return p
    q = Path(p)
    return str(q if q.is_absolute() else (ROOT / q))


def check_device(device: str) -> None:
    """A device the runtime knows (`runtime.cli_commands.DEVICES`), or a one-line error."""
    if device not in DEVICES:
        raise SpecPilotError(f"unknown device {device!r}: use {' or '.join(DEVICES)}")


def _drafter(d: dict, where: str) -> DrafterSpec:
    if not isinstance(d, dict) or "kind" not in d:
        raise SpecPilotError(f"{where}: a drafter needs a 'kind' (draft, block or ngram)")
    if d["kind"] not in DRAFTER_KINDS:
        raise SpecPilotError(f"{where}: unknown drafter kind {d['kind']!r}: use one of "
                             f"{', '.join(DRAFTER_KINDS)}")
    if d["kind"] in ("draft", "block") and not d.get("path"):
        raise SpecPilotError(f"{where}: a {d['kind']} drafter needs a 'path' (its checkpoint)")
    return DrafterSpec(kind=d["kind"], path=_resolve(d.get("path", "")),
                       params=dict(d.get("params", {})))


def _knobs(d, where: Path) -> Knobs:
    """A deployment's stock knobs; a bad one is an error that names the file."""
    if not isinstance(d, dict):
        raise SpecPilotError(f"{where}: [knobs] must be a table of knob = value")
    try:
        return Knobs.from_dict(d)
    except SpecPilotError as e:
        raise SpecPilotError(f"{where}: {e}") from None


def _check(dep: Deployment, raw_batch_sizes) -> None:
    """A one-line error for a field the runtime cannot run (the drafters are checked as
    they are read)."""
    where = dep.source
    if dep.device not in DEVICES:
        raise SpecPilotError(f"{where}: device {dep.device!r} is not supported: use "
                             f"{' or '.join(DEVICES)}")
    if dep.dtype not in DTYPES:
        raise SpecPilotError(f"{where}: dtype {dep.dtype!r} is not supported: use one of "
                             f"{', '.join(DTYPES)}")
    if (not isinstance(raw_batch_sizes, list) or not raw_batch_sizes
            or any(type(b) is not int or b < 1 for b in raw_batch_sizes)):
        raise SpecPilotError(f"{where}: batch_sizes must be a non-empty list of integers "
                             f">= 1, got {raw_batch_sizes!r}")
    if type(dep.max_new_tokens) is not int or dep.max_new_tokens < 1:
        raise SpecPilotError(f"{where}: max_new_tokens must be >= 1, got {dep.max_new_tokens}")


def load_deployment(name_or_path: str) -> Deployment:
    """By name from `deployments/NAME.toml`, or from a TOML file path."""
    p = Path(name_or_path)
    if p.suffix != ".toml":
        p = ROOT / "deployments" / f"{name_or_path}.toml"
    if not p.is_file():
        raise SpecPilotError(
            f"no deployment {name_or_path!r}: see `specpilot deployments list` for the defined ones"
        )
    try:
        d = tomllib.loads(p.read_text(encoding="utf-8"))
        target = d["target"]
        if not isinstance(target, dict) or ("path" in target) == ("random" in target):
            raise SpecPilotError(f"{p}: [target] needs a 'path' (a checkpoint) or a 'random' "
                                 "preset, one of the two")
        wl = d.get("workloads", {})
        dep = Deployment(
            name=d.get("name", p.stem),
            device=d.get("device", "cpu"),
            gpu=d.get("gpu", ""),
            target=_resolve(target["path"]) if "path" in target else f"random:{target['random']}",
            drafter=_drafter(d["drafter"], str(p)),
            alternatives=tuple(_drafter(a, str(p)) for a in d.get("alternatives", [])),
            dtype=d.get("dtype", "float32"),
            batch_sizes=tuple(int(b) for b in d.get("batch_sizes", [1])),
            dev_workload=wl.get("dev", ""),
            gate_workload=wl.get("gate", ""),
            max_new_tokens=int(d.get("max_new_tokens", 128)),
            knobs=_knobs(d.get("knobs", {}), p),
            perf_only=bool(d.get("perf_only", False)),
            description=d.get("description", ""),
            source=str(p),
        )
    except OSError as e:
        raise SpecPilotError(f"cannot read deployment {p} ({e.strerror})") from None
    except KeyError as e:
        raise missing_key(str(p), e) from None
    except (tomllib.TOMLDecodeError, TypeError, ValueError) as e:
        raise SpecPilotError(f"{p}: bad deployment file ({type(e).__name__}: {e})") from None
    _check(dep, d.get("batch_sizes", [1]))
    return dep


def check_searchable(dep: Deployment) -> None:
    """A one-line error for a deployment the search cannot run here: a perf-only one
    (random weights, no workloads to verify on) or a CUDA one on a machine without CUDA
    (its evaluators ask Ray for a GPU, so they would never start)."""
    if dep.perf_only:
        raise SpecPilotError(
            f"deployment {dep.name} is perf-only ({dep.target}: random weights, no workloads):"
            " the search needs a checkpoint and dev/gate workloads; time it with"
            " benchmarks/gpu_perf.py")
    if dep.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SpecPilotError(f"deployment {dep.name} runs on cuda, but this machine has no"
                                 " CUDA device: run the search on one that has")


def list_deployments() -> list[Deployment]:
    return [load_deployment(str(p)) for p in sorted((ROOT / "deployments").glob("*.toml"))]
