"""wok.clients against real servers started in the test's loop (`serve`).

The sync client runs in a worker thread (`asyncio.to_thread`) so the server's loop keeps
serving while it blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import socket
import threading

import grpc
import numpy as np
import pytest
import torch

from wok.clients import TLS, AsyncClient, Client, InferError, ModelInfo, StreamResult, TensorInfo, aio
from wok.clients.channel import channel_options, channel_target, service_config
from wok.clients.messages import StreamIds, stream_request, stream_result
from wok.servable import HostBuffers, Servable
from wok.v2pb import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(60)
TOL = {"rtol": 1e-5, "atol": 1e-6}
CODE = grpc.StatusCode


def requests_for(model: str, rng: np.random.Generator, n: int = 3) -> dict[str, np.ndarray]:
    if model == "mlp":
        return {"INPUT0": rng.standard_normal((n, 256), dtype=np.float32)}
    if model == "recsys":
        return {
            "dense": rng.standard_normal((n, 13), dtype=np.float32),
            "ids": rng.integers(0, 50, (n, 5), dtype=np.int64),
        }
    assert model == "encoder"
    return {"tokens": rng.integers(0, 50, (n, 11), dtype=np.int64)}


def reference(s: Servable, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The servable run directly on the CPU, as the executor would run a batch of one request."""
    rows = next(iter(inputs.values())).shape[0]
    with torch.inference_mode():
        if s.name == "mlp":
            out = {"OUTPUT0": s.module_for(torch.device("cpu"))(torch.from_numpy(inputs["INPUT0"]))}
        else:
            tensors = s.assemble([inputs], rows, HostBuffers(pinned=False))
            out = s.forward(s.module_for(torch.device("cpu")), s.prepare(tensors))
    return {k: v.numpy().copy() for k, v in out.items()}


def target(server) -> str:
    return f"127.0.0.1:{server.port}"


# -- channel targets ----------------------------------------------------------------------


def test_single_targets_pass_through():
    for t in ("127.0.0.1:1", "dns:///example.com:8001", "unix:/tmp/wok.sock", "ipv4:1.2.3.4:5,1.2.3.5:5"):
        assert channel_target(t) == t
        assert channel_target([t]) == t


def test_several_targets_make_one_uri():
    assert channel_target(["10.0.0.1:1", "10.0.0.2:2"]) == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target(("[::1]:1", "[fe80::2]:2")) == "ipv6:[::1]:1,[fe80::2]:2"


def test_several_targets_resolve_names(monkeypatch):
    def fake_getaddrinfo(host, port, *args, **kwargs):
        assert host == "box"
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    assert channel_target(["box:7", "10.0.0.2:8"]) == "ipv4:127.0.0.1:7,10.0.0.2:8"
    assert channel_target(["box:7", "[::2]:8"]) == "ipv6:[::1]:7,[::2]:8"


@pytest.mark.parametrize(
    "targets",
    [[], ["10.0.0.1:1", "[::1]:2"], ["10.0.0.1:1", "dns:///x:2"], ["10.0.0.1:1", "10.0.0.2"], ["1.2.3.4:1", "::1:2"]],
)
def test_bad_target_lists(targets):
    with pytest.raises(ValueError):
        channel_target(targets)


def test_channel_options_defaults_and_overrides():
    opts = dict(channel_options(None))
    assert opts["grpc.service_config"] == service_config()
    assert opts["grpc.max_receive_message_length"] == -1
    opts = dict(channel_options([("grpc.max_receive_message_length", 1024), ("grpc.primary_user_agent", "x")]))
    assert opts["grpc.max_receive_message_length"] == 1024 and opts["grpc.primary_user_agent"] == "x"


