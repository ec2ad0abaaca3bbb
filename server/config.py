"""Typed settings: the server's and each model's, checked at construction.

Every field says its unit. A model's config is read from `config.toml` or `config.yaml`
in its folder of the repository; a bad value fails the load with the file, the field and
what was wrong (see `load_model_config`).
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import sys
import typing
import unicodedata
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .auth import check_tls_files, load_tokens, read_secret_file
from .codec import IDS_BOUND_PREFIX, MAX_PRIORITY_LEVEL
from .datatypes import DATATYPES
from .errors import NAME_CHARS, ConfigError, cut_message, quoted_name, shown_data, shown_value
from .faults import MAX_QUEUE_DELAY_MS
from .numerals import ascii_digits

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class _Strict(BaseModel):
    # Numbers and switches are pydantic's Strict types: in a hand-written config a quoted
    # "64", "5" or "false", a 64.0 count or a 1 for true is a slip to name, not a value to
    # guess at. StrictFloat still takes an int (not a bool): `max_queue_delay_ms = 5` is 5.0.
    # Each float field says allow_inf_nan=False: TOML and YAML write nan and inf, which a bound alone
    # refused as "should be <= 60000 (got nan)", as though a smaller nan would do.
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*")
    @classmethod
    def _no_negative_zero(cls, v):
        # -0.0 passes ge=0, as -0 does (an int: 0), and was shown as -0.0 wherever the value is
        # (GET /admin/batching's max_queue_delay_ms): taken as the 0 it equals.
        return v + 0.0 if isinstance(v, float) and v == 0 else v


class TensorConfig(_Strict):
    """One input or output of a model."""

    name: str = Field(min_length=1, description="Tensor name as clients send it.")
    datatype: str = Field(description="V2 datatype name: FP32, INT64, BF16, ...")
    dims: tuple[StrictInt, ...] = Field(
        description="Shape of one sample, without the batch dimension; -1 marks a variable size."
    )
    warmup_dims: tuple[StrictInt, ...] | None = Field(
        None,
        description="Inputs only: the sample shape the start-up warm-up runs the model on, `dims` with each -1 "
        "replaced by a size >= 1; None: each -1 as 1, or as the least size the model takes there where that is "
        "known (a torch.export program's range). For a model that refuses size 1 (a convolution's kernel).",
    )

    @field_validator("name")
    @classmethod
    def _carried_name(cls, v: str) -> str:
        # Any other character travels: the V2 protocol carries names as UTF-8 strings (JSON's or
        # protobuf's), and Triton checks only that a name is not empty.
        control = [c for c in v if unicodedata.category(c) in ("Cc", "Zl", "Zp")]
        if control:
            raise ValueError(
                f"tensor name {quoted_name(v)} holds a control character (U+{ord(control[0]):04X}): it would break the "
                "one-line errors and log lines that name the tensor, and a NUL cannot be sent by clients that "
                "pass names as C strings (Triton's C API); expected printable characters"
            )
        if v != v.strip():
            raise ValueError(
                f"tensor name {quoted_name(v)} begins or ends with a space: clients would have to send it, spaces "
                f"and all, and every message shows it as {quoted_name(v.strip())} would look; expected no space at "
                "either end"
            )
        return v

    @field_validator("datatype")
    @classmethod
    def _known_datatype(cls, v: str) -> str:
        if v not in DATATYPES:
            raise ValueError(f"expected a V2 datatype, one of {', '.join(DATATYPES)}; got {quoted_name(v)}")
        return v

    @field_validator("dims")
    @classmethod
    def _valid_dims(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        bad = [d for d in v if d != -1 and d < 1]
        if bad:
            raise ValueError(f"expected each dim -1 (variable) or >= 1; got {_shown(list(v))}")
        return v

    @model_validator(mode="after")
    def _warmup_fits_dims(self) -> TensorConfig:
        w = self.warmup_dims
        if w is not None and (
            len(w) != len(self.dims) or any(d != s if d != -1 else s < 1 for d, s in zip(self.dims, w))
        ):
            raise ValueError(
                f"warmup_dims {list(w)} do not fit dims {list(self.dims)}: expected the same dims with each -1 "
                "replaced by a size >= 1"
            )
        return self

    def warmup_shape(self, least: Mapping[int, int] | None = None) -> tuple[int, ...]:
        """One sample's shape in the start-up warm-up: `warmup_dims`, else `dims` with each -1 as the size `least`
        gives it (by its index in a request's shape, batch first: the least its model takes there, where that is
        known), else 1."""
        if self.warmup_dims:
            return self.warmup_dims
        least = least or {}
        return tuple(d if d > 0 else least.get(i, 1) for i, d in enumerate(self.dims, 1))

    @property
    def variable(self) -> bool:
        return -1 in self.dims


class DynamicBatchingConfig(_Strict):
    """When the batcher flushes, and how much it holds."""

    max_queue_delay_ms: StrictFloat = Field(
        5.0,
        ge=0,
        le=MAX_QUEUE_DELAY_MS,
        allow_inf_nan=False,
        description="Longest time (ms) the oldest queued request waits for a batch to fill.",
    )
    preferred_batch_sizes: tuple[StrictInt, ...] = Field(
        (), description="Batch sizes (samples) to flush at as soon as they are reached."
    )
    # At most 2**32 - 1: the ModelConfig RPC reports it in a uint32 field, which refuses a larger one.
    max_queue_size: StrictInt = Field(
        0,
        ge=0,
        le=2**32 - 1,
        description="Most requests queued per model; 0 is unbounded. Beyond it: RESOURCE_EXHAUSTED.",
    )
    # Bounded as slo_ms, the other deadline from arrival: inf would pass the check and then fail
    # every ModelConfig call, which reports it as whole microseconds.
    default_timeout_ms: StrictFloat = Field(
        0.0,
        ge=0,
        le=600_000,
        allow_inf_nan=False,
        description="Deadline (ms from arrival) for requests that bring none; 0 is none.",
    )
    policy: Literal["fixed", "slo"] = Field(
        "fixed",
        description="'fixed': flush on size or after max_queue_delay_ms. 'slo': flush from deadlines and a learned "
        "batch time, refuse requests that cannot meet theirs (docs/batching-policy.md); needs slo_ms.",
    )
    slo_ms: StrictFloat | None = Field(
        None,
        gt=0,
        le=600_000,
        allow_inf_nan=False,
        description="Policy 'slo': latency objective (ms from arrival); a request's deadline is the earliest of "
        "its gRPC deadline, its timeout parameter and arrival + slo_ms.",
    )
    slo_quantile: StrictFloat = Field(
        0.95,
        ge=0.5,
        lt=1.0,
        allow_inf_nan=False,
        description="Policy 'slo': the quantile of batch time it plans with (0.95: p95).",
    )
    slo_profile: Path | None = Field(
        None,
        description="Policy 'slo': a `wok profile --json` document (relative to the model's folder) whose "
        "fit.alpha_s and fit.beta_s (seconds) seed the batch-time model before batches are measured.",
    )
    default_priority_level: StrictInt = Field(
        1,
        ge=1,
        le=MAX_PRIORITY_LEVEL,
        description="Priority level of requests whose 'priority' parameter is absent or 0; lower is more "
        "urgent (1 is the most), FIFO within a level.",
    )

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _distinct_sizes(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        # Order carries no meaning (the batcher flushes at the largest size reached), so it is sorted, as
        # Triton keeps them (a set); a size given twice is refused, not merged: a slip for another size.
        twice = sorted({s for s in v if v.count(s) > 1})
        if twice:
            raise ValueError(
                f"{', '.join(map(str, twice))} {'is' if len(twice) == 1 else 'are'} given more than once in "
                f"{list(v)}; expected each size once"
            )
        return tuple(sorted(v))

    @model_validator(mode="after")
    def _policy_fields(self) -> DynamicBatchingConfig:
        if self.policy == "slo" and self.slo_ms is None:
            raise ValueError("policy 'slo' needs slo_ms, the latency objective in milliseconds")
        if self.policy != "slo":
            extra = [f for f in ("slo_ms", "slo_profile") if getattr(self, f) is not None]
            if extra:
                policy = quoted_name(self.policy)
                raise ValueError(f"{', '.join(extra)} only apply to policy 'slo' (policy is {policy})")
        return self

    @field_validator("slo_profile")
    @classmethod
    def _readable_profile(cls, path: Path | None) -> Path | None:
        # A field validator, so that its error names dynamic_batching.slo_profile.
        if path is not None:
            from .policy import read_profile_fit

            read_profile_fit(path)
        return path


class InstanceConfig(_Strict):
    """How many copies of the model run, and where."""

    count: StrictInt = Field(1, ge=1, le=64, description="Model instances; each runs one batch at a time.")
    devices: tuple[str, ...] = Field(
        ("auto",),
        description="Devices the instances are spread over, round robin: 'cpu', 'cuda', 'cuda:N' (N from 0 to 127, "
        "no leading zero), or 'auto' (cuda:0 when a CUDA device is present, else cpu).",
    )
    pipeline_depth: StrictInt | None = Field(
        None,
        ge=1,
        le=8,
        description="Batches in flight per instance; None: 2. On CUDA the copies of one overlap the compute of "
        "another; on the CPU the next full batch waits at the worker. A busy instance only takes full batches.",
    )

    @field_validator("devices")
    @classmethod
    def _valid_devices(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("at least one device is needed")
        for d in v:
            check_device(d)
        return v


# torch.device() keeps an index in 8 signed bits: "cuda:128" is cuda:-128 and "cuda:255" plain "cuda",
# and executor.resolve_devices' count check passes both. It refuses "cuda:" and "cuda:01".
MAX_DEVICE_INDEX = 127
DEVICE_FORMS = f"auto, cpu, cuda or cuda:N (N from 0 to {MAX_DEVICE_INDEX}, no leading zero)"


def check_device(text: str) -> str:
    """`text` if it names a device as the server's config, `wok demo --device` and `wok profile --device`
    take one (DEVICE_FORMS, each of which torch.device() reads as written); else ValueError naming it
    and the forms taken."""
    head, colon, index = text.partition(":")
    if not colon and head in ("auto", "cpu", "cuda"):
        return text
    if head == "cuda" and ascii_digits(index) and len(index) <= 3:  # length first: int() refuses 4,301 digits
        n = int(index)
        if n <= MAX_DEVICE_INDEX and str(n) == index:  # no leading zero, as torch
            return text
    raise ValueError(f"expected {DEVICE_FORMS}; got {quoted_name(text)}")


# A model's name goes unescaped into V2 HTTP paths (/v2/models/NAME).
_MODEL_NAME = r"[A-Za-z0-9_.\-]+"
Platform = Literal["torchscript", "torch_export", "python"]
_MODULE_CALLABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


class ModelConfig(_Strict):
    """One served model."""

    name: str = Field(min_length=1)
    platform: Platform = Field(
        description="torchscript (a torch.jit file), torch_export (a torch.export .pt2 program) "
        "or python (a factory 'module:callable' returning an nn.Module)."
    )
    model_file: str | None = Field(
        None, min_length=1, description="File, relative to the model's folder, for torchscript and torch_export."
    )
    factory: str | None = Field(None, description="'module:callable' for the python platform.")
    check: str | None = Field(
        None,
        description="Optional 'module:callable', any platform: a plain function called with each request's "
        "inputs (a read-only mapping of input name to a read-only NumPy array, rows first) as the request is "
        "decoded, on the event loop, before it is queued; a ValueError it raises refuses that request alone with "
        "INVALID_ARGUMENT and its message. Found as the factory is: the model folder's file, else an "
        "installed module.",
    )
    weights: str | None = Field(
        None,
        min_length=1,
        description="Optional state dict, relative to the model's folder: .safetensors, or a "
        "torch file loaded with weights_only=True. Never unpickled as arbitrary objects.",
    )
    parameters: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Keyword arguments passed to the python factory."
    )
    inputs: tuple[TensorConfig, ...] = Field(min_length=1)
    outputs: tuple[TensorConfig, ...] = Field(min_length=1)
    max_batch_size: StrictInt = Field(
        ge=1, le=65_536, description="Most samples (rows of the batch dimension) in one batch."
    )
    dynamic_batching: DynamicBatchingConfig = DynamicBatchingConfig()
    instances: InstanceConfig = InstanceConfig()
    precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="Floating-point type the model computes in; inputs are cast on the device."
    )
    # The file the config was read from, for errors found after loading (the warm-up); None
    # when it was built in code.
    _source: str | None = PrivateAttr(None)

    @field_validator("name")
    @classmethod
    def _model_name(cls, v: str) -> str:
        if not re.fullmatch(_MODEL_NAME, v):
            raise ValueError(f"expected a model name of letters, digits, '_', '.' and '-' only; got {quoted_name(v)}")
        if v in (".", ".."):
            # Clients resolve dot segments in a URL path (RFC 3986): /v2/models/../ready is sent as
            # /v2/ready, and /v2/models/./ready asks for a model named 'ready'.
            raise ValueError(
                "expected a model name with a letter, digit, '_' or '-' (clients drop a name of dots alone from a "
                f"URL path: the V2 HTTP path /v2/models/{v}/ready is sent without it); got {quoted_name(v)}"
            )
        return v

    @field_validator("factory", "check")
    @classmethod
    def _module_callable(cls, v: str | None, info: ValidationInfo) -> str | None:
        # Security: a dotted module name only. The module is found in the model's own folder
        # (model.py) or among installed packages; a relative name or a path could reach a
        # file outside the repository (docs/security.md). A factory without ':' is named by
        # _consistent, for the platform that needs one.
        if v is not None and (":" in v or info.field_name == "check") and not _MODULE_CALLABLE.fullmatch(v):
            attr = "build" if info.field_name == "factory" else "check"
            raise ValueError(
                f"expected 'module:callable' with a dotted module name, such as 'model:{attr}' or 'pkg.models:{attr}' "
                f"(relative names and paths are not accepted); got {quoted_name(v)}"
            )
        return v

    @field_validator("parameters")
    @classmethod
    def _not_the_servers(cls, v: dict) -> dict:
        ours = [k for k in v if k.startswith("wok.")]
        if ours:
            # The ModelConfig answer lists these parameters beside the server's own (IDS_BOUND_PREFIX), which
            # one of them would have overwritten unseen.
            raise ValueError(
                f"keys starting with 'wok.' are kept for what the server publishes in its ModelConfig answer "
                f"({IDS_BOUND_PREFIX}<input>); expected other keys; got {_shown(ours)}"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.platform == "python":
            if not self.factory or ":" not in self.factory:
                raise ValueError("platform 'python' needs factory = 'module:callable'")
            if self.model_file is not None:
                # Refused, not ignored: the file would go unread, and the model served be the factory's.
                raise ValueError(
                    "model_file only applies to platforms 'torchscript' and 'torch_export'; platform 'python' "
                    "builds its module with factory"
                )
        else:
            if not self.model_file:
                raise ValueError(f"platform {quoted_name(self.platform)} needs model_file")
            unused = [f for f in ("factory", "parameters") if getattr(self, f)]
            if unused:
                verb = "applies" if len(unused) == 1 else "apply"
                raise ValueError(
                    f"{' and '.join(unused)} only {verb} to platform 'python' (platform is "
                    f"{quoted_name(self.platform)}, which loads model_file)"
                )
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            names = [t.name for t in tensors]
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"{kind} names repeat: {_shown(sorted(dup))}")
        given = [t.name for t in self.outputs if t.warmup_dims is not None]
        if given:
            raise ValueError(f"warmup_dims only apply to inputs; given for output(s) {_shown(given)}")
        for size in self.dynamic_batching.preferred_batch_sizes:
            if not 1 <= size <= self.max_batch_size:
                raise ValueError(
                    "dynamic_batching.preferred_batch_sizes: expected sizes from 1 to max_batch_size "
                    f"({self.max_batch_size}); got {size}"
                )
        return self

    def input(self, name: str) -> TensorConfig | None:
        return next((t for t in self.inputs if t.name == name), None)

    @property
    def source(self) -> str | None:
        """The config file this config was read from; None when it was built in code."""
        return self._source


# gRPC takes its channel options as 32-bit ints: durations in ms, and the transport's message
# limit, which the server sets to 4 × max_request_bytes + 1 MiB (room for the encoded request).
_MAX_GRPC_MS = 2**31 - 1
_MAX_REQUEST_BYTES = (2**31 - 1 - (1 << 20)) // 4


class ServerSettings(_Strict):
    """The server process."""

    host: str = Field("127.0.0.1", description="Address the gRPC port binds to.")
    grpc_port: StrictInt = Field(8001, ge=0, le=65_535, description="gRPC port; 0 picks a free one.")
    model_repository: Path | None = Field(
        None, description="Folder with one sub-folder per model; None serves the built-in demo models."
    )
    demo_models: tuple[str, ...] = Field(
        ("mlp", "recsys", "encoder"), description="Built-in models served when there is no repository."
    )
    grace_period_s: StrictFloat = Field(
        30.0,
        ge=0,
        le=_MAX_GRPC_MS / 1e3,
        allow_inf_nan=False,
        description="Seconds queued and running requests get to finish on SIGTERM/SIGINT/SIGHUP.",
    )
    max_connection_age_s: StrictFloat | None = Field(
        None,
        gt=0,
        le=_MAX_GRPC_MS / 1e3,
        allow_inf_nan=False,
        description="Seconds after which each client connection is closed (GOAWAY, gRPC adds ±10% jitter), so "
        "round-robin clients reconnect and reach replicas added since; None: never.",
    )
    max_connection_age_grace_s: StrictFloat | None = Field(
        None,
        ge=0,
        le=_MAX_GRPC_MS / 1e3,
        allow_inf_nan=False,
        description="Seconds the calls in flight on such a connection get to finish; None: grace_period_s.",
    )
    health_host: str | None = Field(
        None, description="Address the plaintext health port binds to; None: the same as host."
    )
    health_port: StrictInt | None = Field(
        None,
        ge=0,
        le=65_535,
        description="A second gRPC port, always plaintext, serving only grpc.health.v1 (for probes that cannot "
        "speak TLS, such as the kubelet's); 0 picks a free one, None serves none.",
    )
    max_request_bytes: StrictInt = Field(
        64 << 20,
        ge=1024,
        le=_MAX_REQUEST_BYTES,
        description="Largest ModelInfer request (bytes) accepted; larger: INVALID_ARGUMENT.",
    )
    stream_window: StrictInt = Field(
        1024,
        ge=1,
        description="Requests one ModelStreamInfer stream may owe (read and not yet answered on it) before the "
        "server reads no further request from it, so that a client that writes faster than it reads holds at "
        "most this many answers in the server; the rest wait in its transport (HTTP/2 flow control). A client "
        "that writes every request before it reads any answer blocks once this many, plus what the transports "
        "buffer, ahead.",
    )
    torch_threads: StrictInt | None = Field(
        None,
        ge=1,
        description="torch intra-op threads; None keeps torch's default. Process-wide: applied by `wok serve` "
        "(the entry point), not by WokServer.",
    )
    cpu_linear: Literal["onednn", "torch"] = Field(
        "onednn",
        description="How model instances on the CPU run plain fp32 nn.Linear layers: 'onednn' runs a batch of 4 "
        "rows or more through oneDNN's matmul kernel (a ReLU after it runs in place), rows padded to a few sizes, "
        "without copying the weights (server/cpulinear.py; for the demo mlp 0.5-0.9 × the time of torch's fp32 "
        "addmm back to back), and smaller ones as torch does; 'torch' runs every layer as torch does. Results agree "
        "to float32 rounding.",
    )
    switch_interval_ms: StrictFloat | None = Field(
        None,
        gt=0,
        le=100,
        allow_inf_nan=False,
        description="The interpreter's GIL switch interval (ms): how long a model worker waiting for the GIL "
        "waits before the event loop must hand it over; None keeps Python's (5 ms). Process-wide: applied by "
        "`wok serve` (the entry point), not by WokServer.",
    )
    accept_tasks: StrictInt = Field(
        4,
        ge=0,
        le=64,
        description="Tasks accepting unary ModelInfer calls beside grpc.aio's own one, whose accept costs about "
        "five event-loop passes per call in series (server/accept.py); 0: grpc.aio's alone.",
    )
    drain_wakeups: StrictBool = Field(
        False,
        description="Read all of grpc.aio's waiting wake-up bytes per event-loop pass, not one, so that gRPC hands "
        "over every finished operation at once (server/wakeup.py). Off by default: it lifts the rate when the "
        "loop's passes are long, and changed nothing measurable on mlp's ramps.",
    )
    cpu_wakeup_latency_us: StrictInt | None = Field(
        None,
        ge=0,
        le=2_000_000_000,
        description="While serving, hold the CPUs' wake-up latency at most this many µs (a Linux PM QoS request on "
        "/dev/cpu_dma_latency, root's by default): idle cores then sleep no deeper than that, and 0 keeps them "
        "polling, so each thread a request wakes starts at once instead of after an interrupt through the "
        "hypervisor. Costs power, and in a VM the host's CPU; None (default) requests nothing "
        "(server/cpulatency.py).",
    )
    server_timing: StrictBool = Field(
        False,
        description="Every unary ModelInfer answer carries a `server-timing` trailer (W3C Server-Timing syntax, "
        "durations in ms): decode, queue, batch, respond, encode and total for that request, and start and "
        "compute inside batch, so a client can split its latency into the server's stages and the time outside "
        "the server (`wok bench ramp --server-timing`). Off by default: per answer a string format (about 1 µs) "
        "and a trailer of about 170 bytes, for load tests and diagnosis.",
    )
    metrics: StrictBool = Field(True, description="Record metrics; off only to measure what they cost.")
    metrics_host: str = Field("127.0.0.1", description="Address the /metrics HTTP port binds to.")
    metrics_port: StrictInt | None = Field(
        8002, ge=0, le=65_535, description="HTTP port of /metrics; 0 picks a free one, None serves none."
    )
    admin: StrictBool = Field(
        False, description="Serve the admin API (fault injection, batching policy, /events) on the metrics port."
    )
    # Security (see docs/security.md and server/auth.py). Files are read and checked here,
    # so a bad one fails at start-up, naming the file; their contents never show in errors.
    tls_cert: Path | None = Field(
        None, description="PEM certificate chain of the gRPC port; with tls_key, the port speaks only TLS."
    )
    tls_key: Path | None = Field(None, description="PEM private key (unencrypted) of tls_cert.")
    tls_client_ca: Path | None = Field(
        None,
        description="PEM CA certificate(s); when set, every client must present a certificate they signed (mTLS).",
    )
    auth_token_file: Path | None = Field(
        None,
        description="File of accepted bearer tokens (one per line, '#' comments); when set, calls without "
        "'authorization: Bearer <token>' get UNAUTHENTICATED.",
    )
    auth_token_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of an environment variable holding accepted bearer tokens (comma or space separated).",
    )

    @property
    def health_bind_host(self) -> str:
        """The address the plaintext health port binds: `health_host`, else `host`."""
        return self.health_host or self.host

    @field_validator("host", "health_host", "metrics_host")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        return v if v is None else bind_address(v)

    @field_validator("tls_cert", "tls_key", "tls_client_ca")
    @classmethod
    def _readable(cls, v: Path | None) -> Path | None:
        if v is not None:
            read_secret_file(v)
        return v

    @field_validator("auth_token_file", "auth_token_env")
    @classmethod
    def _tokens(cls, v: Path | str | None, info: ValidationInfo) -> Path | str | None:
        if v is not None:
            load_tokens(**{info.field_name: v})
        return v

    @model_validator(mode="after")
    def _security(self) -> ServerSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            raise ValueError(f"{given} is given without {missing}: TLS needs both the certificate and its key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key: client certificates are checked only over TLS")
        if self.tls_cert is not None:
            check_tls_files(self.tls_cert, self.tls_key, self.tls_client_ca)
        if self.max_connection_age_grace_s is not None and self.max_connection_age_s is None:
            raise ValueError("max_connection_age_grace_s needs max_connection_age_s: there is no age to be graceful at")
        health_host = self.health_bind_host
        if (
            self.health_port is not None
            and self.health_port != 0
            and self.health_port == self.grpc_port
            and not _distinct_addresses(health_host, self.host)
        ):
            raise ValueError(
                f"health_port {self.health_port} is the gRPC port, on {health_host} and {self.host}: the health "
                "port needs a port of its own (or two different IP addresses, neither of them a wildcard)"
            )
        return self


def _distinct_addresses(a: str, b: str) -> bool:
    """Whether binding one port on `a` and on `b` cannot collide: two different IP literals,
    neither a wildcard (0.0.0.0 and :: take the port on every address). A name (localhost)
    may resolve to the other, so it is taken as the same."""
    try:
        x, y = ipaddress.ip_address(a), ipaddress.ip_address(b)
    except ValueError:
        return False
    return x != y and not x.is_unspecified and not y.is_unspecified


def bind_address(value: str) -> str:
    """An address or host name to listen on, as bind calls take it: an IPv6 address in brackets bare
    ("[::1]" is how one is written beside a port), spaces around it dropped. ValueError for one no
    bind can take: empty, with a space or a control character, or a name past DNS's 253 characters
    (`wok serve` took them, and the bind failed only after the models had loaded: exit 1, "cannot start")."""
    bare = value.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    if not bare or not bare.isprintable() or " " in bare or len(bare) > 253:
        raise ValueError(f"expected an address or a host name; got {quoted_name(value)}")
    return bare


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets, as gRPC targets and URLs write it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _shown(value: object) -> str:
    """A refused model config value as a message shows it, in the file's words (errors.shown_data): a YAML
    boolean true, not Python's True; a path as the text it names, quoted as a name is (its repr was
    PosixPath('...'), whole)."""
    if isinstance(value, PurePath):
        return quoted_name(str(value))
    return shown_data(value)


def _shown_python(value: object) -> str:
    """A refused server setting, given by Python code or an option parsed already, as a message shows it: as
    Python writes it (errors.shown_value), but a path as the text it names, quoted as a name is (its repr was
    PosixPath('...'), whole), and a list or a table cut past NAME_CHARS (a list of 20,000 numbers made a
    refusal of 129 KB)."""
    if isinstance(value, PurePath):
        return quoted_name(str(value))
    if isinstance(value, (list, tuple, dict, set)):
        return cut_message(repr(value), NAME_CHARS)
    return shown_value(value)


def _a(value: object) -> str:
    """What a config value is, in words: "a list", "a table", "nothing (null)"."""
    if value is None:
        return "nothing (null)"
    kind = {dict: "table", list: "list", tuple: "list"}.get(type(value), type(value).__name__)
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _model_of(annotation: object) -> type[BaseModel] | None:
    """The settings class a field holds: itself, or the items of a tuple of them."""
    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def _tables(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The settings classes by where they are written: "" for the top level, then each field holding
    one ("dynamic_batching", "outputs")."""
    found = {"": root}
    for name, field in root.model_fields.items():
        sub = _model_of(field.annotation)
        if sub is not None:
            found[name] = sub
    return found


