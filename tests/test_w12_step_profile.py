"""The bookkeeping of `benchmarks/w12_step_profile.py` on made-up GPU timelines: each kernel
charged its share of the step once, overlaps (PDL) not counted twice, x^T kernels charged
to the W12 linear after them, replays cut at the host syncs."""

from benchmarks.w12_step_profile import shares, split_replays, summarize


def _k(name, start, end):
    return {"name": name, "start": start, "end": end}


STEP = [_k("rmsnorm_kernel", 0, 10), _k("_transpose_kernel", 12, 14),
        _k("w12_wgmma_kernel", 13, 20),  # launched (PDL) under the x^T kernel
        _k("w12_linear_kernel", 19, 30), _k("attention_kernel", 30, 31)]


def test_shares_and_idle_add_up_to_the_span():
    sh, idle = shares(STEP)
    assert sh == [10, 2, 6, 10, 1]  # overlaps charged to the later kernel only
    assert idle == 2  # 10 -> 12
    assert sum(sh) + idle == STEP[-1]["end"] - STEP[0]["start"]


def test_summary_charges_x_t_to_the_linear_after_it():
    s = summarize([STEP, STEP, STEP], [(6144, 4096), (4096, 4096)])
    u = s["us"]
    assert s["shapes_matched"] == 3
    assert u["w12 6144x4096"] == 6 + 2 and u["w12 4096x4096"] == 10
    assert u["x^T"] == 2 and u["w12"] == 16 and u["attention"] == 1 and u["other"] == 10
    assert u["idle"] == 2 and u["span"] == 31
    assert s["count"]["w12"] == 2


def test_a_step_whose_linears_do_not_match_is_not_split_by_shape():
    s = summarize([STEP], [(6144, 4096)])  # one shape for two W12 kernels
    assert s["shapes_matched"] == 0
    assert not any(k.startswith("w12 ") for k in s["us"])


def test_replays_are_cut_at_the_longest_gaps():
    evs = [(0, 5, "a"), (6, 9, "b"), (100, 104, "a"), (105, 108, "b"), (300, 301, "a")]
    reps = split_replays(evs, 3)
    assert [[k["name"] for k in r] for r in reps] == [["a", "b"], ["a", "b"], ["a"]]
    assert split_replays([], 3) == []