def test_tls_from_files_names_a_certificate_and_key_that_are_not_a_pair(tmp_path):
    """Caught when the files are read: gRPC itself would only fail every handshake, UNAVAILABLE
    "Failed to create security handshaker", without naming either file."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    pem = serialization.Encoding.PEM
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "wok test client")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    files = {
        "client.pem": cert.public_bytes(pem),
        "client.key": key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        "other.key": other.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        "locked.key": key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"secret")
        ),
    }
    for file, data in files.items():
        (tmp_path / file).write_bytes(data)
    ca, crt = tmp_path / "client.pem", tmp_path / "client.pem"  # a self-signed certificate is its own CA

    tls = TLS.from_files(ca, crt, tmp_path / "client.key")
    assert tls.certificate_chain == files["client.pem"] and tls.private_key == files["client.key"]
    with pytest.raises(ValueError, match="is not the key of the certificate") as err:
        TLS.from_files(ca, crt, tmp_path / "other.key")
    assert str(tmp_path / "other.key") in str(err.value) and str(crt) in str(err.value)
    with pytest.raises(ValueError, match=r"locked\.key is encrypted"):
        TLS.from_files(ca, crt, tmp_path / "locked.key")
    with pytest.raises(ValueError, match=r"client\.key: expected a PEM certificate") as err:
        TLS.from_files(ca, tmp_path / "client.key", tmp_path / "client.key")  # the key given as the certificate
    assert "PRIVATE" not in str(err.value)  # never the key itself


@pytest.mark.parametrize("memfd", [True, False], ids=["in-memory", "temporary-folder"])
def test_tls_from_bytes_refuses_a_certificate_and_key_that_are_not_a_pair(memfd, monkeypatch):
    """The same check as `TLS.from_files` when the PEM bytes are given directly: a mismatched pair
    would otherwise fail every handshake with gRPC's opaque UNAVAILABLE. OpenSSL reads them from
    memory-backed files, or (without memfd_create, as on macOS) from a private temporary folder."""
    if not memfd:
        monkeypatch.delattr(os, "memfd_create", raising=False)
    elif not hasattr(os, "memfd_create"):
        pytest.skip("no memfd_create on this system")
    pairs = [self_signed_pair(f"wok test client {i}") for i in range(2)]
    (cert, key), (_, other) = pairs
    tls = TLS(cert, cert, key)
    assert tls.certificate_chain == cert and tls.private_key == key
    with pytest.raises(ValueError, match="is not the key of the certificate") as err:
        TLS(cert, cert, other)
    assert "private_key" in str(err.value) and "certificate_chain" in str(err.value)
    with pytest.raises(ValueError, match="expected a PEM certificate") as err:
        TLS(cert, key, key)  # the key given as the certificate
    assert "PRIVATE" not in str(err.value)  # never the key itself


def self_signed_pair(name: str) -> tuple[bytes, bytes]:
    """A self-signed certificate for `name` and its unencrypted key, as PEM."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return cert.public_bytes(pem), key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def test_infer_error_message_and_pickle():
    err = InferError(CODE.NOT_FOUND, "no model 'x'")
    assert str(err) == "NOT_FOUND: no model 'x'"
    back = pickle.loads(pickle.dumps(err))
    assert (back.code, back.details, str(back)) == (err.code, err.details, str(err))


def test_async_client_makes_no_channel_outside_a_loop():
    client = AsyncClient("127.0.0.1:1")
    assert client._channel is None
    with pytest.raises(RuntimeError):
        client._connect()


# -- the async client ------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["mlp", "recsys", "encoder"])
async def test_infer_matches_the_servable(serve, model):
    rng = np.random.default_rng(1)
    inputs = requests_for(model, rng)
    async with serve(models=(model,)) as server, AsyncClient(target(server)) as client:
        out = await client.infer(model, inputs, request_id="r1")
        want = reference(server.runtimes[model].servable, inputs)
    assert out.keys() == want.keys()
    for name, a in out.items():
        assert a.shape == want[name].shape and a.dtype == want[name].dtype
        np.testing.assert_allclose(a, want[name], **TOL)
    expected_shape = {"mlp": (3, 256), "recsys": (3, 1), "encoder": (3, 128)}[model]
    assert next(iter(out.values())).shape == expected_shape


async def test_health_metadata_and_statistics(serve):
    rng = np.random.default_rng(2)
    async with serve(models=("mlp", "recsys")) as server, AsyncClient(target(server)) as client:
        assert await client.server_live() and await client.server_ready()
        assert await client.model_ready("mlp")
        assert not await client.model_ready("nope")

        info = await client.model_metadata("recsys")
        assert isinstance(info, ModelInfo) and info.name == "recsys"
        assert list(info.inputs) == ["dense", "ids"]
        assert info.inputs["dense"] == TensorInfo("dense", "FP32", (-1, 13))
        assert info.inputs["ids"].shape == (-1, -1) and info.inputs["ids"].numpy_dtype == np.int64
        assert info.outputs["score"] == TensorInfo("score", "FP32", (-1, 1))

        assert (await client.server_metadata()).name == "wok"
        assert (await client.model_config("mlp")).config.max_batch_size == 32
        assert [m.name for m in (await client.repository_index()).models] == ["mlp", "recsys"]

        await client.infer("mlp", requests_for("mlp", rng, n=4))
        (stats,) = (await client.model_statistics("mlp")).model_stats
        assert stats.name == "mlp" and stats.inference_count == 4 and stats.execution_count == 1
        assert {s.name for s in (await client.model_statistics()).model_stats} == {"mlp", "recsys"}


async def test_repository_index_can_ask_for_the_ready_models_only(serve):
    """Neither client could send V2's `ready` flag, which the server honours: a client asking
    which models it can infer on was also given one whose batcher had failed."""
    rng = np.random.default_rng(20)
    async with serve(models=("mlp", "recsys")) as server, AsyncClient(target(server)) as client:

        async def index(**kw) -> list[tuple[str, str, str]]:
            return [(m.name, m.state, m.reason) for m in (await client.repository_index(timeout=10, **kw)).models]

        def sync_index(**kw) -> list[tuple[str, str, str]]:
            with Client(target(server)) as c:
                return [(m.name, m.state, m.reason) for m in c.repository_index(timeout=10, **kw).models]

        both_ready = [("mlp", "READY", ""), ("recsys", "READY", "")]
        for ready in (False, True):
            assert await index(ready=ready) == both_ready
            assert await asyncio.to_thread(sync_index, ready=ready) == both_ready

        def bug(*args, **kwargs):
            raise RuntimeError("a bug in the batcher")

        server.runtimes["recsys"].batcher._form = bug  # the batching task's next decision raises
        with pytest.raises(InferError, match="batcher failed: a bug in the batcher"):
            await client.infer("recsys", requests_for("recsys", rng), timeout=10)
        reason = "batcher failed: a bug in the batcher; the model refuses every request until the server restarts"
        listed = [("mlp", "READY", ""), ("recsys", "UNAVAILABLE", reason)]
        assert await index() == listed
        assert await asyncio.to_thread(sync_index) == listed
        assert await index(ready=True) == [("mlp", "READY", "")]
        assert await asyncio.to_thread(sync_index, ready=True) == [("mlp", "READY", "")]