def _unknown_hint(root: type[BaseModel], loc: tuple) -> str:
    """Why the setting at `loc` may be unknown: a misspelling of one known there, or one of another
    table (in TOML a key written after a `[table]` or `[[array]]` header belongs to that table, so a
    top-level key added at the end of the file lands in the last one)."""
    key = str(loc[-1])
    table = ".".join(str(p) for p in loc[:-1] if not isinstance(p, int))
    tables = _tables(root)
    here = tables.get(table)
    if here is not None:
        close = difflib.get_close_matches(key, list(here.model_fields), n=1, cutoff=0.75)
        if close:
            return f"; did you mean {close[0]}?"
    home = [name for name, cls in tables.items() if name != table and key in cls.model_fields]
    if not home:
        return ""
    header = f"[[{table}]]" if any(isinstance(p, int) for p in loc) else f"[{table}]"
    if home[0] == "":
        where, fix = "a top-level setting", "above the first header; in YAML, not indented"
    else:
        where, fix = f"a setting of {home[0]}", f"under [{home[0]}]; in YAML, indented under {home[0]}"
    return f"; {key} is {where}: in TOML, every key after a {header} header belongs to it (write {key} {fix})"


def _describe(
    err: ValidationError,
    root: type[BaseModel] | None = None,
    names: Mapping[str, str] | None = None,
    shown: Callable[[object], str] = _shown,
) -> str:
    """One line for all of `err`'s errors; `root`: the settings class validated, whose fields name
    what an unknown setting may have meant; `names`: what the caller's user calls a top-level field
    (`wok serve`'s options), in its place; `shown`: how a value got is written, in a file's words
    (a model config's) or in Python's (the server settings')."""
    errors = err.errors()
    lines = []
    named_params = set()
    for e in errors:
        loc = e["loc"]
        if len(loc) == 3 and loc[0] == "parameters" and loc[2] in ("str", "int", "float", "bool"):
            # One error per member of the union a parameter may be (.str, .int, .float, .bool): one line.
            if loc[1] not in named_params:
                named_params.add(loc[1])
                lines.append(f"parameters.{loc[1]}: expected a string, number or boolean; got {_a(e.get('input'))}")
            continue
        # A list whose item failed is also "too short" (pydantic counts only the items that
        # validated): a false second error when the item's own error is the one to fix.
        if e["type"] == "too_short" and any(len(o["loc"]) > len(loc) and o["loc"][: len(loc)] == loc for o in errors):
            continue
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if names and loc and loc[0] in names:
            where = ".".join([names[loc[0]], *map(str, loc[1:])])
        if e["type"] == "value_error":
            # wok's own validators: their message names what they were given; pydantic's prefix
            # and the input's repr (a PosixPath(...)) would only repeat it.
            msg = e["msg"].removeprefix("Value error, ")
            if names and not loc:
                # A check of several fields names them in its words ("tls_key is given without
                # tls_cert"): the caller's names instead. Only names with a '_', which no host has.
                fields = "|".join(re.escape(f) for f in names if "_" in f)
                lines.append(re.sub(rf"\b({fields})\b", lambda m: names[m[1]], msg) if fields else msg)
                continue
            lines.append(f"{where}: {msg}")
            continue
        got = e.get("input")
        # A table given for another kind of value is named ("a table"), not shown: it may be long.
        got_s = _a(got) if isinstance(got, dict) else shown(got)
        if e["type"] == "extra_forbidden":
            # pydantic's "Extra inputs are not permitted" reads as a word about a model's inputs. The key
            # is what is refused, so its value is said beside it rather than as what was got.
            unknown = "an unknown table" if isinstance(got, dict) else f"an unknown one, set to {got_s}"
            hint = _unknown_hint(root, loc) if root else ""
            lines.append(f"{where}: expected a known setting; got {unknown}{hint}")
            continue
        if e["type"] == "missing":
            # pydantic's input is the table the setting is missing from.
            got_s = "none"
        expected = _expected(e)
        if loc == ("max_batch_size",) and e["type"] == "greater_than_equal":
            expected += (
                " (wok always batches along the first dim; Triton's 0, no batching, is not supported: give "
                "max_batch_size >= 1 and leave the batch dim out of dims)"
            )
        lines.append(f"{where}: expected {expected}; got {got_s}")
    return "; ".join(lines)


