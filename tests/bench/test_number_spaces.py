"""White space around a number in a bench spec: ASCII's alone (numerals.SPACES), line ends included.

str.strip() and a regex's \\s take every Unicode space, so "50,\\xa0100" (a no-break space, as a word
processor or a web page pastes one) ramped at 100 QPS, while the same text in a field read by
numerals.read_float alone was refused. Now each parser trims SPACES and refuses the rest, the
character shown escaped; plain spaces around an item stay taken."""

from __future__ import annotations

import pytest

from wok.bench import cli, faults, payloads, plan, roofline, soak
from wok.bench.arrivals import load_trace, parse_arrivals, parse_duration, parse_steps
from wok.servertiming import parse_server_timing

NBSP, EM = "\u00a0", "\u2003"


def _parsers(space: str) -> list[tuple[str, object]]:
    """(id, a call that parses a spec with `space` where a plain space is taken)."""
    return [
        ("duration", lambda: parse_duration(f"{space}5ms")),
        ("steps", lambda: parse_steps(f"50,{space}100")),
        ("steps-range", lambda: parse_steps(f"50:{space}800:2")),
        ("arrivals-rate", lambda: parse_arrivals(f"burst:amplitude={space}4x", 100.0, duration_s=10.0)),
        ("arrivals-time", lambda: parse_arrivals(f"burst:t0={space}50%", 100.0, duration_s=10.0)),
        ("sizes-fixed", lambda: payloads.parse_sizes(f"fixed:{space}16")),
        ("sizes-uniform", lambda: payloads.parse_sizes(f"uniform:1{space}:64")),
        ("sizes-lognormal", lambda: payloads.parse_sizes(f"lognormal:median={space}20,sigma=0.8,max=256")),
        ("mix", lambda: payloads.parse_mix(f"mlp:{space}0.7,encoder:0.3")),
        ("fault-at", lambda: faults.parse_fault(f"fail:at={space}30%,model=mlp")),
        ("fault-instance", lambda: faults.parse_fault(f"fail:at=30%,model=mlp,instance={space}0")),
        ("hedge-after", lambda: faults.parse_hedge_after(f"{space}30ms")),
        ("soak-load", lambda: soak.parse_fraction(f"{space}80%")),
        ("plan-team", lambda: plan.parse_team(f"search={space}3000")),
        ("plan-burst", lambda: plan.parse_burst(f"base={space}1000,amplitude=4000,sigma=30s")),
        ("plan-duration", lambda: plan.exact_duration(f"{space}20ms", "--slo-p99")),
        ("rate", lambda: roofline.parse_rate(f"{space}900G", "--peak-flops")),
        ("warmup", lambda: cli._warmup(f"{space}10%", 60.0)),
        ("server-timing", lambda: parse_server_timing(f"compute;dur={space}1.5")),
    ]


PLAIN = _parsers(" ")


@pytest.mark.parametrize(("space", "shown"), [(NBSP, "\\xa0"), (EM, "\\u2003")], ids=["nbsp", "em"])
@pytest.mark.parametrize("index", range(len(PLAIN)), ids=[name for name, _ in PLAIN])
def test_other_white_space_around_a_number_is_refused_and_shown(index, space, shown):
    name, parse = _parsers(space)[index]
    with pytest.raises(ValueError) as info:
        parse()
    assert shown in str(info.value), (name, str(info.value))


@pytest.mark.parametrize("space", [" ", "\t", "\r", "\n"], ids=ascii)
@pytest.mark.parametrize("index", range(len(PLAIN)), ids=[name for name, _ in PLAIN])
def test_ascii_white_space_around_a_number_stays_taken(index, space):
    # A line end too, as int() takes it: `--steps "$(cat steps.txt)"` of a CRLF file ends in "\r".
    _parsers(space)[index][1]()


@pytest.mark.parametrize("space", [NBSP, "\t"], ids=["nbsp", "tab"])
def test_a_trace_or_sizes_file_trims_spaces_and_tabs_alone(tmp_path, space):
    trace, sizes = tmp_path / "t.csv", tmp_path / "sizes.txt"
    trace.write_text(f"timestamp,size\n0,{space}3\n1,4\n")
    sizes.write_text(f"4\n{space}3\n")
    if space == "\t":
        assert load_trace(trace).sizes.tolist() == [3, 4]
        assert payloads.parse_sizes(f"empirical:{sizes}").values.tolist() == [4, 3]
        return
    with pytest.raises(ValueError, match=r"t.csv:2: size '\\xa03' is not an integer >= 0"):
        load_trace(trace)
    with pytest.raises(ValueError, match=r"sizes.txt:2: size '\\xa03' is not an integer >= 0"):
        payloads.parse_sizes(f"empirical:{sizes}")