async def test_outputs_are_selected_by_name(serve):
    x = requests_for("mlp", np.random.default_rng(3))
    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        assert (await client.infer("mlp", x, outputs=["OUTPUT0"])).keys() == {"OUTPUT0"}
        with pytest.raises(InferError) as e:
            await client.infer("mlp", x, outputs=["OUTPUT9"])
    assert e.value.code == CODE.INVALID_ARGUMENT and "OUTPUT9" in e.value.details


async def test_errors_carry_code_and_details(serve):
    x = requests_for("mlp", np.random.default_rng(4))
    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        with pytest.raises(InferError) as e:
            await client.infer("nope", x)
        assert e.value.code == CODE.NOT_FOUND and "nope" in e.value.details
        assert str(e.value) == f"NOT_FOUND: {e.value.details}"

        with pytest.raises(InferError) as e:
            await client.infer("mlp", {"INPUT0": x["INPUT0"][:, :255]})
        assert e.value.code == CODE.INVALID_ARGUMENT
        assert "INPUT0" in e.value.details and "[3, 255]" in e.value.details

        with pytest.raises(InferError) as e:
            await client.model_metadata("nope")
        assert e.value.code == CODE.NOT_FOUND

        # The client is still usable after failures.
        assert (await client.infer("mlp", x))["OUTPUT0"].shape == (3, 256)


async def test_deadlines(serve):
    x = requests_for("mlp", np.random.default_rng(5))
    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        with pytest.raises(InferError) as e:
            await client.infer("mlp", x, timeout=1e-6)
        assert e.value.code == CODE.DEADLINE_EXCEEDED
        # A 1 us queue budget has passed by the time the request reaches the batcher: refused on arrival.
        with pytest.raises(InferError) as e:
            await client.infer("mlp", x, server_timeout_us=1)
        assert e.value.code == CODE.DEADLINE_EXCEEDED and "deadline" in e.value.details


async def test_cancellation_is_not_swallowed(serve):
    x = requests_for("mlp", np.random.default_rng(6))
    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        batcher = server.runtimes["mlp"].batcher
        task = asyncio.ensure_future(client.infer("mlp", x))

        async def reached_the_batcher():
            while not (batcher.queued or batcher.inflight or task.done()):
                await asyncio.sleep(0)

        await asyncio.wait_for(reached_the_batcher(), 10)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await client.infer("mlp", x))["OUTPUT0"].shape == (3, 256)


async def test_stream_with_a_bad_request_in_the_middle(serve):
    rng = np.random.default_rng(7)
    good = [requests_for("mlp", rng, n=i + 1) for i in range(4)]
    bad = {"INPUT0": np.zeros((2, 7), np.float32)}

    async def requests():
        yield ("mlp", good[0])
        yield {"model": "mlp", "inputs": good[1], "request_id": "mine"}
        yield ("mlp", bad)
        yield {"model": "nope", "inputs": good[2]}
        yield {"model": "mlp", "inputs": good[3], "outputs": ["OUTPUT0"]}

    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        results = [r async for r in client.stream_infer(requests())]
        servable = server.runtimes["mlp"].servable
        by_id = {r.id: r for r in results}
        assert len(results) == 5 and by_id.keys() == {"0", "mine", "2", "3", "4"}
        assert all(isinstance(r, StreamResult) for r in results)
        for rid, inputs in (("0", good[0]), ("mine", good[1]), ("4", good[3])):
            r = by_id[rid]
            assert r.ok and r.model == "mlp"
            np.testing.assert_allclose(r.outputs["OUTPUT0"], reference(servable, inputs)["OUTPUT0"], **TOL)
        assert not by_id["2"].ok and by_id["2"].outputs is None
        assert "INPUT0" in by_id["2"].error and "[2, 7]" in by_id["2"].error
        assert not by_id["3"].ok and "nope" in by_id["3"].error


async def test_stream_accepts_a_plain_iterable_and_reports_caller_errors(serve):
    x = requests_for("mlp", np.random.default_rng(8))

    def requests():
        yield ("mlp", x)
        raise ValueError("caller's own failure")

    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        seen = []
        with pytest.raises(ValueError, match="caller's own failure"):
            async for r in client.stream_infer(requests()):
                seen.append(r)
        assert [(r.id, r.ok) for r in seen] == [("0", True)]

        with pytest.raises(TypeError, match="stream request 1"):
            async for _ in client.stream_infer([("mlp", x), {"model": "mlp", "input": x}]):
                pass


@pytest.fixture(params=["3.11", "3.10"])
def cancel_check(request, monkeypatch):
    """Both ways the stream's writer tells its own cancellation from the caller's CancelledError:
    Task.cancelling() (3.11+), and the call's state on 3.10, which has no count."""
    monkeypatch.setattr(aio, "_COUNTS_CANCELS", request.param == "3.11")
    verdicts = []
    real = aio._cancelled

    def cancelled(call) -> bool:
        verdicts.append(real(call))
        return verdicts[-1]

    monkeypatch.setattr(aio, "_cancelled", cancelled)
    return verdicts  # one per CancelledError that ended a writer: was it the writer's own?


