"""Runners: one batch of prompts in, per-request outputs and timings out.

`LocalRunner` drives the native Engine in this process; `ServerRunner` sends a batch as
concurrent requests to any SGLang-compatible `/generate`. Both return, per request,
`output_ids`, `new_tokens`, `verify_steps`, `accept_length`, `finish_reason`,
`latency_s` (the batch's wall time locally; the request's own round trip on a server)
and `time_s` = batch wall time / batch size, the request's share of the device time.
Total throughput = sum(new_tokens) / sum(time_s), which is what compare bootstraps.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..runtime.errors import SpecPilotError
from ..runtime.knobs import Knobs


def _snippet(text: str, n: int = 120) -> str:
    """A server's answer as one short line, for an error message."""
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= n else flat[:n] + "...")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class LocalRunner:
    """The native engine (target + the knobs' drafter) on `device`/`dtype`, built for the
    batch sizes it will run (`batch_sizes`: where W12 layers pay off depends on them)."""

    kind = "local"

    def __init__(self, model_dir: str | Path, knobs: Knobs | None = None, device: str = "cpu",
                 dtype: str = "float32", batch_sizes: tuple[int, ...] = (1,)):
        from ..runtime.factory import build_engine

        self.model_dir, self.knobs = str(model_dir), knobs or Knobs()
        self.device, self.dtype = device, dtype
        self.engine, self.tokenizer = build_engine(model_dir, self.knobs, device, dtype,
                                                   tuple(batch_sizes))

    @property
    def device_name(self) -> str:
        if self.device.startswith("cuda"):
            import torch

            return torch.cuda.get_device_name()
        return "cpu"

    def describe(self) -> dict:
        return {"runner": "local", "model": self.model_dir, "device": self.device,
                "dtype": self.dtype, "knobs": self.knobs.to_dict()}

    def generate(self, prompt_ids_batch: list[list[int]], max_new_tokens: int) -> list[dict]:
        if self.engine.drafter is not None:
            self.engine.k = self.knobs.k_for(len(prompt_ids_batch))
        _sync(self.device)
        t0 = time.perf_counter()
        gens = self.engine.generate(prompt_ids_batch, max_new_tokens)
        _sync(self.device)
        wall = time.perf_counter() - t0
        return [{
            "output_ids": g.output_ids, "finish_reason": g.finish_reason,
            "new_tokens": g.metrics.new_tokens, "verify_steps": g.metrics.verify_steps,
            "accept_length": g.metrics.accept_length, "latency_s": wall,
            "time_s": wall / len(gens), "prefill_s": g.metrics.prefill_s,
        } for g in gens]

    def close(self) -> None:
        pass


class ServerRunner:
    """Any SGLang-compatible server: a batch is sent as that many concurrent requests."""

    kind = "server"

    def __init__(self, url: str, timeout: float = 600.0):
        import httpx

        self.url = url.rstrip("/")
        self.client = httpx.Client(timeout=timeout)
        self.info: dict = {}
        try:
            r = self.client.get(f"{self.url}/get_model_info")
            if r.status_code == 200:
                info = r.json()
                self.info = info if isinstance(info, dict) else {}
        except ValueError:  # not JSON: the model info is optional, /generate is checked
            pass
        except httpx.HTTPError as e:
            raise SpecPilotError(f"cannot reach {self.url} ({e}): is the server up?") from None

    @property
    def device_name(self) -> str:
        return f"server {self.url}"

    def describe(self) -> dict:
        return {"runner": "server", "url": self.url, "model": self.info.get("model_path", ""),
                "drafter": self.info.get("drafter"), "k": self.info.get("k")}

    def _one(self, ids: list[int], max_new_tokens: int) -> dict:
        import httpx

        body = {"input_ids": ids,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0}}
        t0 = time.perf_counter()
        try:
            r = self.client.post(f"{self.url}/generate", json=body)
        except httpx.HTTPError as e:
            raise SpecPilotError(f"{self.url}/generate failed ({e})") from None
        lat = time.perf_counter() - t0
        want = "SGLang /generate JSON with output_ids and meta_info"
        if r.status_code != 200:
            raise SpecPilotError(f"{self.url}/generate answered HTTP {r.status_code} "
                                 f"{_snippet(r.text)}: expected {want}")
        try:
            d = r.json()
        except ValueError:
            raise SpecPilotError(f"{self.url}/generate answered {_snippet(r.text)}, not JSON: "
                                 f"expected {want}") from None
        if (not isinstance(d, dict) or not isinstance(d.get("meta_info"), dict)
                or not isinstance(d.get("output_ids"), list)):
            raise SpecPilotError(f"{self.url}/generate answered {_snippet(r.text)}: expected "
                                 f"{want}; is this an SGLang-compatible server?")
        meta = d["meta_info"]
        out = list(d["output_ids"])
        n = int(meta.get("completion_tokens", len(out)))
        steps = int(meta.get("spec_verify_ct") or n)
        fin = meta.get("finish_reason") or {}
        reason = "length" if isinstance(fin, dict) and fin.get("type") == "length" else "eos"
        return {"output_ids": out, "finish_reason": reason, "new_tokens": n,
                "verify_steps": steps,
                "accept_length": float(meta.get("spec_accept_length") or (n / max(steps, 1))),
                "latency_s": lat}

    def generate(self, prompt_ids_batch: list[list[int]], max_new_tokens: int) -> list[dict]:
        B = len(prompt_ids_batch)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(B) as pool:
            res = list(pool.map(lambda p: self._one(p, max_new_tokens), prompt_ids_batch))
        wall = time.perf_counter() - t0
        for r in res:
            r["time_s"] = wall / B
        return res

    def close(self) -> None:
        self.client.close()
