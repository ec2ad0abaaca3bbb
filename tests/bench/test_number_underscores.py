"""A '_' between a number's digits in a bench spec: refused, as in every number wok reads (server/numerals.py).

float() and Decimal() take "1_000" as Python's literals do, so `--steps 50:1_000:2`, a burst's `base=1_000` or a
Server-Timing `dur=1_5` were read as 1000 and 15, while a duration, a size or a rate with the same '_' was refused:
a '_' typed for a ',' or a '.' changed the number without a word. Each refusal says why, with UNDERSCORE_NOTE:
until 2026-12-07 most quoted the text and gave no reason ("timestamp '1_000.5' is neither seconds nor an ISO 8601
time"), as if a '_' were any other typo."""

from __future__ import annotations

import pytest

from wok.bench import cli, faults, payloads, plan, roofline, soak, tune_check
from wok.bench.arrivals import load_trace, parse_arrivals, parse_duration, parse_steps
from wok.numerals import UNDERSCORE_NOTE
from wok.servertiming import parse_server_timing


def _trace(tmp_path, text: str):
    trace = tmp_path / "t.csv"
    trace.write_text(text)
    return load_trace(trace)


def _sizes_file(tmp_path, text: str):
    sizes = tmp_path / "sizes.txt"
    sizes.write_text(text)
    return payloads.parse_sizes(f"empirical:{sizes}")


PARSERS = [
    ("duration", lambda _: parse_duration("1_000ms")),
    ("steps", lambda _: parse_steps("50,1_000")),
    ("steps-range", lambda _: parse_steps("50:1_000:2")),
    ("arrivals-rate", lambda _: parse_arrivals("burst:amplitude=4_0x", 100.0, duration_s=10.0)),
    ("arrivals-time", lambda _: parse_arrivals("burst:t0=5_0%", 100.0, duration_s=10.0)),
    ("arrivals-duration", lambda _: parse_arrivals("burst:sigma=1_0s", 100.0, duration_s=10.0)),
    ("sizes-fixed", lambda _: payloads.parse_sizes("fixed:1_6")),
    ("sizes-bare", lambda _: payloads.parse_sizes("1_6")),
    ("sizes-uniform", lambda _: payloads.parse_sizes("uniform:1:6_4")),
    ("sizes-lognormal", lambda _: payloads.parse_sizes("lognormal:median=2_0,sigma=0.8,max=256")),
    ("sizes-lognormal-sigma", lambda _: payloads.parse_sizes("lognormal:median=20,sigma=0_8,max=256")),
    ("sizes-lognormal-max", lambda _: payloads.parse_sizes("lognormal:median=20,sigma=0.8,max=2_56")),
    ("sizes-file", lambda tmp_path: _sizes_file(tmp_path, "size\n4\n1_6\n")),
    ("mix", lambda _: payloads.parse_mix("mlp:0.7,encoder:0.3_0")),
    ("trace-timestamp", lambda tmp_path: _trace(tmp_path, "timestamp\n0\n1_000.5\n")),
    ("trace-size", lambda tmp_path: _trace(tmp_path, "timestamp,size\n0,1_6\n")),
    ("fault-at", lambda _: faults.parse_fault("fail:at=3_0%,model=mlp")),
    ("fault-until", lambda _: faults.parse_fault("fail:at=30%,until=1_0s,model=mlp")),
    ("fault-instance", lambda _: faults.parse_fault("fail:at=30%,model=mlp,instance=1_0")),
    ("hedge-after", lambda _: faults.parse_hedge_after("3_0ms")),
    ("soak-load", lambda _: soak.parse_fraction("8_0%")),
    ("start-at", lambda _: cli._unix_time("1_700_000_000")),
    ("plan-team", lambda _: plan.parse_team("search=3_000")),
    ("plan-burst", lambda _: plan.parse_burst("base=1_000,amplitude=4000,sigma=30s")),
    ("plan-burst-multiple", lambda _: plan.parse_burst("base=1000,amplitude=4_0x")),
    ("plan-duration", lambda _: plan.exact_duration("2_0ms", "--slo-p99")),
    ("plan-number", lambda _: plan.exact("1_000", "--peak-qps")),
    ("rate", lambda _: roofline.parse_rate("9_00G", "--peak-flops")),
    ("warmup", lambda _: cli._warmup("1_0%", 60.0)),
    ("server-timing", lambda _: parse_server_timing("compute;dur=1_5")),
    ("server-timing-count", lambda _: parse_server_timing("batch_requests;desc=1_6")),
    ("tune-check-sizes", lambda _: tune_check._positive_ints("4,1_6")),
    ("tune-check-setting", lambda _: tune_check._setting("3_2,5ms")),
]


@pytest.mark.parametrize("parse", [p for _, p in PARSERS], ids=[name for name, _ in PARSERS])
def test_an_underscore_in_a_number_is_refused(parse, tmp_path):
    with pytest.raises(ValueError) as info:
        parse(tmp_path)
    assert str(info.value).endswith(UNDERSCORE_NOTE), str(info.value)


def test_an_underscore_is_refused_in_the_words_of_the_refusal_it_ends(tmp_path):
    """The note follows the refusal a '_' met, whole: the reason is added, nothing else changes."""
    with pytest.raises(ValueError) as info:
        _trace(tmp_path, "timestamp\n0\n1_000.5\n")
    assert str(info.value) == (
        f"{tmp_path / 't.csv'}:3: timestamp '1_000.5' is neither seconds nor an ISO 8601 time{UNDERSCORE_NOTE}"
    )


@pytest.mark.parametrize(
    "parse",
    [
        lambda: parse_duration("1_ms"),  # a '_' not between digits: a typo like any other, said as one
        lambda: payloads.parse_sizes("fixed:x_1"),
        lambda: faults.parse_fault("fail:at=_30%,model=mlp"),
        lambda: soak.parse_fraction("80%_"),
    ],
    ids=["after-digits", "after-letter", "before-digits", "after-percent"],
)
def test_a_refusal_without_an_underscore_between_digits_has_no_note(parse):
    with pytest.raises(ValueError) as info:
        parse()
    assert UNDERSCORE_NOTE not in str(info.value)


def test_tune_check_reads_its_sizes_as_every_number_is_read():
    """int() took "1_6" as 16 and "٣" as 3: `--max-batch-sizes 4,1_6` searched 16 without a word."""
    with pytest.raises(ValueError, match="got '٣' \\(numbers are read in ASCII"):
        tune_check._positive_ints("٣")
    assert tune_check._positive_ints(" 4, 16") == [4, 16]
    assert tune_check._setting("32,5ms") == (32, 5.0)