async def test_leaving_a_stream_early_cancels_it(serve, cancel_check):
    x = requests_for("mlp", np.random.default_rng(9))
    more = asyncio.Event()

    async def requests():
        yield ("mlp", x)
        await more.wait()  # never set: the stream stays open until the client leaves
        yield ("mlp", x)

    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        async with contextlib.aclosing(client.stream_infer(requests())) as results:
            async for r in results:
                assert r.ok
                break
        assert (await client.infer("mlp", x))["OUTPUT0"].shape == (3, 256)
    assert cancel_check == [True]  # the writer, waiting in the caller's iterator, was cancelled


@pytest.mark.parametrize("balancer", ["grpc", "wok"])
async def test_a_client_closed_under_an_open_stream_ends_it_with_infer_error(serve, balancer):
    # Closing the channel cancels the call under the reader: that came out of stream_infer as a
    # bare CancelledError, as if the caller's own task had been cancelled.
    x = requests_for("mlp", np.random.default_rng(9))
    more = asyncio.Event()

    async def requests():
        yield ("mlp", x)
        await more.wait()  # never set: the stream stays open
        yield ("mlp", x)

    async with serve(models=("mlp",)) as server:
        client = AsyncClient(target(server), balancer=balancer)
        got = []
        with pytest.raises(InferError) as err:
            async for r in client.stream_infer(requests()):
                got.append(r.ok)
                await client.close()
        assert got == [True] and err.value.code == grpc.StatusCode.CANCELLED, err.value


@pytest.mark.parametrize("counts_cancels", [True, False])
async def test_a_cancelled_stream_reader_gets_its_cancellation(serve, monkeypatch, counts_cancels):
    # grpc cancels the call when the reading task is cancelled, so the call's state looks as it
    # does when the channel is closed under it; Python 3.10 (no Task.cancelling) turned the
    # caller's own cancellation into InferError. False: as on 3.10.
    monkeypatch.setattr(aio, "_COUNTS_CANCELS", counts_cancels and aio._COUNTS_CANCELS)
    x = requests_for("mlp", np.random.default_rng(9))
    more = asyncio.Event()
    first = asyncio.Event()

    async def requests():
        yield ("mlp", x)
        await more.wait()  # never set: the stream stays open
        yield ("mlp", x)

    async def read(client):
        async for _ in client.stream_infer(requests()):
            first.set()

    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        reader = asyncio.ensure_future(read(client))
        await first.wait()
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert (await client.infer("mlp", x))["OUTPUT0"].shape == (3, 256)


async def test_stream_deadline_raises(serve):
    x = requests_for("mlp", np.random.default_rng(10))

    async def requests():
        yield ("mlp", x)
        await asyncio.Event().wait()

    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        seen = []
        with pytest.raises(InferError) as e:
            async for r in client.stream_infer(requests(), timeout=0.5):
                seen.append(r)
        assert e.value.code == CODE.DEADLINE_EXCEEDED and len(seen) == 1


async def test_sync_stream_deadline_raises_while_nothing_is_in_flight(serve):
    # The caller waits for a request to go out, not in grpc's iterator, while nothing is in flight
    # (so that a refused request's result can reach it): the call's end must wake it.
    x = requests_for("mlp", np.random.default_rng(10))
    stop = threading.Event()

    def requests():
        yield ("mlp", x)
        stop.wait()  # the stream stays open, with nothing in flight, until its deadline

    def run() -> list[StreamResult]:
        seen = []
        with Client(target(server)) as client, pytest.raises(InferError) as e:
            for r in client.stream_infer(requests(), timeout=0.5):
                seen.append(r)
        assert e.value.code == CODE.DEADLINE_EXCEEDED, e.value
        return seen

    async with serve(models=("mlp",)) as server:
        try:
            assert [r.ok for r in await asyncio.to_thread(run)] == [True]
        finally:
            stop.set()  # grpc's thread, in the requests, ends


async def test_stream_results_carry_the_servers_status_code(serve):
    x = requests_for("mlp", np.random.default_rng(13))
    items = [("mlp", x), ("mlp", {"INPUT0": np.zeros((2, 7), np.float32)}), ("nope", x)]
    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        by_id = {r.id: r async for r in client.stream_infer(items)}
    assert {k: r.code for k, r in by_id.items()} == {"0": None, "1": CODE.INVALID_ARGUMENT, "2": CODE.NOT_FOUND}


def test_a_stream_answer_without_a_status_code_fails_as_unknown():
    # A server other than wok (Triton) sends only the message.
    msg = pb.ModelStreamInferResponse(error_message="no", infer_response=pb.ModelInferResponse(id="7"))
    assert stream_result(msg) == StreamResult("7", "", None, "no", CODE.UNKNOWN)


