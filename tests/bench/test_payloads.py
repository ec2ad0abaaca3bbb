"""bench/payloads.py: payloads fit the demo models' metadata, sizes have their distributions.

The TensorSpecs are written out by hand, as a reader of the V2 ModelMetadata would see
them, and checked against the real demo configs; the payloads then go through the same
encode_request / decode_request pair the server uses, model checks included.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from wok.bench.payloads import (
    Empirical,
    Fixed,
    LogNormal,
    Mix,
    PayloadGenerator,
    Sizes,
    TensorSpec,
    Uniform,
    integer_refusal,
    parse_mix,
    parse_sizes,
)
from wok.codec import decode_request, deserialize_bytes, encode_request

DEMO_SPECS = {
    "mlp": [TensorSpec("INPUT0", "FP32", (-1, 256))],
    "recsys": [TensorSpec("dense", "FP32", (-1, 13)), TensorSpec("ids", "INT64", (-1, -1))],
    "encoder": [TensorSpec("tokens", "INT64", (-1, -1))],
}
# A smaller table keeps the build fast; the metadata does not depend on it.
DEMO_OPTIONS = {"recsys": {"num_embeddings": 20000}}


def test_bench_modules_do_not_import_torch():
    code = "import sys, wok.bench.arrivals, wok.bench.payloads; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- payloads ----------------------------------------------------------------------------------
def test_shapes_and_dtypes_follow_the_metadata():
    rng = np.random.default_rng(0)
    mlp = PayloadGenerator("mlp", DEMO_SPECS["mlp"], rows=3).make(rng)
    assert list(mlp) == ["INPUT0"]
    assert mlp["INPUT0"].shape == (3, 256) and mlp["INPUT0"].dtype == np.float32

    recsys = PayloadGenerator("recsys", DEMO_SPECS["recsys"], rows=2).make(rng, size=7)
    assert recsys["dense"].shape == (2, 13) and recsys["dense"].dtype == np.float32
    assert recsys["ids"].shape == (2, 7) and recsys["ids"].dtype == np.int64

    gen = PayloadGenerator("encoder", DEMO_SPECS["encoder"], sizes=Uniform(3, 5))
    assert {p["tokens"].shape for p in gen.pool(200, rng)} == {(1, 3), (1, 4), (1, 5)}
    assert gen.make(rng, size=0)["tokens"].shape == (1, 0)


def test_all_variable_dimensions_of_a_request_share_its_size():
    gen = PayloadGenerator("m", [TensorSpec("a", "FP32", (-1, -1, 4, -1)), TensorSpec("b", "INT32", (-1, -1))])
    p = gen.make(np.random.default_rng(0), size=6)
    assert p["a"].shape == (1, 6, 4, 6) and p["b"].shape == (1, 6)


def test_a_fixed_first_dimension_is_kept():
    p = PayloadGenerator("m", [TensorSpec("x", "FP32", (3, -1))], rows=5).make(np.random.default_rng(0), size=2)
    assert p["x"].shape == (3, 2)


def test_integer_values_cover_zero_to_int_high_exclusive():
    rng = np.random.default_rng(1)
    ids = np.concatenate([p["tokens"].ravel() for p in PayloadGenerator("e", DEMO_SPECS["encoder"]).pool(100, rng)])
    assert ids.min() == 0 and ids.max() == 49
    small = PayloadGenerator("e", DEMO_SPECS["encoder"], int_high=3).make(rng, size=500)["tokens"]
    assert set(np.unique(small)) == {0, 1, 2}
    # int_high beyond the type's range is capped, not wrapped into negatives.
    i8 = PayloadGenerator("m", [TensorSpec("x", "INT8", (-1, 1000))], int_high=1000).make(rng)["x"]
    assert i8.min() >= 0 and i8.max() == 127


def test_floats_are_standard_normal_in_the_declared_type():
    x = PayloadGenerator("mlp", DEMO_SPECS["mlp"], rows=64).make(np.random.default_rng(2))["INPUT0"]
    assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
    for name, dtype in [("FP16", np.float16), ("FP64", np.float64)]:
        assert PayloadGenerator("m", [TensorSpec("x", name, (-1, 4))]).make()["x"].dtype == dtype


def test_bool_bytes_and_bf16_inputs_encode():
    specs = [
        TensorSpec("flag", "BOOL", (-1, 8)),
        TensorSpec("text", "BYTES", (-1, 3)),
        TensorSpec("h", "BF16", (-1, 4)),
    ]
    gen = PayloadGenerator("m", specs, rows=2)
    p = gen.make(np.random.default_rng(3))
    assert p["flag"].dtype == np.bool_ and p["flag"].shape == (2, 8)
    assert p["text"].dtype == object and all(isinstance(b, bytes) and 1 <= len(b) <= 16 for b in p["text"].ravel())
    assert p["h"].dtype == np.uint16
    # The top 16 bits of a float32 are its bfloat16: reading them back gives normal values.
    as_f32 = (p["h"].astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.isfinite(as_f32)) and np.all(np.abs(as_f32) < 10)

    req = encode_request("m", p, datatypes=gen.datatypes)
    assert [t.datatype for t in req.inputs] == ["BOOL", "BYTES", "BF16"]
    assert deserialize_bytes(req.raw_input_contents[1], 6, "text").tolist() == p["text"].ravel().tolist()


def test_the_generators_own_rng_is_seeded():
    a = PayloadGenerator("e", DEMO_SPECS["encoder"], sizes=Uniform(1, 50), seed=4).pool(5)
    b = PayloadGenerator("e", DEMO_SPECS["encoder"], sizes=Uniform(1, 50), seed=4).pool(5)
    assert all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def demo_servables():
    from wok.models import build_demo  # imports torch: only these tests pay for it

    return {name: build_demo(name, **DEMO_OPTIONS.get(name, {})) for name in DEMO_SPECS}


@pytest.mark.parametrize("name", list(DEMO_SPECS))
def test_payloads_pass_the_servers_request_checks(name, demo_servables):
    servable = demo_servables[name]
    # The hand-written specs are what the server's metadata says.
    assert [(t.name, t.datatype, (-1, *t.dims)) for t in servable.config.inputs] == [
        (s.name, s.datatype, s.shape) for s in DEMO_SPECS[name]
    ]
    gen = PayloadGenerator(name, DEMO_SPECS[name], sizes=LogNormal(20, 0.8, 256), rows=4)
    for payload in gen.pool(20, np.random.default_rng(5)):
        decoded = decode_request(encode_request(name, payload, datatypes=gen.datatypes), servable)
        assert decoded.rows == 4
        for key, a in payload.items():
            np.testing.assert_array_equal(decoded.inputs[key], a)


def test_tensor_spec_rejects_an_unknown_datatype():
    with pytest.raises(ValueError, match="unknown datatype 'FLOAT'"):
        TensorSpec("x", "FLOAT", (-1, 2))


# -- sizes -------------------------------------------------------------------------------------
def test_fixed_and_uniform():
    rng = np.random.default_rng(6)
    assert isinstance(Fixed(3), Sizes)
    assert Fixed(16).sample(rng, 4).tolist() == [16] * 4
    u = Uniform(1, 8).sample(rng, 8000)
    assert u.dtype == np.int64
    counts = np.bincount(u, minlength=9)[1:]
    assert counts.sum() == 8000  # nothing outside 1..8, both ends inclusive
    assert stats.chisquare(counts).pvalue > 0.01


@pytest.mark.parametrize(
    ("spec", "what", "least"),
    [
        ("fixed:100000000000000000000", "fixed size", 0),
        ("uniform:1:9223372036854775808", "uniform hi", 0),
        ("lognormal:median=20,sigma=0.8,max=9223372036854775808", "lognormal max", 1),
    ],
)
def test_a_size_past_int64_is_refused_not_drawn(spec, what, least):
    # Sizes are drawn as int64: fixed:10^20 was accepted, and its first draw an OverflowError traceback.
    got = spec.rpartition("=")[2].rpartition(":")[2]
    with pytest.raises(ValueError) as refused:
        parse_sizes(spec).sample(np.random.default_rng(0), 1)
    assert str(refused.value) == f"sizes '{spec}': {what}: expected an integer from {least} to {2**63 - 1}; got {got}"
    assert Fixed(2**63 - 1).sample(np.random.default_rng(0), 1).tolist() == [2**63 - 1]


def test_lognormal_median_and_tail():
    x = LogNormal(20, 0.8, 256).sample(np.random.default_rng(7), 20000)
    assert x.dtype == np.int64 and x.min() >= 1
    assert 19 <= np.median(x) <= 21
    # 90th percentile 20·e^(0.8·1.2816) ≈ 55.8. σ mistaken for the variance (0.64) puts it
    # at 45, and reading 20 as the mean instead of the median at 40; both miss by far.
    assert np.percentile(x, 90) == pytest.approx(55.8, rel=0.05)
    assert np.percentile(x, 99) == pytest.approx(20 * np.exp(0.8 * 2.3263), rel=0.08)


def test_lognormal_is_clipped_to_one_and_max():
    x = LogNormal(100, 2.0, 128).sample(np.random.default_rng(8), 20000)
    assert x.min() == 1 and x.max() == 128
    # What lies beyond max piles onto max: P(100·e^(2Z) ≥ 127.5) = P(Z ≥ 0.1215) ≈ 0.452.
    assert np.mean(x == 128) == pytest.approx(0.452, abs=0.015)
    assert np.mean(x == 1) == pytest.approx(stats.norm.cdf(np.log(1.5 / 100) / 2), abs=0.005)


def test_empirical_resamples_the_observed_values():
    x = Empirical([1, 1, 1, 8]).sample(np.random.default_rng(9), 20000)
    assert set(np.unique(x)) == {1, 8}
    assert np.mean(x == 8) == pytest.approx(0.25, abs=0.015)


@pytest.mark.parametrize(
    ("values", "got"),
    [
        ([3, 1.5], "1.5 at index 1"),
        ([2, -1], "-1 at index 1"),
        # Each was its own floor and >= 0: kept, and cast to int64's minimum.
        ([np.inf], "inf at index 0"),
        (np.array([2**63], dtype=np.uint64), "9223372036854775808 at index 0"),
        ([float("nan")], "nan at index 0"),
        (["3"], "values of dtype <U1"),
    ],
    ids=["fraction", "negative", "infinite", "past-int64", "nan", "text"],
)
def test_empirical_refuses_a_value_that_is_not_a_size_and_names_it(values, got):
    # It said "empirical sizes must be integers >= 0" and no more.
    with pytest.raises(ValueError) as info:
        Empirical(values)
    assert str(info.value) == f"empirical sizes: expected integers 0 <= n < 2**63; got {got}"


def test_an_empirical_sizes_file_of_a_size_past_int64_names_the_line(tmp_path):
    # numpy's OverflowError left parse_sizes, naming neither the file nor the line.
    path, refusal = _sizes_refusal(tmp_path / "sizes.txt", "3\n99999999999999999999\n")
    assert refusal == f"sizes 'empirical:{path}': {path}:2: size '99999999999999999999' is not below 2**63"


def test_empirical_from_files(tmp_path):
    lines = tmp_path / "sizes.txt"
    lines.write_text("# observed lengths\n3\n5\n\n5\n")
    plain = parse_sizes(f"empirical:{lines}")
    assert sorted(plain.values.tolist()) == [3, 5, 5]
    trace_csv = tmp_path / "trace.csv"
    trace_csv.write_text("timestamp,size\n0.0,12\n0.5,40\n")
    assert parse_sizes(f"empirical:{trace_csv}").values.tolist() == [12, 40]
    trace_jsonl = tmp_path / "trace.jsonl"
    trace_jsonl.write_text(json.dumps({"timestamp": 0, "size": 7}) + "\n" + json.dumps({"timestamp": 1, "size": 0}))
    assert parse_sizes(f"empirical:{trace_jsonl}").values.tolist() == [7, 0]


@pytest.mark.parametrize(
    ("text", "got"),
    [
        ("", "an empty file"),
        ("\ufeff", "an empty file"),
        ("# sizes\n\n", "only comments and blank lines (2 lines)"),
        (" \n\n", "only blank lines (2)"),
    ],
    ids=["empty", "byte-order-mark", "comments", "blank"],
)
def test_an_empirical_sizes_file_of_no_sizes_says_what_it_holds(tmp_path, text, got):
    # It said "no sizes", nothing of what was read.
    path, refusal = _sizes_refusal(tmp_path / "sizes.txt", text)
    assert refusal == (
        f"sizes 'empirical:{path}': {path}: expected sizes, one integer a line, a CSV with a 'size' column or JSONL "
        f'objects with "size"; got {got}'
    )


def _sizes_refusal(path, text: str) -> tuple:
    """`path`, `text` written to it, and parse_sizes' refusal of it as an empirical sizes file."""
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        parse_sizes(f"empirical:{path}")
    return path, str(info.value)


