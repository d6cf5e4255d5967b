"""References that token forcing checks against: the stock runtime or a `/generate` server.

Both answer `score(pairs) -> list[Scores]`: for a (prompt_ids, output_ids) pair, the
reference's top-2 candidates at every output position (and one past the end) and the
value it gives the committed token. Local values are fp32 logits, remote ones log-probs;
a top-1 minus committed difference is the same number either way (log-softmax only shifts
a position's logits by a constant).

LocalReference runs the *stock* package in a child process (`specpilot.forcing.worker`)
with a PYTHONPATH of the stock root only, so a candidate's build dir can never be the
reference, and it checks the package path the worker reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from ..runtime.errors import SpecPilotError


@dataclass
class Scores:
    """One record as the reference sees it; position i predicts output[i], n the end."""

    top_ids: list[list[int]]  # [n + 1][2]: the reference's best two tokens
    top_vals: list[list[float]]  # their logits (local) or log-probs (server)
    got: list[float]  # [n]: the committed token's logit / log-prob


def stock_root() -> Path:
    """The directory holding the stock `specpilot` package (SPECPILOT_STOCK_ROOT overrides)."""
    env = os.environ.get("SPECPILOT_STOCK_ROOT")
    return Path(env) if env else Path(__file__).resolve().parents[2]


def _model_facts(model_dir: str | Path) -> tuple[int, tuple[int, ...]]:
    from ..runtime.config import ModelConfig

    cfg = ModelConfig.from_file(model_dir)
    return cfg.vocab_size, cfg.eos_token_ids


class LocalReference:
    """The stock runtime on `device`/`dtype`, in a worker process started on first use."""

    kind = "local"

    def __init__(self, model_dir: str | Path, device: str = "cpu", dtype: str = "float32",
                 root: str | Path | None = None):
        # absolute: the worker runs in the stock root, where a relative path would name
        # another directory (or another checkpoint)
        self.model_dir = str(Path(model_dir).resolve())
        self.device, self.dtype = device, dtype
        self.root = Path(root) if root else stock_root()
        self.vocab_size, self.eos_ids = _model_facts(self.model_dir)
        self.device_name = "cpu" if device == "cpu" else device
        self.package = ""
        self._proc: subprocess.Popen | None = None
        self._log = None
        self._tok = None

    def describe(self) -> str:
        return f"stock runtime ({self.model_dir}, {self.device}, {self.dtype})"

    @property
    def tokenizer(self):
        if self._tok is None:
            from ..runtime.tokenizer import Tokenizer

            try:
                self._tok = Tokenizer(self.model_dir)
            except SpecPilotError:
                self._tok = False
        return self._tok or None

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(self.root)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives with the worker
        self._proc = subprocess.Popen(
            [sys.executable, "-s", "-m", "specpilot.forcing.worker"], cwd=self.root, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
        )
        info = self._call({"op": "load", "model_dir": self.model_dir, "device": self.device,
                           "dtype": self.dtype})
        want = (self.root / "specpilot").resolve()
        if Path(info["package"]).resolve() != want:
            self.close()
            raise SpecPilotError(f"the reference worker imported specpilot from "
                                 f"{info['package']}, not the stock {want}: unset PYTHONPATH")
        self.vocab_size, self.eos_ids = info["vocab_size"], tuple(info["eos_ids"])
        self.device_name, self.package = info["device_name"], info["package"]

    def _call(self, req: dict) -> dict:
        if self._proc is None:
            self._start()
        try:
            self._proc.stdin.write(json.dumps(req) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise SpecPilotError(f"the reference worker died: {self._log_tail()}")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise SpecPilotError(f"the reference worker failed: {reply['error']}")
        return reply

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = [x for x in self._log.read().splitlines() if x.strip()]
        return lines[-1] if lines else "(no log)"

    def start(self) -> LocalReference:
        """Start the worker now (it is otherwise started by the first request)."""
        if self._proc is None:
            self._start()
        return self

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[Scores]:
        reply = self._call({"op": "score", "records": [[list(p), list(o)] for p, o in pairs]})
        return [Scores(**s) for s in reply["scores"]]

    def calibrate(self, sequences: list[list[int]], start: int, extra: list[int]) -> dict:
        return self._call({"op": "calibrate", "sequences": sequences, "start": start,
                           "extra": extra})

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown; nothing to report to
            pass


class ServerReference:
    """Any SGLang-compatible `/generate` endpoint (a non-speculative stock server).

    `model_dir` (optional) supplies the vocabulary size, EOS ids and the tokenizer used to
    decode context in reports; without it pass `eos_ids` and `vocab_size` yourself.
    """

    kind = "server"

    def __init__(self, url: str, model_dir: str | Path | None = None,
                 eos_ids: tuple[int, ...] | None = None, vocab_size: int | None = None,
                 timeout: float = 600.0, concurrency: int = 8):
        self.url = url.rstrip("/")
        self.model_dir = str(model_dir) if model_dir else None
        vs, eos = _model_facts(model_dir) if model_dir else (None, ())
        self.vocab_size = vocab_size if vocab_size is not None else vs
        self.eos_ids = tuple(eos_ids) if eos_ids is not None else eos
        self.timeout, self.concurrency = timeout, concurrency
        self.device_name = f"server {self.url}"
        self._tok = None

    def describe(self) -> str:
        return f"server {self.url}"

    @property
    def tokenizer(self):
        if self._tok is None and self.model_dir:
            from ..runtime.tokenizer import Tokenizer

            try:
                self._tok = Tokenizer(self.model_dir)
            except SpecPilotError:
                self._tok = False
        return self._tok or None

    def _one(self, client, prompt: list[int], output: list[int]) -> Scores:
        import httpx

        body = {
            "input_ids": list(prompt) + list(output),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": len(prompt) - 1,
            "top_logprobs_num": 2,
        }
        try:
            r = client.post(f"{self.url}/generate", json=body)
        except httpx.HTTPError as e:
            raise SpecPilotError(f"cannot reach {self.url}/generate ({e}): is the server up?")
        if r.status_code != 200:
            raise SpecPilotError(f"{self.url}/generate answered {r.status_code}: {r.text[:200]}")
        meta = r.json()["meta_info"]
        tops, toks = meta["input_top_logprobs"], meta["input_token_logprobs"]
        n = len(output)
        if len(tops) != n + 1 or not meta.get("output_top_logprobs"):
            raise SpecPilotError(
                f"{self.url}/generate returned {len(tops)} input logprob entries for "
                f"{n} output tokens (expected {n + 1}): does it implement logprob_start_len?")
        rows = [tops[k] for k in range(1, n + 1)] + [meta["output_top_logprobs"][0]]
        got = []
        for k in range(1, n + 1):
            if toks[k][1] != output[k - 1]:
                raise SpecPilotError(f"{self.url} scored token {toks[k][1]} where the record "
                                     f"has {output[k - 1]}: misaligned logprobs")
            got.append(float(toks[k][0]))
        return Scores(top_ids=[[int(e[1]) for e in row] for row in rows],
                      top_vals=[[float(e[0]) for e in row] for row in rows], got=got)

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[Scores]:
        import httpx

        with httpx.Client(timeout=self.timeout) as client, \
                ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda po: self._one(client, *po), pairs))

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        pass