async def test_a_cancelled_error_from_the_callers_iterator_ends_the_stream_and_is_raised(serve, cancel_check):
    x = requests_for("mlp", np.random.default_rng(14))

    async def requests():
        yield ("mlp", x)
        yield ("mlp", x)
        raise asyncio.CancelledError("the caller's own")  # as an await on a cancelled future raises

    async def consume(client):
        seen = []
        try:
            async for r in client.stream_infer(requests()):  # no deadline: a missing half-close hangs
                seen.append(r)
        except asyncio.CancelledError as exc:
            return seen, exc
        return seen, None

    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        seen, exc = await asyncio.wait_for(consume(client), 10)
    assert sorted((r.id, r.ok) for r in seen) == [("0", True), ("1", True)]
    assert exc is not None and exc.args == ("the caller's own",) and cancel_check == [False]


@pytest.mark.parametrize(
    "ids",
    [
        ["0", None, "2"],  # a number at its own position is its automatic id anyway
        ["a", None, "b"],
        ["007", None, None],  # not of the automatic form
        ["7", "3", "12"],  # no automatic ids in this stream
        [None, "", None],
    ],
)
def test_stream_ids_that_cannot_collide_pass(ids):
    stream = StreamIds()
    assigned = [stream.id_for(i, rid) for i, rid in enumerate(ids)]
    assert assigned == [rid or str(i) for i, rid in enumerate(ids)]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (["1", None], r"stream request 1: has no request_id, so it would get the automatic id '1', .*'1'"),
        (["5", None], r"stream request 1: has no request_id, .* stream request 0's request_id '5'"),
        ([None, "0"], r"stream request 1: request_id '0' is a number other than its position"),
        ([None, "x", "9"], r"stream request 2: request_id '9' .* \(the first: stream request 0\)"),
    ],
)
def test_stream_ids_that_could_collide_are_refused(ids, message):
    stream = StreamIds()
    with pytest.raises(ValueError, match=message):
        for i, rid in enumerate(ids):
            stream.id_for(i, rid)


# Text the caller gave is shown in a message as the server shows a request's names (wok.errors' quoted_name):
# in single quotes whatever it holds, cut past 200 characters to its start and its length. It was its repr,
# or put in quotes as it was: a 100,000-character string written out whole, twice.
def test_stream_ids_show_a_callers_id_cut_as_names_are():
    stream = StreamIds()
    stream.id_for(0, "1" * 300)
    with pytest.raises(ValueError) as info:
        stream.id_for(1, None)
    assert f"stream request 0's request_id '{'1' * 200}'… (300 characters in all), a number other" in str(info.value)
    stream = StreamIds()
    stream.id_for(0, None)
    with pytest.raises(ValueError) as info:
        stream.id_for(1, "2" * 300)
    assert str(info.value).startswith(f"stream request 1: request_id '{'2' * 200}'… (300 characters in all) is a ")


async def test_a_refused_argument_is_shown_quoted_and_cut_as_names_are():
    with pytest.raises(ValueError) as info:
        AsyncClient("127.0.0.1:1", balancer="it's")
    assert str(info.value) == "balancer: expected 'grpc' or 'wok'; got 'it's'"
    with pytest.raises(ValueError) as info:
        AsyncClient("127.0.0.1:1", balancer=None)
    assert str(info.value) == "balancer: expected 'grpc' or 'wok'; got None"
    with pytest.raises(ValueError) as info:
        channel_target(["127.0.0.1:1", "it's"])
    assert str(info.value) == "target: expected host:port or [ipv6]:port, as each of several is; got 'it's'"
    # Nothing listens on port 1: each call is refused before anything is sent.
    name = "O" * 1000
    shown = f"'{'O' * 200}'… (1,000 characters in all)"
    async with AsyncClient("127.0.0.1:1") as client:
        with pytest.raises(TypeError) as info:
            await client.infer("mlp", {"INPUT0": np.ones((1, 256), np.float32)}, outputs=name)
    assert str(info.value) == f"outputs: expected a list of output names; got the string {shown}; pass [{shown}]"


TARGET_EXPECTED = "target: expected host:port, a gRPC target URI or a list of them; got "


@pytest.mark.parametrize(
    ("target", "got"),
    [("", "''"), ("  ", "'  '"), ([], "an empty list"), ((), "an empty tuple"), ([""], "['']")],
    ids=["empty", "blank", "empty-list", "empty-tuple", "one-empty"],
)
async def test_no_target_is_refused_saying_what_was_given(target, got):
    # An empty list was "no target given", naming nothing given; an empty string made a client whose first call
    # failed UNKNOWN, "the target uri is not valid".
    with pytest.raises(ValueError) as info:
        channel_target(target)
    assert str(info.value) == TARGET_EXPECTED + got
    with pytest.raises(ValueError) as info:
        AsyncClient(target)
    assert str(info.value) == TARGET_EXPECTED + got
    with pytest.raises(ValueError) as info:
        Client(target)
    assert str(info.value) == TARGET_EXPECTED + got


def test_a_target_of_no_string_nor_list_is_refused_by_its_type():
    # None was list()'s "'NoneType' object is not iterable", naming no argument.
    for given in (None, 8001):
        with pytest.raises(TypeError) as info:
            Client(given)
        assert str(info.value) == TARGET_EXPECTED + repr(given)


def test_the_wok_balancer_refuses_an_empty_list_of_targets_saying_so():
    from wok.clients.balancer import split_targets

    with pytest.raises(ValueError) as info:
        split_targets([])
    assert str(info.value) == (
        "target: expected host:port, [ipv6]:port, dns:///name:port or a list of them; got an empty list"
    )