@pytest.mark.parametrize(
    ("text", "line", "names"),
    [("size\n", 1, "'size'"), ("# from the trace\ntimestamp,size\n\n", 2, "'timestamp', 'size'")],
    ids=["header", "header-and-notes"],
)
def test_an_empirical_sizes_csv_of_its_header_only_names_the_file_and_what_it_held(tmp_path, text, line, names):
    # It said "empirical sizes: no values": no path, nothing of what was read.
    path, refusal = _sizes_refusal(tmp_path / "sizes.csv", text)
    assert refusal == (
        f"sizes 'empirical:{path}': {path}:{line}: expected sizes, a row each under the CSV header's 'size' column; "
        f"got the header ({names}) and no rows"
    )


def test_an_empirical_sizes_file_saved_with_a_byte_order_mark_is_read(tmp_path):
    # A spreadsheet's "CSV UTF-8" begins with one: the header read '\ufeffsize' and the file was refused.
    csv_file = tmp_path / "sizes.csv"
    csv_file.write_text("size\n12\n40\n", encoding="utf-8-sig")
    assert parse_sizes(f"empirical:{csv_file}").values.tolist() == [12, 40]
    lines = tmp_path / "sizes.txt"
    lines.write_text("3\n5\n", encoding="utf-8-sig")
    assert sorted(parse_sizes(f"empirical:{lines}").values.tolist()) == [3, 5]
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"size\n\xe9\n")
    with pytest.raises(ValueError, match=r"latin.txt: not UTF-8 text \(invalid continuation byte at byte 5\)"):
        parse_sizes(f"empirical:{latin}")
    # The file's offset, the mark counted (utf-8-sig counts from after it: byte 5 was said for byte 8).
    latin.write_bytes(b"\xef\xbb\xbfsize\n\xe9\n")
    with pytest.raises(ValueError, match=r"latin.txt: not UTF-8 text \(invalid continuation byte at byte 8\)"):
        parse_sizes(f"empirical:{latin}")


