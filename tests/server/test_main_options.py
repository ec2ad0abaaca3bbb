"""`wok serve` refuses options that do not apply to what it would serve (exit 2, before anything
loads), as `wok bench` does, rather than ignoring them: `--models` or `--demo-option` beside
`--model-repository`, a `--demo-option` for a demo model `--models` leaves out, an empty `--models`,
a model named twice in it.

In this process, through `main(argv)`: the server itself is replaced by a stand-in that records
that it was reached, so a refusal that fails to come shows as a start, not as a hang."""

from __future__ import annotations

import logging
import signal

import pytest

import wok.__main__ as wok_main


@pytest.fixture
def serve(monkeypatch, capsys, tmp_path):
    """Run `wok serve ARGS...` in this process: (exit status, stderr, whether the server started)."""
    started: list = []

    async def fake_serve(args, stop_signal):
        started.append(args)
        return 0

    monkeypatch.setattr(wok_main, "_serve", fake_serve)
    monkeypatch.setattr(wok_main, "_pick_loop", lambda: None)  # no process-wide loop policy
    # The real one leaves SIGINT, SIGTERM and SIGHUP ending the process at once for the rest of it.
    monkeypatch.setattr(wok_main._StopSignal, "after_loop", lambda self, status: self.uninstall())
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: None)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    (tmp_path / "models").mkdir()

    def run(*args: str) -> tuple[int, str, bool]:
        argv = [a.replace("REPO", str(tmp_path / "models")) for a in args]
        started.clear()
        try:
            status = wok_main.main(["serve", *argv])
        except SystemExit as exc:  # argparse's own refusals
            status = exc.code
        assert {s: signal.getsignal(s) for s in before} == before, "the signal handlers were left changed"
        return status, capsys.readouterr().err, bool(started)

    return run


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (
            ("--model-repository", "REPO", "--models", "mlp"),
            "wok: --models 'mlp' with --model-repository: the repository's models are served; give one of the two",
        ),
        (
            ("--models", "mlp", "--demo-option", "recsys.num_embeddings=1000000"),
            "wok: --demo-option 'recsys.num_embeddings=1000000': demo model 'recsys' is not among --models 'mlp'",
        ),
        (
            ("--models", "mlp,encoder", "--demo-option", "mlp.hidden=64", "--demo-option", "recsys.num_embeddings=9"),
            "wok: --demo-option 'recsys.num_embeddings=9': demo model 'recsys' is not among --models 'mlp,encoder'",
        ),
        (("--models", ""), "wok: --models '': no model to serve"),
        (("--models", ","), "wok: --models ',': no model to serve"),
        (
            ("--models", "mlp,,recsys"),
            "wok: --models 'mlp,,recsys': name 2 of 3 is empty; expected names separated by single commas, "
            "e.g. mlp,recsys,encoder",
        ),
        (
            ("--models", "mlp, "),
            "wok: --models 'mlp, ': name 2 of 2 is empty; expected names separated by single commas, "
            "e.g. mlp,recsys,encoder",
        ),
        (
            ("--models", "mlp,recsys, mlp"),
            "wok: --models 'mlp,recsys, mlp': 'mlp' is named twice (names 1 and 3); each model is served once, "
            "under its own name",
        ),
        (
            ("--model-repository", "REPO", "--demo-option", "recsys.num_embeddings=1000000"),
            "wok: --demo-option 'recsys.num_embeddings=1000000' with --model-repository: demo options apply to the "
            "demo models only",
        ),
    ],
    ids=[
        "repository+models",
        "option-of-unserved",
        "one-of-two-unserved",
        "empty",
        "commas",
        "empty-name-between",
        "trailing-comma",
        "named-twice",
        "repository+option",
    ],
)
def test_an_option_that_does_not_apply_exits_2_before_the_server_starts(serve, args, refusal):
    status, err, started = serve(*args, "--port", "0", "--metrics-port", "-1")
    assert not started, f"`wok serve {' '.join(args)}` started a server; stderr: {err!r}"
    assert status == 2
    assert refusal in err.splitlines(), err


def test_a_metrics_port_below_minus_one_is_refused_not_taken_as_none(serve):
    # A typo (-8002 for 8002) turned the metrics off without a word.
    status, err, started = serve("--models", "mlp", "--port", "0", "--metrics-port", "-8002")
    assert (status, started) == (2, False)
    assert err == "wok: --metrics-port -8002: expected a port 0-65535 (0: a free one), or -1 for none\n"