@pytest.mark.parametrize("given", [None, 8001, b"127.0.0.1:8001"], ids=["none", "int", "bytes"])
def test_a_target_of_no_string_nor_list_is_refused_by_its_type_by_either_balancer(given):
    # The wok balancer's was list()'s "'NoneType' object is not iterable" (WORDING59 named only gRPC's); bytes were read
    # as a list of integers: "argument of type 'int' is not iterable" with gRPC's, "target '49': ... needs host:port"
    # with wok's.
    with pytest.raises(TypeError) as info:
        channel_target(given)
    assert str(info.value) == TARGET_EXPECTED + repr(given)
    with pytest.raises(TypeError) as info:
        AsyncClient(given, balancer="wok")
    assert str(info.value) == (
        f"target: expected host:port, [ipv6]:port, dns:///name:port or a list of them; got {given!r}"
    )


async def test_a_callers_id_that_an_automatic_id_repeats_is_refused_after_the_results(serve):
    x = requests_for("mlp", np.random.default_rng(15))
    items = [{"model": "mlp", "inputs": x, "request_id": "1"}, ("mlp", x), ("mlp", x)]
    async with serve(models=("mlp",)) as server, AsyncClient(target(server)) as client:
        seen = []
        with pytest.raises(ValueError, match=r"stream request 1: .*request_id '1'"):
            async for r in client.stream_infer(items):
                seen.append(r)
        assert [(r.id, r.ok) for r in seen] == [("1", True)]

        def sync_stream() -> list[StreamResult]:
            got = []
            with Client(target(server)) as sync, pytest.raises(ValueError, match=r"stream request 1: .*'1'"):
                for r in sync.stream_infer(items, timeout=10):
                    got.append(r)
            return got

        assert [(r.id, r.ok) for r in await asyncio.to_thread(sync_stream)] == [("1", True)]


async def test_closed_client_refuses_calls(serve):
    async with serve(models=("mlp",)) as server:
        client = AsyncClient(target(server))
        assert await client.server_live()
        await client.close()
        await client.close()
        with pytest.raises(RuntimeError, match="closed"):
            await client.server_live()


async def test_several_targets_reach_every_server(serve):
    rng = np.random.default_rng(11)
    x = requests_for("mlp", rng, n=1)
    async with serve(models=("mlp",)) as a, serve(models=("mlp",)) as b:
        stats = [a.runtimes["mlp"].stats, b.runtimes["mlp"].stats]
        async with AsyncClient([target(a), target(b)]) as client:
            assert client.target == f"ipv4:{target(a)},{target(b)}"
            await client.wait_ready(timeout=10)
            # round_robin only picks subchannels that are READY; the second may still be
            # connecting after the first call, so send until both have answered (bounded).
            for _ in range(200):
                await client.infer("mlp", x)
                if all(s.inference_count for s in stats):
                    break
    assert all(s.inference_count > 0 and s.execution_count > 0 for s in stats)


