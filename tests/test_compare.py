"""Compare and its statistics: the bootstrap CI covers known ratios; mismatched results
are refused; ratios, per-dataset rows and output consistency come out of real numbers."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest

from specpilot.bench.compare import compare_speed
from specpilot.bench.stats import paired_bootstrap_ratio
from specpilot.runtime.errors import SpecPilotError


def _synthetic(rng, m: int, ratio: float):
    """Per-request tokens and times of a and b where a is `ratio` times faster on average.
    Per-request difficulty is shared (paired); each side adds its own noise (mean 1)."""
    tokens = rng.integers(20, 200, size=m).astype(float)
    difficulty = rng.lognormal(0.0, 0.5, size=m)
    sig = 0.3
    noise_a = rng.lognormal(-sig**2 / 2, sig, size=m)
    noise_b = rng.lognormal(-sig**2 / 2, sig, size=m)
    tb = 0.01 * tokens * difficulty * noise_b
    ta = 0.01 * tokens * difficulty * noise_a / ratio
    return tokens, ta, tb


@pytest.mark.parametrize("true_ratio", [1.0, 1.7])
def test_bootstrap_ci_covers_the_true_ratio(true_ratio):
    covered, widths = 0, []
    for seed in range(50):
        rng = np.random.default_rng(1000 + seed)
        tokens, ta, tb = _synthetic(rng, 150, true_ratio)
        r, lo, hi = paired_bootstrap_ratio(ta, tb, tokens, tokens, n=2000, seed=seed)
        assert lo <= r <= hi
        covered += lo <= true_ratio <= hi
        widths.append(hi - lo)
    assert covered >= 43, f"95% CI covered the true ratio in only {covered}/50 samples"
    assert np.median(widths) < 0.25 * true_ratio  # and it is not uselessly wide


def test_pairing_narrows_the_interval():
    rng = np.random.default_rng(7)
    tokens, ta, tb = _synthetic(rng, 150, 1.3)
    _, lo, hi = paired_bootstrap_ratio(ta, tb, tokens, tokens, n=2000, seed=0)
    # the same data with the pairing destroyed: b's requests shuffled against a's
    perm = rng.permutation(150)
    _, ulo, uhi = paired_bootstrap_ratio(ta, tb[perm], tokens, tokens[perm], n=2000, seed=0)
    assert hi - lo < 0.7 * (uhi - ulo)


def test_bootstrap_is_seeded_and_validates():
    a, b = [1.0, 2.0, 3.0], [2.0, 2.5, 7.0]
    assert paired_bootstrap_ratio(a, b, seed=3) == paired_bootstrap_ratio(a, b, seed=3)
    assert paired_bootstrap_ratio(a, b)[0] == pytest.approx(11.5 / 6.0)
    with pytest.raises(ValueError):
        paired_bootstrap_ratio([1.0], [1.0, 2.0])


def _result(times, tokens, outputs, workload_hash="h" * 64, batch=1, device="cpu",
            datasets=None):
    reqs = [{"id": f"q{i}", "dataset": (datasets or ["d/x"] * len(times))[i],
             "prompt_ids": [1, 2], "output_ids": outputs[i], "new_tokens": tokens[i],
             "time_s": t, "latency_s": t, "verify_steps": tokens[i], "accept_length": 1.0}
            for i, t in enumerate(times)]
    tok, ts = sum(tokens), sum(times)
    return {"format": "specpilot.bench/1", "environment": {"device": device},
            "settings": {"workload": {"name": "w", "hash": workload_hash}, "batch": batch,
                         "max_new_tokens": 8, "limit": None, "dtype": "float32"},
            "requests": reqs, "totals": {"tokens_per_s": tok / ts, "accept_length": 1.0}}


def test_compare_speed_ratios_and_consistency():
    outs = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1]]
    ds = ["gsm/a", "gsm/b", "code/a", "code/b"]
    ar = _result([4.0, 4.0, 2.0, 2.0], [3, 3, 3, 3], outs, datasets=ds)
    stock = _result([2.0, 2.0, 2.0, 2.0], [3, 3, 3, 3], outs, datasets=ds)
    final_outs = copy.deepcopy(outs)
    final_outs[2] = [7, 0, 9]
    final = _result([1.0, 1.0, 1.0, 1.0], [3, 3, 3, 3], final_outs, datasets=ds)
    c = compare_speed(ar, stock, final, n=1000)
    assert c["final_vs_stock"]["ratio"] == pytest.approx(2.0)
    assert c["final_vs_stock"]["ci95"] == pytest.approx([2.0, 2.0])  # every request 2x
    assert c["final_vs_ar"]["ratio"] == pytest.approx(3.0)
    assert c["stock_vs_ar"]["ratio"] == pytest.approx(1.5)
    per = c["stock_vs_ar"]["per_dataset"]
    assert per["gsm"]["ratio"] == pytest.approx(2.0) and per["code"]["ratio"] == pytest.approx(1.0)
    lo, hi = c["stock_vs_ar"]["ci95"]
    assert 1.0 <= lo < 1.5 < hi <= 2.0
    assert c["consistency_vs_ar"]["stock"]["exact_match"] == 1.0
    fin = c["consistency_vs_ar"]["final"]
    assert fin["exact_match"] == 0.75 and fin["first_divergence_min"] == 1
    json.dumps(c)


@pytest.mark.parametrize("change, what", [
    ({"workload_hash": "x" * 64}, "workload.hash"),
    ({"batch": 4}, "batch"),
    ({"device": "NVIDIA H200"}, "device"),
])
def test_compare_refuses_mismatched_results(change, what):
    outs = [[1], [2]]
    ar = _result([1.0, 1.0], [1, 1], outs)
    other = _result([1.0, 1.0], [1, 1], outs, **change)
    with pytest.raises(SpecPilotError, match=f"{what} differs"):
        compare_speed(ar, other)


def test_cli_compare_refuses_with_exit_2(tmp_path):
    outs = [[1], [2]]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_result([1.0, 1.0], [1, 1], outs)))
    b.write_text(json.dumps(_result([1.0, 1.0], [1, 1], outs, workload_hash="y" * 64)))
    r = subprocess.run(check=False, args=[sys.executable, "-m", "specpilot", "compare", "speed", "--ar", str(a),
                        "--stock", str(b)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "workload.hash differs" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run(check=False, args=[sys.executable, "-m", "specpilot", "compare", "speed", "--ar", str(a),
                        "--stock", str(a), "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["stock_vs_ar"]["ratio"] == 1.0


def _broken(tmp_path):
    good = _result([1.0, 1.0], [1, 1], [[1], [2]])
    no_time = copy.deepcopy(good)
    del no_time["requests"][1]["time_s"]
    files = {"binary.json": b"\x89PNG\r\n\x1a\n\x00\xff\xfe",
             "latin1.json": '{"requests": "caf\xe9"}'.encode("latin-1"),
             "empty.json": json.dumps({**good, "requests": []}).encode(),
             "no_time.json": json.dumps(no_time).encode(),
             "list.json": b"[1, 2]"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return good


@pytest.mark.parametrize("name, want", [
    ("binary.json", "not UTF-8 JSON"), ("latin1.json", "not UTF-8 JSON"),
    ("empty.json", "no requests"), ("no_time.json", "request 'q1' has no time_s"),
    ("list.json", "not a JSON object"),
])
def test_load_result_names_the_malformed_file(tmp_path, name, want):
    from specpilot.bench.compare import load_result

    _broken(tmp_path)
    with pytest.raises(SpecPilotError) as e:
        load_result(tmp_path / name)
    assert str(tmp_path / name) in str(e.value) and want in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cmd", ["speed", "score"])
def test_cli_compare_corrupt_result_is_one_line(tmp_path, cmd):
    good = _broken(tmp_path)
    a = tmp_path / "a.json"
    a.write_text(json.dumps(good))
    for bad in ("binary.json", "no_time.json"):
        args = (["--ar", str(a), "--stock", str(tmp_path / bad)] if cmd == "speed"
                else [str(tmp_path / bad), str(a)])
        r = subprocess.run([sys.executable, "-m", "specpilot", "compare", cmd, *args],
                           check=False, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and bad in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("field, value, want", [
    ("time_s", 0, "request 'q1' has time_s 0, not a positive number of seconds"),
    ("time_s", -1.5, "request 'q1' has time_s -1.5, not a positive number of seconds"),
    ("time_s", float("nan"), "request 'q1' has time_s nan, not a positive number of seconds"),
    ("time_s", float("inf"), "request 'q1' has time_s inf, not a positive number of seconds"),
    ("new_tokens", -3, "request 'q1' has new_tokens -3, fewer than 0"),
    ("format", "other/9", "format is 'other/9', not 'specpilot.bench/1'"),
    ("format", None, "no format"),
])
def test_impossible_values_are_not_a_bench_result(tmp_path, field, value, want):
    """A time that is not positive, or another format, would shift every ratio quietly."""
    outs = [[1], [2]]
    good = _result([1.0, 1.0], [1, 1], outs)
    bad = copy.deepcopy(good)
    if field == "format" and value is None:
        del bad["format"]
    elif field == "format":
        bad["format"] = value
    else:
        bad["requests"][1][field] = value
    a, b = tmp_path / "ar.json", tmp_path / "stock.json"
    a.write_text(json.dumps(good))
    b.write_text(json.dumps(bad))  # NaN and Infinity: JSON as Python writes and reads it
    r = subprocess.run([sys.executable, "-m", "specpilot", "compare", "speed", "--ar", str(a),
                        "--stock", str(b)], check=False, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.strip() == (f"error: {b} is not a bench result ({want}): make one with "
                                "`specpilot bench --out`")