# What pydantic's error types that the settings raise expect, in the refusal's "expected ..." (its
# messages say "Input should be ...", a form no other refusal has); {name}: the error's ctx entry. A type
# not here is said in pydantic's words (_expected).
_EXPECTED = {
    "missing": "a value (the setting is required)",
    "int_type": "an integer",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_type": "a boolean",
    "string_type": "a string",
    "path_type": "a path",
    "tuple_type": "a list",
    "dict_type": "a table",
    "model_type": "a table of settings (or an instance of {class_name})",
    "literal_error": "{expected}",
    "greater_than": "> {gt}",
    "greater_than_equal": ">= {ge}",
    "less_than": "< {lt}",
    "less_than_equal": "<= {le}",
    "too_short": "at least {min_length} item{s}",
    "string_too_short": "at least {min_length} character{s}",
    "string_pattern_mismatch": "a string matching {pattern}",
}


def _expected(e: Mapping) -> str:
    """What pydantic's error `e` says the setting should be, as the "expected ..." of a refusal."""
    template = _EXPECTED.get(e["type"])
    if template is None:
        msg = e["msg"]
        return msg.removeprefix("Input should be ") if msg.startswith("Input should be ") else f"a valid value ({msg})"
    ctx = e.get("ctx") or {}
    shown = {k: quoted_name(v) if k == "pattern" else _bound(v) for k, v in ctx.items()}
    return template.format(**shown, s="" if ctx.get("min_length") == 1 else "s")