def test_a_malformed_demo_option_is_named_as_such_before_the_models_it_is_not_among(serve):
    # Its own refusal, worded as before: not "'nope' is not among --models".
    status, err, started = serve("--models", "mlp", "--demo-option", "nope.x=1", "--metrics-port", "-1")
    assert (status, started) == (2, False)
    assert "wok: --demo-option 'nope.x=1': unknown demo model 'nope'; known: mlp, recsys, encoder" in err.splitlines()


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--models", "mlp"),
        ("--models", "mlp,recsys,encoder"),
        ("--models", "mlp", "--demo-option", "mlp.max_batch_size=8", "--demo-option", "mlp.max_queue_delay_ms=1"),
        ("--demo-option", "recsys.num_embeddings=20000"),  # the default models: all three
        ("--models", "mlp,recsys,encoder", "--demo-option", "recsys.num_embeddings=20000"),
        ("--models", "mlp, recsys", "--demo-option", "recsys.num_embeddings=20000"),
        ("--model-repository", "REPO"),
    ],
    ids=[
        "defaults",
        "mlp",
        "all-three",
        "mlp+options",
        "default+recsys-option",
        "all+recsys-option",
        "spaced+recsys-option",
        "repository",
    ],
)
def test_the_combinations_that_apply_still_start(serve, args):
    status, err, started = serve(*args, "--port", "0", "--metrics-port", "-1")
    assert (status, started) == (0, True), err


@pytest.mark.parametrize(
    ("models", "names"),
    [
        (None, ("mlp", "recsys", "encoder")),
        ("mlp,recsys", ("mlp", "recsys")),
        ("mlp, recsys", ("mlp", "recsys")),
        (" mlp ,\trecsys , encoder ", ("mlp", "recsys", "encoder")),
        ("", ()),
        (" , ", ()),
    ],
)
def test_the_names_of_models_are_taken_without_the_spaces_around_them(models, names):
    """`--models "mlp, recsys"` named ' recsys', refused later as an unknown demo model ' recsys'."""
    import argparse

    assert wok_main._demo_models(argparse.Namespace(models=models)) == names


def serve_actions() -> list:
    """The options of `wok serve`'s own parser (not its --help)."""
    import argparse

    parser = argparse.ArgumentParser(prog="wok")
    sub = parser.add_subparsers(dest="command", required=True)
    wok_main._serve_parser(sub)
    return [a for a in sub.choices["serve"]._actions if a.option_strings and a.dest != "help"]


def test_every_serve_option_with_a_default_value_names_it_in_its_help():
    missing = []
    for action in serve_actions():
        if action.default in (None, False, []):  # nothing to name: the help says what leaving it out does
            continue
        default = f"{action.default:g}" if isinstance(action.default, float) else str(action.default)
        if "default" not in (action.help or "") or default.lower() not in action.help.lower():
            missing.append(f"{action.option_strings[0]} (default {default}): {action.help!r}")
    assert not missing, "\n".join(missing)


def test_max_request_bytes_help_gives_its_default_and_unit(capsys):
    with pytest.raises(SystemExit) as exc:
        wok_main.main(["serve", "--help"])
    assert exc.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "--max-request-bytes BYTES largest ModelInfer request accepted, in bytes (default 67108864, 64 MiB; at "
        "least 1024)" in help_text
    )


LONG = "x" * 100_000
LONG_SHOWN = f"'{'x' * 200}'… (100,000 characters in all)"


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (
            ("--model-repository", "REPO", "--models", LONG),
            f"wok: --models {LONG_SHOWN} with --model-repository: the repository's models are served; give one of "
            "the two",
        ),
        (("--demo-option", LONG), f"wok: --demo-option {LONG_SHOWN}: expected MODEL.KEY=VALUE"),
        # --models' names are stripped: "mlp\n" serves mlp, and the refusal showed the value as given,
        # its newline splitting the line.
        (
            ("--models", "mlp\n", "--demo-option", "recsys.num_embeddings=9"),
            r"wok: --demo-option 'recsys.num_embeddings=9': demo model 'recsys' is not among --models 'mlp\n'",
        ),
    ],
    ids=["long-models", "long-demo-option", "newline-in-models"],
)
def test_the_values_a_refusal_names_are_quoted_escaped_and_cut(serve, args, refusal):
    status, err, started = serve(*args, "--port", "0", "--metrics-port", "-1")
    assert (status, started) == (2, False)
    assert err == refusal + "\n"


def test_an_empty_model_repository_is_refused_not_the_working_directory_served(serve):
    status, err, started = serve("--model-repository", "", "--port", "0", "--metrics-port", "-1")
    assert (status, started) == (2, False)
    assert err == "wok serve: --model-repository: expected a path; got ''\n"
