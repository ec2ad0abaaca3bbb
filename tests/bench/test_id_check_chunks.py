"""bench/id_check_chunks.py: a short run decodes a chunked INT64 request both ways and writes every figure."""

from __future__ import annotations

import json
import math

import pytest

from wok.bench import id_check_chunks
from wok.codec import CONTENTS_CHUNK


def test_a_short_run_writes_both_ways_figures(tmp_path, capsys):
    out = tmp_path / "ids.json"
    values = 3 * CONTENTS_CHUNK + 5
    assert id_check_chunks.main(["--values", str(values), "--reps", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["schema"] == "wok.id_check_chunks/1"
    assert (report["values"], report["reps"], report["chunks"]) == (values, 2, 4)
    assert (report["ids_from"], report["table_rows"], report["contents_chunk"]) == (1 << 14, 1 << 20, CONTENTS_CHUNK)
    # 3-byte varints: the request is a little over 3 bytes an id.
    assert 3 * values < report["request_bytes"] < 3 * values + 100
    for way in ("whole", "per_chunk"):
        runs = report["runs_ms"][way]
        assert [len(runs["decode"]), len(runs["longest_turn"])] == [2, 2]
        # A turn is a part of the decode; the median of two is their mean.
        assert all(0 < turn <= whole for turn, whole in zip(runs["longest_turn"], runs["decode"])), runs
        for figure in ("decode", "longest_turn"):
            assert report["median_ms"][way][figure] == pytest.approx(sum(runs[figure]) / 2)
    ratios = report["median_ratio_per_chunk_over_whole"]
    assert set(ratios) == {"decode", "longest_turn"} and all(math.isfinite(r) and r > 0 for r in ratios.values())
    assert all(math.isfinite(v) and v > 0 for v in report["minmax"].values()), report["minmax"]
    printed = capsys.readouterr().out
    assert "one check after the last chunk" in printed and "a check per chunk" in printed


@pytest.mark.parametrize(
    ("option", "value", "least"), [("--values", CONTENTS_CHUNK, CONTENTS_CHUNK + 1), ("--reps", 0, 1)]
)
def test_too_few_values_or_reps_are_refused(option, value, least, capsys):
    with pytest.raises(SystemExit) as exited:
        id_check_chunks.main([option, str(value)])
    assert exited.value.code == 2
    assert f"{option}: expected an integer >= {least}; got {value}" in capsys.readouterr().err