def _bound(value: object) -> str:
    """A limit from pydantic's ctx as its messages write it: a float bound that is whole without its
    ".0" (ge=0 on a float field is 0.0), anything else as str() writes it."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class _RepeatedKey(yaml.YAMLError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping: PyYAML keeps the last one
    without a word (a second `dynamic_batching:` drops every setting of the first), where TOML refuses it."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            lines: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` entries may be overridden
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = lines.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: the base loader names it
                    continue
                if first != key_node.start_mark.line + 1:
                    again = key_node.start_mark.line + 1
                    raise _RepeatedKey(f"{_shown(key)} is given twice, on lines {first} and {again}")
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: Path) -> dict:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.object[exc.start]:#04x})") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.load(text, Loader=_UniqueKeyLoader)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from None
    if data is None:
        raise ConfigError(f"{path}: expected a table of settings; got an empty document")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of settings; got {type(data).__name__}")
    return data


def model_config_from_dict(data: dict, source: str) -> ModelConfig:
    try:
        cfg = ModelConfig(**data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc, ModelConfig)}") from None
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    cfg._source = source
    return cfg


CONFIG_NAMES = ("config.toml", "config.yaml", "config.yml")


def inside_model_dir(model_dir: Path, relative: str, source: str, field: str) -> Path:
    """`relative` under the model's folder; ConfigError (naming `source` and `field`) if it leaves
    it: an absolute path, `..`, or a link out."""
    path = model_dir / relative
    if not path.resolve().is_relative_to(model_dir.resolve()):
        raise ConfigError(
            f"{source}: {field} {quoted_name(relative)} leaves the model's folder {model_dir}; expected a path "
            "inside it"
        )
    return path


def load_model_config(model_dir: Path) -> ModelConfig:
    """Read and check the config of the model in `model_dir`; its name defaults to the folder's."""
    found = [model_dir / n for n in CONFIG_NAMES if (model_dir / n).is_file()]
    if not found:
        raise ConfigError(f"{model_dir}: no config file; expected one of {', '.join(CONFIG_NAMES)}")
    if len(found) > 1:
        raise ConfigError(f"{model_dir}: more than one config file: {', '.join(p.name for p in found)}")
    data = read_config_file(found[0])
    if "name" not in data and not re.fullmatch(_MODEL_NAME, model_dir.name):
        # Else named as a setting the file does not have: "name: expected a model name of ...; got 'my model'".
        raise ConfigError(
            f"{found[0]}: name: expected a model name of letters, digits, '_', '.' and '-' only (the config sets none, "
            f"so its folder's: rename the folder, or set name in the config); got {quoted_name(model_dir.name)}"
        )
    data.setdefault("name", model_dir.name)
    batching = data.get("dynamic_batching")
    if isinstance(batching, dict) and isinstance(batching.get("slo_profile"), str):
        profile = inside_model_dir(model_dir, batching["slo_profile"], str(found[0]), "dynamic_batching.slo_profile")
        batching["slo_profile"] = str(profile)
    return model_config_from_dict(data, str(found[0]))


def server_settings(options: Mapping[str, str] | None = None, **values) -> ServerSettings:
    """ServerSettings with ConfigError (naming each bad field) instead of pydantic's error. `options`
    maps fields to the command-line options that gave them: the message names those instead
    (`wok serve --port -1` was refused as "server settings: grpc_port: ...")."""
    try:
        return ServerSettings(**values)
    except ValidationError as exc:
        if options:
            raise ConfigError(_describe(exc, ServerSettings, options, _shown_python)) from None
        raise ConfigError(f"server settings: {_describe(exc, ServerSettings, shown=_shown_python)}") from None