def test_parse_sizes():
    assert parse_sizes("fixed:16") == Fixed(16)
    assert parse_sizes("16") == Fixed(16)
    assert parse_sizes("uniform:1:64") == Uniform(1, 64)
    assert parse_sizes("lognormal:median=20,sigma=0.8,max=256") == LogNormal(20.0, 0.8, 256)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "gaussian:3",
            "sizes 'gaussian:3': unknown distribution 'gaussian'; expected fixed:N, uniform:LO:HI, "
            "lognormal:median=M,sigma=S,max=N or empirical:PATH",
        ),
        ("uniform:64:1", "sizes 'uniform:64:1': uniform hi 1 is below lo 64"),
        ("uniform:1", "sizes 'uniform:1': expected uniform:LO:HI with integers 0 <= LO <= HI; got '1'"),
        ("fixed:-1", "sizes 'fixed:-1': expected fixed:N with N an integer >= 0; got '-1'"),
        (
            "lognormal:median=20,sigma=0.8",
            "sizes 'lognormal:median=20,sigma=0.8': lognormal needs median, sigma and max; missing max",
        ),
        # \d took every script's digits, and int() read them: each of these was a size of 3.
        (
            "٣",
            "sizes '٣': unknown distribution '٣'; expected fixed:N, uniform:LO:HI, "
            "lognormal:median=M,sigma=S,max=N or empirical:PATH",
        ),
        ("fixed:٣", "sizes 'fixed:٣': expected fixed:N with N an integer >= 0; got '٣'"),
        ("uniform:1:٣", "sizes 'uniform:1:٣': expected uniform:LO:HI with integers 0 <= LO <= HI; got '1:٣'"),
        (
            "lognormal:median=2,sigma=1,max=٣",
            "sizes 'lognormal:median=2,sigma=1,max=٣': lognormal max: expected an integer >= 1; got '٣'",
        ),
        (
            "lognormal:median=300,sigma=1,max=256",
            "sizes 'lognormal:median=300,sigma=1,max=256': lognormal median: expected at most max 256; got 300",
        ),
    ],
)
def test_parse_sizes_errors(spec, message):
    with pytest.raises(ValueError) as e:
        parse_sizes(spec)
    assert str(e.value) == message


