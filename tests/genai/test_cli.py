"""The concurrency-curve summary of ``actorrt bench decode``."""

import statistics

from actorrt.genai.cli import median_curve, print_curve


def test_median_curve_takes_ratios_within_each_round():
    # (streams, decode tok/s, per-stream tok/s, end-to-end tok/s) per round
    rounds = [[(1, 20.0, 20.0, 19.0), (8, 90.0, 11.0, 80.0)],
              [(1, 10.0, 10.0, 9.5), (8, 48.0, 6.0, 40.0)],   # a slow round
              [(1, 25.0, 25.0, 24.0), (8, 120.0, 15.0, 90.0)]]
    curve, ratios = median_curve(rounds)
    assert curve[0] == (1, 20.0, 20.0, 19.0)
    assert curve[1] == (8, 90.0, 11.0, 80.0)  # medians per column
    each = [90 / 20, 48 / 10, 120 / 25]
    assert ratios[1][2] == each
    assert ratios[1][0] == statistics.median(each) == 4.8  # not 90 / 20 = 4.5
    assert ratios[1][1] == statistics.median([80 / 19, 40 / 9.5, 90 / 24])
    assert ratios[0][0] == 1.0


def test_print_curve_lists_every_round(capsys):
    print_curve([[(1, 20.0, 20.0, 19.0), (8, 90.0, 11.0, 80.0)],
                 [(1, 10.0, 10.0, 9.5), (8, 48.0, 6.0, 40.0)]])
    out = capsys.readouterr().out
    assert "decode tok/s" in out and "[4.50, 4.80]" in out
