"""Triton's own client, `tritonclient[grpc]`, on wok's repository RPCs: the index, and the
load and unload wok does not offer (a fixed set of models, chosen at start), answered with
why rather than gRPC's opaque "Method not found!"."""

from __future__ import annotations

import asyncio
import json

import pytest

FIXED = (
    "wok does not load or unload models while it runs; it serves the fixed set chosen at start "
    "(--model-repository, --models): restart it with the models wanted"
)


def call(fn, *args, **kwargs) -> tuple[str, str | None, str | None]:
    """("OK", None, None), or ("ERR", status, message) for what tritonclient raised."""
    from tritonclient.utils import InferenceServerException

    try:
        fn(*args, **kwargs)
    except InferenceServerException as exc:
        return "ERR", exc.status(), exc.message()
    return "OK", None, None


async def test_tritonclient_sees_the_repository_rpcs_wok_serves_and_why_not_load_and_unload(serve):
    import tritonclient.grpc as grpcclient

    async with serve(models=("mlp", "encoder")) as server:
        target = f"127.0.0.1:{server.port}"

        def with_tritonclient() -> dict:
            # Blocking, so off the event loop that serves it.
            with grpcclient.InferenceServerClient(target) as client:
                return {
                    "metadata": client.get_server_metadata(as_json=True),
                    "index": client.get_model_repository_index(as_json=True),
                    "load": call(client.load_model, "mlp"),
                    "load config": call(client.load_model, "mlp", config=json.dumps({"max_batch_size": 8})),
                    "unload": call(client.unload_model, "encoder"),
                    "unload dependents": call(client.unload_model, "mlp", unload_dependents=True),
                    "ready": [client.is_model_ready(m) for m in ("mlp", "encoder")],
                }

        got = await asyncio.to_thread(with_tritonclient)
    # The extension means the index, load and unload together.
    assert "model_repository" not in got["metadata"]["extensions"]
    assert [(m["name"], m["state"]) for m in got["index"]["models"]] == [("encoder", "READY"), ("mlp", "READY")]
    unimplemented = "StatusCode.UNIMPLEMENTED"
    assert got["load"] == ("ERR", unimplemented, f"cannot load model 'mlp': {FIXED}")
    assert got["load config"] == ("ERR", unimplemented, f"cannot load model 'mlp': {FIXED}")
    assert got["unload"] == ("ERR", unimplemented, f"cannot unload model 'encoder': {FIXED}")
    assert got["unload dependents"] == ("ERR", unimplemented, f"cannot unload model 'mlp': {FIXED}")
    assert got["ready"] == [True, True]


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
async def test_tritonclient_load_and_unload_name_the_model(serve, aio):
    async with serve(models=("mlp",)) as server:
        target = f"127.0.0.1:{server.port}"
        if aio:
            import tritonclient.grpc.aio as aioclient
            from tritonclient.utils import InferenceServerException

            got = []
            async with aioclient.InferenceServerClient(target) as client:
                for fn in (client.load_model, client.unload_model):
                    with pytest.raises(InferenceServerException) as info:
                        await fn("nope")
                    got.append((info.value.status(), info.value.message()))
        else:
            import tritonclient.grpc as grpcclient

            def sync() -> list:
                with grpcclient.InferenceServerClient(target) as client:
                    return [call(fn, "nope")[1:] for fn in (client.load_model, client.unload_model)]

            got = await asyncio.to_thread(sync)
    assert got == [
        ("StatusCode.UNIMPLEMENTED", f"cannot load model 'nope': {FIXED}"),
        ("StatusCode.UNIMPLEMENTED", f"cannot unload model 'nope': {FIXED}"),
    ]


def invalid_version(version: str) -> str:
    return (
        "model 'mlp': model version: expected an integer from 0 to 2**63-1 in decimal digits, or '' for the version "
        f"served (1); got '{version}'"
    )


async def test_tritonclient_gets_tritons_answers_for_a_version_on_every_model_rpc(serve):
    # As Triton: "01" is version 1; another integer is a version not served (ModelReady: not ready; ModelStatistics:
    # INVALID_ARGUMENT); what is no integer is INVALID_ARGUMENT, ModelReady's too (it answered ready=False), and
    # ModelStatistics' of every model.
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    def outcome(fn, *args):
        try:
            return fn(*args)
        except InferenceServerException as exc:
            return exc.status(), exc.message()

    async with serve(models=("mlp",)) as server:
        target = f"127.0.0.1:{server.port}"

        def with_tritonclient() -> dict:
            with grpcclient.InferenceServerClient(target) as client:
                got = {
                    v: [
                        outcome(client.is_model_ready, "mlp", v),
                        outcome(client.get_model_metadata, "mlp", v),
                        outcome(client.get_model_config, "mlp", v),
                        outcome(client.get_inference_statistics, "mlp", v),
                    ]
                    for v in ("01", "2", "-1", "9" * 20)
                }
                got["every model"] = outcome(client.get_inference_statistics, "", "-1")
                return got

        got = await asyncio.to_thread(with_tritonclient)
    ready, meta, config, stats = got["01"]
    assert ready is True and list(meta.versions) == ["1"] and config.config.name == "mlp"
    assert [(s.name, s.version) for s in stats.model_stats] == [("mlp", "1")]
    not_served = "model 'mlp' has no version '2'; available: 1"
    not_found = ("StatusCode.NOT_FOUND", not_served)
    # Triton's ModelStatistics answers a version it does not serve INVALID_ARGUMENT, its others NOT_FOUND.
    assert got["2"] == [False, not_found, not_found, ("StatusCode.INVALID_ARGUMENT", not_served)]
    for v in ("-1", "9" * 20):
        assert got[v] == [("StatusCode.INVALID_ARGUMENT", invalid_version(v))] * 4
    assert got["every model"] == ("StatusCode.INVALID_ARGUMENT", invalid_version("-1").removeprefix("model 'mlp': "))