IDS_SPEC = TensorSpec("ids", "INT64", (-1, 3))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        # Each said "X must be an integer >= N; got V", beside every option's "X: expected an integer >= N; got V".
        (lambda: Fixed(-1), "fixed size: expected an integer >= 0; got -1"),
        (lambda: Uniform(0, 2.5), "uniform hi: expected an integer >= 0; got 2.5"),
        (lambda: LogNormal(2.0, 1.0, 0.0), "lognormal max: expected an integer >= 1; got 0"),
        (lambda: PayloadGenerator("m", [IDS_SPEC], rows=0), "rows: expected an integer >= 1; got 0"),
        (
            lambda: PayloadGenerator("m", [IDS_SPEC], int_highs={"ids": "9"}),
            "int_highs['ids']: expected an integer >= 1; got '9'",
        ),
        (lambda: PayloadGenerator("m", [IDS_SPEC], int_high=True), "int_high: expected an integer >= 1; got True"),
    ],
)
def test_a_payload_parameter_is_refused_in_the_options_wording(make, message):
    with pytest.raises(ValueError) as refused:
        make()
    assert str(refused.value) == message


def test_integer_refusal_says_the_range_and_what_was_given():
    assert integer_refusal("--n", 0, 0) is None and integer_refusal("--n", np.int64(51), 0, most=51) is None
    assert integer_refusal("--n", np.int64(-1), 0) == "--n: expected an integer >= 0; got -1"
    assert integer_refusal("--n", 52, 0, " (why)", most=51) == "--n: expected an integer from 0 to 51 (why); got 52"
    assert integer_refusal("--n", 1.0, 0) == "--n: expected an integer >= 0; got 1.0"
    assert integer_refusal("--n", False, 0) == "--n: expected an integer >= 0; got False"


