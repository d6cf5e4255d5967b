"""Records -> Verdict: is every committed token the stock reference's greedy argmax?

For each record (prompt_ids, output_ids, optional id and max_new_tokens) the reference
scores prompt + output in one pass; every output position must hold the reference's
top-1 token, and the output must end where greedy decoding ends: at the first EOS, or at
exactly max_new_tokens when that is known. A disagreement whose margin (reference top-1
minus the committed token's value) is within the tie margin is a *tie*, reported and
counted but not a failure (see the Lossless contract in DESIGN.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..runtime.errors import SpecPilotError
from .reference import Scores

KINDS = {
    "token": "reference argmax differs from the committed token",
    "tie": "differs within the tie margin",
    "oov": "token id outside the vocabulary",
    "past_eos": "tokens after an EOS",
    "past_max": "more tokens than max_new_tokens",
    "early_stop": "stopped before EOS and before max_new_tokens",
}


@dataclass
class Mismatch:
    request: int  # 0-based index of the record
    id: str | None  # the record's id, when it has one
    position: int  # 0-based index into output_ids
    expected: int | None  # the reference's token (None: the output should have ended)
    got: int | None  # the committed token (None: the output ended here)
    margin: float | None  # reference top-1 minus the committed token's value
    kind: str = "token"  # one of KINDS
    context: str = ""  # decoded text just before the position
    expected_text: str = ""
    got_text: str = ""


@dataclass
class RequestVerdict:
    request: int
    id: str | None
    checked: int  # positions compared with the reference
    mismatches: int
    ties: int
    end: str  # "eos" | "length" | "unchecked" (no max_new_tokens known) | "bad"
    min_gap: float | None  # smallest top-1 minus top-2 gap seen: how close to a tie


@dataclass
class Verdict:
    passed: bool
    checked: int
    mismatches: list[Mismatch]
    ties: list[Mismatch]
    per_request: list[RequestVerdict]
    margin: float
    margin_source: str
    reference: str
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def _check_ids(ids, what: str, i: int) -> list[int]:
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in ids):
        raise SpecPilotError(f"record {i}: {what} must be a list of integer token ids")
    return ids


def _plan(i: int, rec: dict, max_new_tokens: int | None, vocab: int | None,
          eos: set[int]) -> tuple[list[int], list[int], int | None, list[Mismatch]]:
    """Validate a record; return (prompt, the output prefix to score, mnt, end problems)."""
    if not isinstance(rec, dict):
        raise SpecPilotError(f"record {i} is not an object with prompt_ids and output_ids")
    prompt = _check_ids(rec.get("prompt_ids"), "prompt_ids", i)
    output = _check_ids(rec.get("output_ids"), "output_ids", i)
    if not prompt:
        raise SpecPilotError(f"record {i} has an empty prompt: nothing to condition on")
    if vocab is not None and any(not 0 <= t < vocab for t in prompt):
        raise SpecPilotError(f"record {i}: a prompt id is outside the vocabulary [0, {vocab})")
    mnt = rec.get("max_new_tokens", max_new_tokens)
    if mnt is not None and (not isinstance(mnt, int) or isinstance(mnt, bool) or mnt < 0):
        raise SpecPilotError(f"record {i}: max_new_tokens must be a non-negative integer, "
                             f"got {mnt!r}")
    rid = None if rec.get("id") is None else str(rec["id"])
    cut, problem = len(output), None
    e = next((j for j, t in enumerate(output) if t in eos), None)
    if e is not None and e < len(output) - 1:
        cut, problem = e + 1, Mismatch(i, rid, e + 1, None, output[e + 1], None, "past_eos")
    if mnt is not None and len(output) > mnt and mnt < cut:
        cut, problem = mnt, Mismatch(i, rid, mnt, None, output[mnt], None, "past_max")
    bad = next((j for j, t in enumerate(output[:cut])
                if t < 0 or (vocab is not None and t >= vocab)), None)
    if bad is not None:
        cut, problem = bad, Mismatch(i, rid, bad, None, output[bad], None, "oov")
    return prompt, output[:cut], mnt, [problem] if problem else []


def _judge(i: int, rid, scored: list[int], s: Scores, mnt: int | None, eos: set[int],
           margin: float, problems: list[Mismatch]) -> tuple[list[Mismatch], RequestVerdict]:
    found: list[Mismatch] = []
    gaps = []
    for p, tok in enumerate(scored):
        best, vals = s.top_ids[p][0], s.top_vals[p]
        if len(vals) > 1:
            gaps.append(vals[0] - vals[1])
        if best != tok:
            m = vals[0] - s.got[p]
            found.append(Mismatch(i, rid, p, best, tok, m, "tie" if m <= margin else "token"))
    n = len(scored)
    if problems:
        prob = problems[0]
        prob.expected = s.top_ids[n][0] if prob.kind == "oov" else None
        found.append(prob)
        end = "bad"
    elif scored and scored[-1] in eos:
        end = "eos"
    elif mnt is None:
        end = "unchecked"
    elif n == mnt:
        end = "length"
    else:
        found.append(Mismatch(i, rid, n, s.top_ids[n][0], None, None, "early_stop"))
        end = "bad"
    ties = sum(m.kind == "tie" for m in found)
    rv = RequestVerdict(i, rid, n, len(found) - ties, ties, end, min(gaps) if gaps else None)
    return found, rv


def _describe(found: list[Mismatch], records: list[dict], tok) -> None:
    if tok is None:
        return
    for m in found:
        r = records[m.request]
        before = (r["prompt_ids"] + r["output_ids"][: m.position])[-16:]
        m.context = tok.decode(before)
        m.expected_text = "" if m.expected is None else tok.decode([m.expected])
        if m.got is not None and m.kind != "oov":
            m.got_text = tok.decode([m.got])


def verify(records: list[dict], reference, max_new_tokens: int | None = None,
           margin: float | None = None) -> Verdict:
    """Token-force `records` through `reference` (LocalReference / ServerReference).

    `max_new_tokens` applies to records that do not carry their own; without either, an
    output that ends without EOS cannot be checked for stopping early (end="unchecked").
    `margin` is the tie margin; None looks up the calibration for the reference's device
    and dtype (0 for fp32 on CPU)."""
    if not records:
        raise SpecPilotError("no records to verify: the outputs file is empty")
    eos = set(reference.eos_ids)
    plans = [_plan(i, r, max_new_tokens, reference.vocab_size, eos)
             for i, r in enumerate(records)]
    scores = reference.score([(p, o) for p, o, _, _ in plans])
    warnings = []
    if margin is None:
        from .calibrate import tie_margin

        margin, source = tie_margin(reference)
        if source.startswith("uncalibrated"):
            warnings.append(f"tie margin 0: {source}")
    else:
        source = "given"
    mismatches, ties, per = [], [], []
    for i, ((_, scored, mnt, problems), s) in enumerate(zip(plans, scores)):
        rid = None if records[i].get("id") is None else str(records[i]["id"])
        found, rv = _judge(i, rid, scored, s, mnt, eos, margin, problems)
        per.append(rv)
        _describe(found, records, reference.tokenizer)
        mismatches += [m for m in found if m.kind != "tie"]
        ties += [m for m in found if m.kind == "tie"]
    if any(rv.end == "unchecked" for rv in per):
        n = sum(rv.end == "unchecked" for rv in per)
        warnings.append(f"{n} output(s) end without EOS and no max_new_tokens is known: "
                        "their length was not checked (pass --max-new-tokens)")
    return Verdict(passed=not mismatches, checked=sum(rv.checked for rv in per),
                   mismatches=mismatches, ties=ties, per_request=per, margin=margin,
                   margin_source=source, reference=reference.describe(), warnings=warnings)
