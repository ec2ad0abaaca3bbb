"""bench/large_decode.py's `codecs` part, small: this checkout's codec against a copy of itself loaded from a file,
one rep; its figures, the file's module as the one timed, and --codec-before's refusals."""

from __future__ import annotations

import math
import shutil
import statistics
import sys
from pathlib import Path

import pytest

from wok.bench import large_decode

ROOT = Path(__file__).resolve().parents[2]


def test_codecs_times_the_current_codec_against_a_file_loaded_beside_it(tmp_path):
    copy = tmp_path / "codec_copy.py"
    shutil.copyfile(ROOT / "server" / "codec.py", copy)
    done = []
    try:
        part = large_decode._codecs(1, {"copy": str(copy)}, done.append)
        loaded = sys.modules["wok._codec_copy"]
    finally:
        sys.modules.pop("wok._codec_copy", None)
    assert loaded.__file__ == str(copy)  # the file given, not wok.codec again
    assert done == list(large_decode.SIZE_CHECK_ROWS)
    assert part["model"] == "mlp" and part["files"] == {"copy": str(copy)}
    assert [r["rows"] for r in part["results"]] == list(large_decode.SIZE_CHECK_ROWS)
    for r in part["results"]:
        assert set(r["median_us"]) == {"current", "copy"}
        assert all(math.isfinite(v) and v > 0 for v in r["median_us"].values()), r
        assert set(r["median_saved_us"]) == set(r["saved_us_range"]) == set(r["median_ratio_current_over"]) == {"copy"}
        low, high = r["saved_us_range"]["copy"]
        assert low <= r["median_saved_us"]["copy"] <= high
        assert r["median_ratio_current_over"]["copy"] > 0
        assert r["loops"] > 0 and r["bytes"] > 1000 * r["rows"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("codec.py", "expected NAME=FILE, NAME a Python identifier other than 'current'; got 'codec.py'"),
        ("current=codec.py", "; got 'current=codec.py'"),
        ("a-b=codec.py", "; got 'a-b=codec.py'"),
        ("old=", "; got 'old='"),
    ],
)
def test_codec_before_refuses_what_is_not_a_name_and_a_file(value, expected, capsys):
    with pytest.raises(SystemExit) as info:
        large_decode.build_parser().parse_args(["--codec-before", value])
    assert info.value.code == 2
    assert expected in capsys.readouterr().err


def test_codec_before_refuses_a_missing_file_and_a_name_given_twice(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        large_decode.main(["--codec-before", f"old={tmp_path / 'none.py'}"])
    assert info.value.code == 2
    assert f"--codec-before old: expected a file; got '{tmp_path / 'none.py'}'" in capsys.readouterr().err
    file = tmp_path / "codec.py"
    file.write_text("")
    with pytest.raises(SystemExit) as info:
        large_decode.main(["--codec-before", f"old={file}", "--codec-before", f"old={file}"])
    assert info.value.code == 2
    assert "--codec-before: expected each NAME once; got old more than once" in capsys.readouterr().err


def test_oversized_times_each_worst_case_refused_unread_against_parsed_whole(monkeypatch):
    # Small: 300,000 values (~2.4 MB) over a limit of 1 MiB, two reps (one of each order).
    monkeypatch.setattr(large_decode, "OVERSIZED_VALUES", 300_000)
    monkeypatch.setattr(large_decode, "OVERSIZED_LIMIT", 1 << 20)
    part = large_decode._oversized(2)
    assert part["values"] == 300_000 and part["max_request_bytes"] == 1 << 20 and part["bytes"] > 2_400_000
    assert [w["case"] for w in part["worst_cases"]] == list(large_decode.WORST_CASES)
    unread = {w["case"]: w["unread"] for w in part["worst_cases"]}
    assert unread["many_fields"] == unread["tiny_fields"] == "more than 1024 top-level fields"
    assert unread["cut_short"].startswith(f"its top-level field at byte {part['bytes']} is not read")
    for figures in [part, *part["worst_cases"]]:
        assert set(figures["median_us"]) == set(figures["us_range"]) == {"parse_whole", "head_only"}
        for way, (low, high) in figures["us_range"].items():
            assert 0 < low <= figures["median_us"][way] <= high
            # each rep's figure, in rep order, behind the median and the range
            runs = figures["runs_us"][way]
            assert len(runs) == 2 and (min(runs), max(runs)) == (low, high)
            assert statistics.median(runs) == pytest.approx(figures["median_us"][way], rel=1e-12)
        assert figures["median_ratio_head_over_whole"] > 0
    assert all(w["bytes"] > 1 << 20 for w in part["worst_cases"])
    # Each request's summary, then its head's two groups of reps: two reps, one in each.
    lines = large_decode.oversized_lines(part)
    assert len(lines) == 2 + 2 * len(large_decode.WORST_CASES)
    for line, figures in zip(lines[1::2], [part, *part["worst_cases"]]):
        first, second = figures["runs_us"]["head_only"]
        assert line.endswith(
            f"by the way run before it: a whole parse {first:,.1f} µs (median of 1), another refusal {second:,.1f} µs "
            "(median of 1)"
        )


def test_oversized_s_summary_shows_the_head_s_two_groups_of_reps():
    # It showed the head's median of all its reps alone, one of the two groups (after a whole parse, the even reps;
    # after another refusal, the odd ones), which only the JSON's runs_us told apart.
    def figures(head: list[float]) -> dict:
        return {
            "median_us": {"parse_whole": 120_000.0, "head_only": statistics.median(head)},
            "runs_us": {"parse_whole": [120_000.0] * len(head), "head_only": head},
            "median_ratio_head_over_whole": statistics.median(head) / 120_000.0,
        }

    part = {"bytes": 62_400_047, "max_request_bytes": 16 << 20} | figures([67.0, 6.0, 70.0, 5.0, 60.0])
    part["worst_cases"] = [{"case": "cut_short", "bytes": 62_400_048, "unread": "a tag cut short"} | figures([51.0])]
    assert large_decode.oversized_lines(part) == [
        "refusing a typed request of 62,400,047 bytes over a limit of 16,777,216: parsed whole 120,000.0 µs, its head "
        "only 60.0 µs (median ratio 0.0005)",
        "    its head only, by the way run before it: a whole parse 67.0 µs (median of 3), another refusal 5.5 µs "
        "(median of 2)",
        "  cut_short (62,400,048 bytes, a tag cut short): parsed whole 120,000.0 µs, refused unread 51.0 µs (median "
        "ratio 0.000425)",
        "    refused unread, by the way run before it: a whole parse 51.0 µs (median of 1), another refusal none",
    ]


def test_break_even_times_protobufs_read_against_the_walks_at_each_size(monkeypatch):
    # Small: two sizes, one rep; each read by both ways (the walk's a ReceivedRequest, not left to protobuf).
    monkeypatch.setattr(large_decode, "BREAK_EVEN_SIZES", (4 << 10, 200 << 10))
    done = []
    part = large_decode._break_even(1, done.append)
    assert done == [4 << 10, 200 << 10]
    assert [r["bytes"] > size for r, size in zip(part, done)] == [True, True]
    for r in part:
        assert set(r["median_us"]) == {"protobuf", "walk"}
        assert all(math.isfinite(v) and v > 0 for v in r["median_us"].values()), r
        low, high = r["ratio_range"]
        assert 0 < low <= r["median_ratio_walk_over_protobuf"] <= high
        assert r["loops"] >= 1