def test_parse_sizes_empirical_file_errors(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("3\nfour\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: size 'four' is not an integer >= 0"):
        parse_sizes(f"empirical:{bad}")
    with pytest.raises(ValueError, match=r"sizes 'empirical:/nonexistent/x': .*No such file"):
        parse_sizes("empirical:/nonexistent/x")


@pytest.mark.parametrize(("text", "line"), [("3\n٣\n", 2), ("٣\n3\n", 1)])
def test_an_empirical_size_in_other_digits_than_0_to_9_is_refused(tmp_path, text, line):
    # A first line of "٣" read the file as one integer a line; now it is a CSV without a size column.
    sizes = tmp_path / "sizes.txt"
    sizes.write_text(text)
    with pytest.raises(ValueError) as e:
        parse_sizes(f"empirical:{sizes}")
    expected = (
        f"{sizes}:{line}: size '٣' is not an integer >= 0"
        if line == 2
        else f"{sizes}:1: expected one integer a line, or a CSV header with a 'size' column; got '٣'"
    )
    assert str(e.value) == f"sizes 'empirical:{sizes}': {expected}"


# -- mixes -------------------------------------------------------------------------------------
def test_mix_proportions_follow_the_weights():
    gens = [PayloadGenerator(n, DEMO_SPECS[n]) for n in ("mlp", "encoder", "recsys")]
    mix = Mix(list(zip(gens, [7.0, 2.0, 1.0])))  # weights need not sum to 1
    picks = mix.choose(np.random.default_rng(10), 20000)
    assert picks.dtype == np.int64
    # ±0.015 is ~4.5σ at n = 20000 for p = 0.7; swapping two weights moves a share by ≥ 0.1.
    np.testing.assert_allclose(np.bincount(picks, minlength=3) / 20000, [0.7, 0.2, 0.1], atol=0.015)
    assert Mix([(gens[0], 1.0)]).choose(np.random.default_rng(0), 5).tolist() == [0] * 5


def test_mix_rejects_bad_weights():
    gen = PayloadGenerator("mlp", DEMO_SPECS["mlp"])
    with pytest.raises(ValueError, match="mix weights: expected finite numbers >= 0 with a sum > 0"):
        Mix([(gen, 0.0)])


def test_parse_mix():
    assert parse_mix("mlp:0.7,encoder:0.3") == [("mlp", 0.7), ("encoder", 0.3)]
    assert parse_mix("mlp") == [("mlp", 1.0)]
    assert parse_mix("mlp:3, encoder:1") == [("mlp", 0.75), ("encoder", 0.25)]
    assert parse_mix("mlp,encoder") == [("mlp", 0.5), ("encoder", 0.5)]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mlp:0.7,encoder", "model mix 'mlp:0.7,encoder': give a weight for every model or for none"),
        ("mlp:0,encoder:1", "model mix 'mlp:0,encoder:1': weight '0' of 'mlp' is not a number > 0"),
        ("mlp:x", "model mix 'mlp:x': weight 'x' of 'mlp' is not a number > 0"),
        ("mlp,mlp", "model mix 'mlp,mlp': model 'mlp' appears twice"),
        ("mlp,,encoder", "model mix 'mlp,,encoder': expected NAME[:WEIGHT],... (e.g. 'mlp:0.7,encoder:0.3')"),
        (":0.5", "model mix ':0.5': ':0.5' has no model name"),
    ],
)
def test_parse_mix_errors(spec, message):
    with pytest.raises(ValueError) as e:
        parse_mix(spec)
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("parse", "spec", "refusal"),
    [
        (parse_sizes, "lognormal:median=٢٠,sigma=0.8,max=256", "lognormal median: expected a number; got '٢٠'"),
        (parse_sizes, "lognormal:median=20,sigma=０.８,max=256", "lognormal sigma: expected a number; got '０.８'"),
        (parse_mix, "mlp:٢,recsys:1", "weight '٢' of 'mlp' is not a number > 0"),
    ],
    ids=["median", "sigma", "mix-weight"],
)
def test_numbers_in_digits_other_than_ascii_are_refused(parse, spec, refusal):
    """float() read "٢٠" as 20."""
    with pytest.raises(ValueError, match=refusal):
        parse(spec)


