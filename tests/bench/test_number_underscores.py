"""A '_' between a number's digits in a bench spec: refused, as in every number wok reads (server/numerals.py).

float() and Decimal() take "1_000" as Python's literals do, so `--steps 50:1_000:2`, a burst's `base=1_000` or a
Server-Timing `dur=1_5` were read as 1000 and 15, while a duration, a size or a rate with the same '_' was refused:
a '_' typed for a ',' or a '.' changed the number without a word."""

from __future__ import annotations

import pytest

from wok.bench import cli, faults, payloads, plan, roofline, soak
from wok.bench.arrivals import parse_arrivals, parse_duration, parse_steps
from wok.servertiming import parse_server_timing

PARSERS = [
    ("duration", lambda: parse_duration("1_000ms")),
    ("steps", lambda: parse_steps("50,1_000")),
    ("steps-range", lambda: parse_steps("50:1_000:2")),
    ("arrivals-rate", lambda: parse_arrivals("burst:amplitude=4_0x", 100.0, duration_s=10.0)),
    ("arrivals-time", lambda: parse_arrivals("burst:t0=5_0%", 100.0, duration_s=10.0)),
    ("sizes-fixed", lambda: payloads.parse_sizes("fixed:1_6")),
    ("sizes-lognormal", lambda: payloads.parse_sizes("lognormal:median=2_0,sigma=0.8,max=256")),
    ("mix", lambda: payloads.parse_mix("mlp:0.7,encoder:0.3_0")),
    ("fault-at", lambda: faults.parse_fault("fail:at=3_0%,model=mlp")),
    ("fault-instance", lambda: faults.parse_fault("fail:at=30%,model=mlp,instance=1_0")),
    ("hedge-after", lambda: faults.parse_hedge_after("3_0ms")),
    ("soak-load", lambda: soak.parse_fraction("8_0%")),
    ("plan-team", lambda: plan.parse_team("search=3_000")),
    ("plan-burst", lambda: plan.parse_burst("base=1_000,amplitude=4000,sigma=30s")),
    ("plan-duration", lambda: plan.exact_duration("2_0ms", "--slo-p99")),
    ("plan-number", lambda: plan.exact("1_000", "--peak-qps")),
    ("rate", lambda: roofline.parse_rate("9_00G", "--peak-flops")),
    ("warmup", lambda: cli._warmup("1_0%", 60.0)),
    ("server-timing", lambda: parse_server_timing("compute;dur=1_5")),
]


@pytest.mark.parametrize("parse", [p for _, p in PARSERS], ids=[name for name, _ in PARSERS])
def test_an_underscore_in_a_number_is_refused(parse):
    with pytest.raises(ValueError) as info:
        parse()
    assert "_" in str(info.value)  # the text refused is shown, '_' and all
