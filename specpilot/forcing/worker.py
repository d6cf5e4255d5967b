"""The stock reference in a process of its own: `python -m specpilot.forcing.worker`.

It loads a checkpoint with the *stock* runtime and answers JSON requests, one per line on
stdin, one reply per line on stdout (logs and stray prints go to stderr):

    {"op": "load", "model_dir": ..., "device": "cpu", "dtype": "float32"}
    {"op": "score", "records": [[prompt_ids, output_ids], ...]}
    {"op": "calibrate", "sequences": [[ids], ...], "start": N, "extra": [ids]}
    {"op": "quit"}

`score` teacher-forces prompt + output in one causal pass (records of equal total length
share a batch) and returns, per record and per output position i (and one past the end),
the reference's top-2 ids and logits and the committed token's logit. Verdicts are made by
the caller (verify.py) so the local and the remote reference are judged by the same code.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

TOKEN_BUDGET = 8192  # tokens per forward pass (rows x length)
OPS = {"load", "score", "calibrate"}


class Worker:
    def __init__(self) -> None:
        self.model = None

    def load(self, model_dir: str, device: str = "cpu", dtype: str = "float32") -> dict:
        import torch

        import specpilot
        from specpilot.runtime.loader import load_model

        torch.manual_seed(0)
        self.model = load_model(model_dir, device, dtype)
        cfg = self.model.cfg
        name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
        return {"vocab_size": cfg.vocab_size, "eos_ids": list(cfg.eos_token_ids),
                "device_name": name, "package": os.path.dirname(specpilot.__file__),
                "torch": torch.__version__}

    def _final_hidden(self, rows: list[list[int]]):
        """Output of the last decoder layer for equal-length rows, in one causal pass."""
        import torch

        m = self.model
        ids = torch.tensor(rows, dtype=torch.long, device=m.device)
        pos = torch.arange(ids.shape[1], device=m.device).expand_as(ids)
        last = m.cfg.num_layers - 1
        _, h = m(ids, pos, hidden_layers=(last,), last_only=True, use_cache=False)
        return h

    def score(self, records: list[list[list[int]]]) -> dict:
        import torch

        out: list[dict | None] = [None] * len(records)
        by_len: dict[int, list[int]] = {}
        for i, (p, o) in enumerate(records):
            by_len.setdefault(len(p) + len(o), []).append(i)
        with torch.inference_mode():
            for T, idx in sorted(by_len.items()):
                per = max(1, TOKEN_BUDGET // T)
                for c in range(0, len(idx), per):
                    chunk = idx[c: c + per]
                    h = self._final_hidden([records[i][0] + records[i][1] for i in chunk])
                    for row, i in enumerate(chunk):
                        out[i] = self._score_row(h[row], records[i][0], records[i][1])
        return {"scores": out}

    def _score_row(self, h, prompt: list[int], output: list[int]) -> dict:
        import torch

        s = len(prompt) - 1  # the position whose logits predict output[0]
        logits = self.model.head(h[s:][None])[0]  # [len(output) + 1, V] fp32
        top = logits.topk(min(2, logits.shape[-1]), dim=-1)
        got = []
        if output:
            tgt = torch.tensor(output, device=logits.device)
            got = logits[torch.arange(len(output), device=logits.device), tgt].tolist()
        ids, vals = top.indices.tolist(), top.values.tolist()
        return {"top_ids": ids, "top_vals": vals, "got": got}

    def _incremental(self, seq: list[int], start: int):
        """Logits at positions >= start, decoding one token at a time through the KV cache
        (the shapes the engine itself runs), [len(seq) - start, V]."""
        import torch

        m = self.model
        dev = m.device
        m.setup_cache(1, len(seq) + 1)
        ids = torch.tensor([seq], dtype=torch.long, device=dev)
        pos = torch.arange(len(seq), device=dev)[None]
        first, _ = m(ids[:, :start + 1], pos[:, :start + 1], last_only=True, kv_len=start + 1)
        rows = [first[0, -1]]
        for t in range(start + 1, len(seq)):
            lg, _ = m(ids[:, t:t + 1], pos[:, t:t + 1], kv_len=t + 1)
            rows.append(lg[0, -1])
        return torch.stack(rows)

    def calibrate(self, sequences: list[list[int]], start: int, extra: list[int]) -> dict:
        """Max |logit difference| at positions >= start between the one-pass teacher-forced
        logits and stock passes of other shapes: all sequences batched with `extra` tokens
        appended (causal, so only the shapes change), and token-by-token cached decoding."""
        import torch

        with torch.inference_mode():
            batched = self._final_hidden([s + extra for s in sequences])
            diffs, n = {"batched": 0.0, "incremental": 0.0}, 0
            for row, s in enumerate(sequences):
                a = self.model.head(self._final_hidden([s])[0][start:][None])[0]
                b = self.model.head(batched[row][start: len(s)][None])[0]
                c = self._incremental(s, start)
                diffs["batched"] = max(diffs["batched"], (a - b).abs().max().item())
                diffs["incremental"] = max(diffs["incremental"], (a - c).abs().max().item())
                n += a.shape[0]
        return {"max_abs_diff": max(diffs.values()), "diffs": diffs, "positions": n}

def main() -> None:
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # anything else printed goes to the log, not the protocol
    w = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.pop("op")
            if op == "quit":
                break
            if op not in OPS:
                raise ValueError(f"unknown op {op!r}: one of {sorted(OPS)}")
            if op != "load" and w.model is None:
                raise RuntimeError("send a load request first")
            reply = {"ok": True, **getattr(w, op)(**req)}
        except Exception as e:  # noqa: BLE001 - reported to the caller, who raises it
            traceback.print_exc(file=sys.stderr)
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        proto.write(json.dumps(reply) + "\n")
    proto.close()


if __name__ == "__main__":
    main()