@pytest.mark.parametrize(
    ("header", "refusal"),
    [
        (
            "size\xa0",
            "column 1, 'size\\xa0': expected 'size' with no white space around it but spaces, tabs and line ends; got "
            "other white space",
        ),
        (
            "n,size\u200b",
            "column 2, 'size\\u200b': expected printable characters alone; got U+200B ZERO WIDTH SPACE (category Cf)",
        ),
        ("n,Size", "column 2, 'Size': expected 'size' (names are matched case included); got another case"),
        (
            'n,\t"size"',
            "column 2, '\"size\"': expected 'size' (a quote opens quoting only first in its field or after spaces); "
            "got it in quotes, read as part of the name",
        ),
    ],
    ids=["other-white-space", "not-printable", "other-case", "quoted-after-a-tab"],
)
def test_an_empirical_size_column_named_with_other_white_space_or_not_printable_is_refused_naming_it(
    tmp_path, header, refusal
):
    """str.strip() read the header 'size\\xa0' as 'size' unseen, where the sizes themselves trim ASCII white space
    alone; now, as a trace's header, it is refused naming the column. 'size\\u200b', no white space, shows as
    'size': the file was refused as having no 'size' column, the column it has not named, as were 'Size' and
    '"size"' (its quotes after a tab not read as quoting). Spaces and tabs around a name are still taken."""
    sizes = tmp_path / "sizes.csv"
    sizes.write_text(f"{header}\n3\n4\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        parse_sizes(f"empirical:{sizes}")
    assert str(e.value) == f"sizes 'empirical:{sizes}': {sizes}:1: CSV header {refusal}"
    sizes.write_text(" size\t\n3\n4\n")
    assert sorted(set(parse_sizes(f"empirical:{sizes}").values.tolist())) == [3, 4]


@pytest.mark.parametrize("char", ["\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
@pytest.mark.parametrize(("header", "line"), [("", 2), ("n,size\n0,", 3)], ids=["one-a-line", "csv"])
def test_an_empirical_size_with_a_character_str_splitlines_breaks_at_is_refused_on_its_line(
    tmp_path, char, header, line
):
    """str.splitlines() broke at these too, so '1<char>2' was read as two sizes, 1 and 2, without a word; the
    lines are now CSV's, split at \\n, \\r\\n and \\r alone, and the size '1<char>2' is refused on its line."""
    sizes = tmp_path / "sizes.csv"
    sizes.write_text(f"3\n{header}1{char}2\n4\n" if not header else f"{header}3\n1,1{char}2\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        parse_sizes(f"empirical:{sizes}")
    assert (
        str(e.value) == f"sizes 'empirical:{sizes}': {sizes}:{line}: size {'1' + char + '2'!r} is not an integer >= 0"
    )


def test_an_empirical_csv_skips_comment_and_blank_lines_as_one_integer_a_line_does(tmp_path):
    """A file of one integer a line took `#` comments, and a CSV's first line decided it was one, but the CSV was
    read from its first line: '# observed' was its header, and the file refused as having no 'size' column."""
    sizes = tmp_path / "sizes.csv"
    sizes.write_text("# observed 2026-12-06\n\nsize, n\n3,0\n # more\n4,1\n")
    assert parse_sizes(f"empirical:{sizes}").values.tolist() == [3, 4]
    sizes.write_text("# observed 2026-12-06\nsize,n\n3,0\n# more\nx,1\n")
    with pytest.raises(ValueError) as e:
        parse_sizes(f"empirical:{sizes}")
    assert str(e.value) == f"sizes 'empirical:{sizes}': {sizes}:5: size 'x' is not an integer >= 0"


def test_an_empirical_size_column_quoted_after_spaces_is_read(tmp_path):
    """'n, "size"' kept the quotes in the name: no 'size' column, the file refused."""
    sizes = tmp_path / "sizes.csv"
    sizes.write_text('n, "size"\n0, "3"\n1,4\n')
    assert parse_sizes(f"empirical:{sizes}").values.tolist() == [3, 4]


def test_an_empirical_csv_header_refusal_names_its_line_and_a_commented_header_is_read(tmp_path):
    """A header after comments was refused naming the file alone, and a header commented out (`#size,n`, as some
    tools write one) was skipped: the first row was read as the header, the file refused as having no 'size'
    column."""
    sizes = tmp_path / "sizes.csv"
    refusals = []
    for text in ("# observed\n\nn,size\xa0\n0,3\n", "# observed\nn,bytes\n0,3\n"):
        sizes.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError) as e:
            parse_sizes(f"empirical:{sizes}")
        refusals.append(str(e.value).removeprefix(f"sizes 'empirical:{sizes}': {sizes}"))
    assert refusals == [
        ":3: CSV header column 2, 'size\\xa0': expected 'size' with no white space around it but spaces, tabs and "
        "line ends; got other white space",
        ":2: expected one integer a line, or a CSV header with a 'size' column; got 'n', 'bytes'",
    ]
    sizes.write_text("# observed\n#size, n\n3,0\n# more\n4,1\n")
    assert parse_sizes(f"empirical:{sizes}").values.tolist() == [3, 4]