async def _refused_after_wait_ready(fail, balancer: str = "grpc") -> InferError:
    """The InferError of `await fail(client)` on a client of a port that refuses connections, after
    its wait_ready timed out."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        async with AsyncClient(f"127.0.0.1:{s.getsockname()[1]}", balancer=balancer) as client:
            with pytest.raises(TimeoutError):
                await client.wait_ready(timeout=0.2)
            with pytest.raises(InferError) as e:
                await fail(client)
    return e.value


def test_wait_ready_times_out_without_a_server_and_leaves_no_watch_past_close(on_a_loop_then_closed):
    """wait_ready's channel_ready(), cancelled at its timeout, left its connectivity watch in gRPC's
    core, to complete when the channel went: at close() unless a call held the channel, as a
    failed call's InferError did (its context's traceback held the call), or unless the loop
    closed first. Either way it was left to a closed loop ("Event loop is closed" later)."""

    async def use() -> InferError:
        error = await _refused_after_wait_ready(lambda client: client.server_live(timeout=5))
        assert error.code in (CODE.UNAVAILABLE, CODE.DEADLINE_EXCEEDED)
        return error  # the caller keeps its error past close, past the loop even

    left = on_a_loop_then_closed(use)
    assert not left, left[0]


@pytest.mark.parametrize("balancer", ["grpc", "wok"])
def test_a_failed_streams_error_kept_past_close_leaves_no_watch(balancer, on_a_loop_then_closed):
    """The stream's frame, in its error's traceback, held the call, and the call the channel."""

    async def read_all(client) -> None:
        async for _ in client.stream_infer([]):
            pass

    left = on_a_loop_then_closed(lambda: _refused_after_wait_ready(read_all, balancer))
    assert not left, left[0]


def test_a_closed_sync_client_says_so():
    # grpc's own ValueError ("Cannot invoke RPC on closed channel!") reached the caller, which
    # the docs promise InferError for failed calls; a call on a closed client is the caller's
    # mistake, and raises what AsyncClient's does.
    x = requests_for("mlp", np.random.default_rng(1))
    client = Client("127.0.0.1:1")  # never connected: it is closed first
    client.close()
    for call in (
        lambda: client.infer("mlp", x),
        lambda: client.server_live(),
        lambda: list(client.stream_infer([("mlp", x)])),
    ):
        with pytest.raises(RuntimeError, match="this Client is closed"):
            call()


def test_sync_wait_ready_times_out_and_stops_watching_the_channel(monkeypatch):
    made = []
    real = grpc.channel_ready_future

    def keep(channel):
        made.append(real(channel))
        return made[-1]

    monkeypatch.setattr(grpc, "channel_ready_future", keep)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with Client(f"127.0.0.1:{port}") as client:
            with pytest.raises(TimeoutError, match=f"^'127.0.0.1:{port}': not connected within 0.2 s$"):
                client.wait_ready(timeout=0.2)
            (ready,) = made
            assert ready.cancelled()


async def test_wait_ready_quotes_the_target_it_names():
    """The target is the user's text: shown bare, one with a newline split the message's line (and
    forged a line of a client's log), as the balancer's messages no longer do."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        target = f"127.0.0.1:{port}\nERROR forged"
        expected = f"'127.0.0.1:{port}\\nERROR forged': not connected within 0.2 s"
        async with AsyncClient(target) as client:
            with pytest.raises(TimeoutError) as err:
                await client.wait_ready(timeout=0.2)
        assert str(err.value) == expected
        with Client(target) as client:
            with pytest.raises(TimeoutError) as err:
                await asyncio.to_thread(client.wait_ready, timeout=0.2)
        assert str(err.value) == expected


# -- the sync client ---------------------------------------------------------------------------


async def test_sync_client(serve):
    rng = np.random.default_rng(12)
    xs = [requests_for("mlp", rng, n=2) for _ in range(3)]

    def run(address: str):
        with pytest.raises(RuntimeError):  # no loop hides in this thread
            asyncio.get_running_loop()
        with Client(address) as client:
            client.wait_ready(timeout=10)
            assert client.server_live() and client.server_ready() and client.model_ready("mlp")
            info = client.model_metadata("mlp")
            assert info.inputs["INPUT0"].shape == (-1, 256) and info.outputs["OUTPUT0"].datatype == "FP32"
            assert client.model_config("mlp").config.name == "mlp"
            assert client.server_metadata().name == "wok"
            assert [m.name for m in client.repository_index().models] == ["mlp"]
            out = client.infer("mlp", xs[0], request_id="s")
            errors = []
            for call in (
                lambda: client.infer("nope", xs[0]),
                lambda: client.infer("mlp", {"INPUT0": np.zeros((1, 3), np.float32)}),
                lambda: client.infer("mlp", xs[0], timeout=1e-6),
            ):
                with pytest.raises(InferError) as e:
                    call()
                errors.append(e.value)
            bad = {"INPUT0": np.zeros((1, 3), np.float32)}
            stream = list(client.stream_infer([("mlp", xs[1]), ("mlp", bad), {"model": "mlp", "inputs": xs[2]}]))

            def failing():
                yield ("mlp", xs[1])
                raise ValueError("caller's own failure")

            seen = []
            with pytest.raises(ValueError, match="caller's own failure"):
                for r in client.stream_infer(failing()):
                    seen.append(r)
            stats = client.model_statistics("mlp").model_stats[0]
        return out, errors, stream, seen, stats

    async with serve(models=("mlp",)) as server:
        out, errors, stream, seen, stats = await asyncio.to_thread(run, target(server))
        servable = server.runtimes["mlp"].servable
    np.testing.assert_allclose(out["OUTPUT0"], reference(servable, xs[0])["OUTPUT0"], **TOL)
    assert [e.code for e in errors] == [CODE.NOT_FOUND, CODE.INVALID_ARGUMENT, CODE.DEADLINE_EXCEEDED]
    assert "nope" in errors[0].details and "INPUT0" in errors[1].details
    by_id = {r.id: r for r in stream}
    assert by_id.keys() == {"0", "1", "2"}
    assert by_id["0"].ok and by_id["2"].ok and not by_id["1"].ok and "INPUT0" in by_id["1"].error
    np.testing.assert_allclose(by_id["2"].outputs["OUTPUT0"], reference(servable, xs[2])["OUTPUT0"], **TOL)
    assert [(r.id, r.ok) for r in seen] == [("0", True)]
    assert stats.inference_count == 2 + 2 + 2 + 2  # infer, two good stream requests, the failing stream's one


async def test_sync_stream_raises_a_base_exception_from_the_callers_iterator_after_the_results(serve):
    x = requests_for("mlp", np.random.default_rng(16))

    def requests():
        yield ("mlp", x)
        yield ("mlp", x)
        raise SystemExit(3)

    def run(address: str):
        seen = []
        with Client(address) as client, pytest.raises(SystemExit) as exc:
            # The deadline only bounds a hang: without the half-close the stream would end there.
            for r in client.stream_infer(requests(), timeout=5):
                seen.append(r)
        return seen, exc.value

    async with serve(models=("mlp",)) as server:
        seen, exc = await asyncio.to_thread(run, target(server))
    assert sorted((r.id, r.ok) for r in seen) == [("0", True), ("1", True)] and exc.code == 3


def bf16_repository(root) -> object:
    """A model whose input and output are BF16: bfloat16 doubles of its input."""
    d = root / "half"
    d.mkdir(parents=True)
    (d / "model.py").write_text(
        "import torch\n\n\nclass Double(torch.nn.Module):\n"
        "    def forward(self, x):\n        return x * 2\n\n\ndef build():\n    return Double()\n"
    )
    (d / "config.toml").write_text(
        'platform = "python"\nfactory = "model:build"\nmax_batch_size = 4\n\n'
        '[[inputs]]\nname = "A"\ndatatype = "BF16"\ndims = [3]\n\n'
        '[[outputs]]\nname = "B"\ndatatype = "BF16"\ndims = [3]\n\n'
        '[dynamic_batching]\nmax_queue_delay_ms = 1.0\n\n[instances]\ndevices = ["cpu"]\n'
    )
    return root


async def test_bf16_inputs_travel_when_the_caller_names_their_datatype(serve, tmp_path):
    # BF16 travels as uint16 words: without `datatypes` the request says UINT16 and is refused.
    words = torch.tensor([[1.0, -2.5, 0.15625]], dtype=torch.bfloat16).view(torch.uint16).numpy()
    doubled = torch.tensor([[2.0, -5.0, 0.3125]], dtype=torch.bfloat16).view(torch.uint16).numpy()
    async with serve(repository=bf16_repository(tmp_path / "repo")) as server:
        async with AsyncClient(target(server)) as client:
            with pytest.raises(InferError) as info:
                await client.infer("half", {"A": words})
            assert info.value.code == CODE.INVALID_ARGUMENT
            assert info.value.details == "input 'A': expected datatype BF16; got UINT16"
            out = await client.infer("half", {"A": words}, datatypes={"A": "BF16"})
            np.testing.assert_array_equal(out["B"], doubled)
            (item,) = [
                r
                async for r in client.stream_infer(
                    [{"model": "half", "inputs": {"A": words}, "datatypes": {"A": "BF16"}}]
                )
            ]
            assert item.ok and np.array_equal(item.outputs["B"], doubled)
        with Client(target(server)) as sync:
            out = await asyncio.to_thread(sync.infer, "half", {"A": words}, datatypes={"A": "BF16"})
    np.testing.assert_array_equal(out["B"], doubled)


async def test_an_array_whose_dtype_is_not_the_named_datatype_is_refused_and_ml_dtypes_bfloat16_needs_none(
    serve, tmp_path
):
    import ml_dtypes  # a test dependency: tritonclient (the test extras) requires it

    halves = np.array([[1.0, -2.5, 0.15625]], np.float16)  # as BF16 words these would be other numbers
    typed = np.array([[1.0, -2.5, 0.15625]], ml_dtypes.bfloat16)
    refused = (
        "input 'A': expected an array of uint16 (bfloat16 words) or ml_dtypes.bfloat16 for datatype BF16; got float16"
    )
    with pytest.raises(ValueError) as info:
        stream_request({"model": "half", "inputs": {"A": halves}, "datatypes": {"A": "BF16"}}, 0, StreamIds())
    assert str(info.value) == refused
    async with serve(repository=bf16_repository(tmp_path / "repo")) as server:
        async with AsyncClient(target(server)) as client:
            with pytest.raises(ValueError) as info:
                await client.infer("half", {"A": halves}, datatypes={"A": "BF16"})
            assert str(info.value) == refused
            out = await client.infer("half", {"A": typed})
            assert out["B"].view(ml_dtypes.bfloat16).tolist() == [[2.0, -5.0, 0.3125]]
        with Client(target(server)) as sync:
            with pytest.raises(ValueError) as info:
                await asyncio.to_thread(sync.infer, "half", {"A": halves}, datatypes={"A": "BF16"})
            assert str(info.value) == refused
            out = await asyncio.to_thread(sync.infer, "half", {"A": typed})
    assert out["B"].view(ml_dtypes.bfloat16).tolist() == [[2.0, -5.0, 0.3125]]


async def test_wait_ready_cut_by_close_says_the_channel_is_closed():
    """close() while wait_ready waits: its watch ends with the channel, grpc's UsageError."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        client = AsyncClient(f"127.0.0.1:{s.getsockname()[1]}")
        waiting = asyncio.ensure_future(client.wait_ready())
        while client._watch is None:  # its watch begun: a loop turn or two
            await asyncio.sleep(0)
        await client.close()
        with pytest.raises(grpc.aio.UsageError, match="Channel is closed"):
            await waiting


async def test_wait_ready_whose_watch_close_had_to_cancel_says_the_channel_is_closed():
    """A watch that does not end with its channel (a call still holds the channel in gRPC's core)
    is cancelled by close() as its last resort: wait_ready, itself not cancelled, must not raise
    CancelledError to its caller, but what a closed channel raises."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        client = AsyncClient(f"127.0.0.1:{s.getsockname()[1]}")
        await client._open()
        held = asyncio.Event()

        async def held_in_core(state):
            held.set()
            await asyncio.Event().wait()  # ends only when cancelled

        client._channel.wait_for_state_change = held_in_core
        waiting = asyncio.ensure_future(client.wait_ready())
        await held.wait()
        await client.close()
        assert client._watch.cancelled()
        with pytest.raises(grpc.aio.UsageError, match="Channel is closed"):
            await waiting
        assert not waiting.cancelled()
