"""What the executor runs: a model's module plus how its requests share a batch.

A `Servable` is built once per model. The executor asks it for one module per instance
(`module_for_instance`: one per device, and a copy sharing its parameters for each later instance
there), then, per batch: `assemble` the requests' inputs into host buffers,
`forward` them on the device, and `split` the outputs back into per-request rows.
Requests share a batch only when their `batch_key`s are equal; the default key is the
shape of every variable-sized input, so generic models never see mixed shapes.
Demo models override the hooks to pad or to bucket by length.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import itertools
import logging
import math
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType

import numpy as np
import torch
from torch import nn

from .codec import DecodePlan
from .config import ModelConfig, TensorConfig
from .datatypes import Datatype, datatype
from .errors import (
    NAME_CHARS,
    CheckFailed,
    ConfigError,
    InvalidInput,
    ModelExecutionError,
    WokError,
    error_line,
    escaped,
    message_of,
    quoted_name,
)
from .ratelog import TracebackLog
from .tensors import to_numpy_view, torch_dtype

log = logging.getLogger("wok")
# numpy's messages for a write to a read-only array (in place, or as an `out=`).
_NUMPY_READ_ONLY = ("assignment destination is read-only", "output array is read-only")

PRECISION = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def casts_without_loss(have: torch.dtype, want: torch.dtype) -> bool:
    """Whether a model's output of dtype `have` may be cast to its config's `want`.

    Float to float is a precision choice (an fp16/bf16 model behind an FP32 config, or the
    reverse) and is allowed. Anything else only where every value of `have` survives: a cast
    would otherwise wrap integers (INT64 300 into INT8 is 44), round them (INT64 above 2**24
    into FP32) or drop fractions (a float into INT64 or BOOL) with nothing to tell the client.
    """
    if have == want or (have.is_floating_point and want.is_floating_point):
        return True
    if have.is_floating_point or have.is_complex or want == torch.bool:
        return False
    lo, hi = (0, 1) if have == torch.bool else (torch.iinfo(have).min, torch.iinfo(have).max)
    if want.is_floating_point:
        # A float holds every integer up to 2**p exactly, p its significand bits (2 / eps).
        return max(-lo, hi) <= 2 / torch.finfo(want).eps
    info = torch.iinfo(want)
    return info.min <= lo and hi <= info.max


def forward_parameter_names(module: nn.Module) -> list[tuple[str, bool]] | None:
    """(name, has a default) of each parameter `module`'s forward takes by position (no self, *args or
    **kwargs), in their order; None where they cannot be read, or a keyword-only one has no default
    (a call by position cannot give it)."""
    if isinstance(module, torch.jit.ScriptModule):
        try:
            # A method's schema starts with the module itself, under whatever name forward gave it.
            args = module.forward.schema.arguments[1:]
        except (AttributeError, RuntimeError):
            return None
        if any(a.kwarg_only and not a.has_default_value() for a in args):
            return None
        return [(a.name, a.has_default_value()) for a in args if not a.kwarg_only]
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.KEYWORD_ONLY and p.default is p.empty for p in params):
        return None
    return [
        (p.name, p.default is not p.empty) for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


def forward_order(module: nn.Module, input_names: list[str]) -> list[str]:
    """The config's input names in the order `module`'s forward takes them, where its first parameters
    are named exactly as the inputs and any after them have defaults (`forward(self, minuend,
    subtrahend, mask=None)` for inputs listed `subtrahend` first); else `input_names` as they are
    (`forward(self, x)` for an input "INPUT0")."""
    params = forward_parameter_names(module)
    k = len(input_names)
    if params is not None and len(params) >= k and all(has_default for _, has_default in params[k:]):
        names = [name for name, _ in params[:k]]
        if set(names) == set(input_names):
            return names
    return list(input_names)


def astray_inputs(module: nn.Module, order: list[str]) -> list[tuple[str, str]]:
    """(input, parameter) for each input of `order` (forward_order's) that reaches a parameter of `module`'s
    forward of another name, where forward has one of its own name: a config naming some inputs as forward's
    parameters but not all (a typo in one) sends them by position, the named ones into others' places."""
    params = forward_parameter_names(module)
    names = [name for name, _ in params or []]
    return [(i, p) for i, p in zip(order, names) if i != p and i in names]


class HostBuffers:
    """Reusable host tensors for one in-flight batch slot, page-locked when `pinned`.

    Buffers grow to the largest request seen and are then reused, so a steady load
    allocates nothing per batch.
    """

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self._flat: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        # math.prod, not np.prod: on the worker thread, once per batch, where numpy's reduction
        # machinery showed in a profile at 1,000 QPS (cold code between batches 5 ms apart).
        numel = math.prod(shape)
        buf = self._flat.get(name)
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            buf = torch.empty(max(numel, 1), dtype=dtype, pin_memory=self.pinned)
            self._flat[name] = buf
        return buf[:numel].view(tuple(shape))

    def storage_ptrs(self) -> set[int]:
        return {b.untyped_storage().data_ptr() for b in self._flat.values()}


class CheckFailureLog(TracebackLog):
    """A model's check that failed itself (not a refusal: servable's `check`), or its batch_key (`hook`), at WARNING
    in the server's log, with its traceback: the first at once, then at most one line per `every_s`, saying how many
    were not logged in between (ratelog.TracebackLog). Both run on every request, which a broken one fails each of:
    a line (and traceback) per request was thousands a second under load."""

    def __init__(self, model: str, check: str, every_s: float = 10.0, hook: str = "check") -> None:
        # `check`: as the line names it: the config's 'module:callable', or a Servable's own method
        super().__init__(
            log, logging.WARNING, f"model '{model}': its {hook} ({check}) failed", f"failures of its {hook}", every_s
        )


def _signal_interrupt(exc: BaseException) -> bool:
    """Whether `exc` may be a Ctrl-C's, to leave as it is: a KeyboardInterrupt raised where no event loop runs in this
    thread (`wok profile`'s checks). Under `wok serve`, whose signals come through its loop, one is the code's own."""
    if not isinstance(exc, KeyboardInterrupt):
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


class Servable:
    """A model as served: config, the module (one copy per device) and the batching hooks."""

    def __init__(
        self,
        config: ModelConfig,
        module: nn.Module,
        *,
        platform_label: str | None = None,
        check: Callable[[Mapping[str, np.ndarray]], object] | None = None,
        dim_ranges: Mapping[str, tuple[tuple[int, int, int | None, int], ...]] | None = None,
        id_ranges: Mapping[str, int] | None = None,
        id_least: Mapping[str, int] | None = None,
        id_bounds: Mapping[str, int] | None = None,
    ) -> None:
        """`check`: the config's `check` callable (repository.load_servable); see `check`. `dim_ranges`: by
        input, the sizes its variable (-1) dims take, each as (its index in a request's shape, least, most or
        None for no most, step: every step-th size from least, 1 for each), that decode_request holds each
        request to, and the start-up warm-up runs the model on the least of (a torch.export program's). `id_ranges`:
        by integer input, the rows of the smallest embedding table its every id reaches (tables.id_ranges):
        decode_request refuses a request holding an id outside [0, rows), or [`id_least`, rows) for an input in
        `id_least` (its tables all indexed as `table[ids]`, which counts a negative id from the end). `id_bounds`:
        by integer input every use of whose ids the load followed, the rows of the smallest table some of them reach
        (tables.IdRanges.bounds), below which `wok profile` draws its ids, published in ModelConfig."""
        self.config = config
        self.dim_ranges = MappingProxyType(dict(dim_ranges or {}))
        self.id_ranges = MappingProxyType(dict(id_ranges or {}))
        self.id_least = MappingProxyType(dict(id_least or {}))
        self.id_bounds = MappingProxyType(dict(id_bounds or {}))
        # Bound here, not tested per request: a model without a check keeps the no-op method.
        self.check_failures: CheckFailureLog | None = None
        if check is not None:
            self._user_check = check
            self._check_returned = False  # a value the check returned has been logged
            self.check_failures = CheckFailureLog(config.name, config.check)
            self.check = self._run_user_check
        elif type(self).check is not Servable.check:
            own = type(self)
            self._own_check = self.check
            self.check_failures = CheckFailureLog(config.name, f"{own.__module__}:{own.__qualname__}.check")
            self.check = self._run_own_check
        key = type(self).batch_key
        self.batch_key_failures = CheckFailureLog(
            config.name, f"{key.__module__}:{key.__qualname__}", hook="batch_key"
        )  # told by the service, which calls it on every request (batch_key_failed)
        self.platform_label = platform_label or config.platform
        self._module = module.eval()
        self._per_device: dict[str, nn.Module] = {}
        self._shared_on: set[str] = set()  # devices whose instances share the module (module_for_instance)
        self._weights_copied_on: set[str] = set()  # devices a TorchScript copy's weights were logged on
        self._lock = threading.Lock()
        self.compute_dtype = PRECISION[config.precision]
        self.input_types: dict[str, Datatype] = {t.name: datatype(t.datatype) for t in config.inputs}
        self.output_types: dict[str, Datatype] = {t.name: datatype(t.datatype) for t in config.outputs}
        self.decode_plan = DecodePlan(config)  # what decode_request reads of the config on every request
        self._variable_inputs = [t.name for t in config.inputs if t.variable]
        self._output_dims = {t.name: t.dims for t in config.outputs}
        # Whether an output of a dtype other than its config's casts without loss, by (output, dtype):
        # decided once, as the check runs per batch.
        self._castable: dict[tuple[str, torch.dtype], bool] = {}
        # The inputs in the order forward takes them, decided once: by forward's parameter names
        # where they are exactly the config's input names, else the config's order.
        self._input_order = forward_order(module, [t.name for t in config.inputs])
        astray = astray_inputs(module, self._input_order)
        if astray:
            # As documented, but a model answering from swapped inputs fails nothing: said once, at load.
            taken = ", ".join(name for name, _ in forward_parameter_names(module) or [])
            log.warning(
                "model '%s': %s, by the config's order: inputs reach forward by name only where its first "
                "parameters are named exactly as the config's inputs and any after them have defaults (forward "
                "takes %s); name the inputs as forward's parameters, or list them in its order%s",
                self.name,
                ", ".join(f"input '{i}' goes to forward's parameter '{p}'" for i, p in astray),
                taken,
                f" (config: {config.source})" if config.source else "",
            )

    @property
    def name(self) -> str:
        return self.config.name

    def warmup_shape(self, tensor: TensorConfig) -> tuple[int, ...]:
        """One sample's shape of input `tensor` in the start-up warm-up: its config's (TensorConfig.warmup_shape),
        each -1 dim held to a range (dim_ranges) as the least size from 1 in it: a size the model was not
        exported for would run outside what was traced (Dim.AUTO's range starts at 2), or fail its guards."""
        least = {}
        for i, lo, _, step in self.dim_ranges.get(tensor.name, ()):
            size = max(lo, 1)
            least[i] = size + (lo - size) % step  # 2 for an even size of 0 or more
        return tensor.warmup_shape(least)

    # -- instances -----------------------------------------------------------------
    def module_for(self, device: torch.device) -> nn.Module:
        """The module on `device`, cast to the configured precision; one copy per device.

        The first device asked for takes the module itself; each later one a copy of it, whose weights
        are made on that device directly (_copy_onto). Copying only for a second device serves a module
        that cannot be copied (one holding a lock, an event or a handle) on any one device, CUDA
        included; where a second is asked for, ConfigError says so."""
        key = str(device)
        with self._lock:
            mod = self._per_device.get(key)
            if mod is None:
                if not self._per_device:
                    mod = self._module
                else:
                    try:
                        mod = _copy_onto(self._module, device)
                    except Exception as exc:
                        first = next(iter(self._per_device))
                        raise ConfigError(
                            f"model '{self.name}': its module, on {first}, cannot be copied for {key} "
                            f"({error_line(exc)}); serve it on one device, or make it copyable (copy.deepcopy)"
                        ) from exc
                mod = mod.to(device)
                if self.compute_dtype != torch.float32:
                    mod = mod.to(self.compute_dtype)
                self._per_device[key] = mod
            return mod

    def module_for_instance(self, device: torch.device, first: bool) -> nn.Module:
        """The module one instance on `device` runs: the device's own (module_for) for the `first`
        instance there, and for each later one a copy of it that shares its parameters (the weights
        are not made twice) but holds its own buffers and other state (_copy_sharing_parameters). A
        TorchScript module's copy, made by TorchScript, holds its weights too: logged once per device
        with their size, as an operator sizing a device's memory needs it (Triton's PyTorch backend
        gives each instance its own weights as well, unless ENABLE_WEIGHT_SHARING).

        The instances on one device run their batches on threads of their own, at the same time: on one
        shared module, a forward that writes tensors the module keeps (a workspace its input is staged
        in, an output buffer, a cache) would write another batch's rows into them while the first still
        computes from them, and hand that batch's callers another's answers. A module that cannot be
        copied (one holding a lock or an event) is shared, with a warning once per device."""
        mod = self.module_for(device)
        if first:
            return mod
        try:
            copied = _copy_sharing_parameters(mod)
        except Exception as exc:
            key = str(device)
            if key not in self._shared_on:
                self._shared_on.add(key)
                log.warning(
                    "model '%s': its module cannot be copied for a second instance on %s (%s); its instances "
                    "there share it and run its forward at the same time: a forward that writes tensors the "
                    "module keeps would mix their batches' rows; make it copyable (copy.deepcopy), or serve one "
                    "instance per device",
                    self.name,
                    key,
                    error_line(exc),
                )
            return mod
        key = str(device)
        if isinstance(mod, torch.jit.ScriptModule) and key not in self._weights_copied_on:
            self._weights_copied_on.add(key)
            held = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in copied.parameters()}
            log.info(
                "model '%s': TorchScript copies its weights for each later instance on %s (%.1f MiB each): "
                "the instances there hold them once each",
                self.name,
                key,
                sum(held.values()) / 2**20,
            )
        return copied

    # -- per request, on the event loop, before the request joins a queue ------------
    def check(self, inputs: dict[str, np.ndarray]) -> None:
        """Value checks beyond datatype and shape; raise InvalidInput. Default: none."""

    def _run_user_check(self, inputs: dict[str, np.ndarray]) -> None:
        """The config's `check`: a ValueError (or wok's InvalidInput) refuses the request (INVALID_ARGUMENT,
        its message); anything else is the check's own failure (INTERNAL), not the request's."""
        for a in inputs.values():
            a.flags.writeable = False  # a check reads the request; what it changed would be run
        try:
            result = self._user_check(MappingProxyType(inputs))  # nor may it swap the arrays
        except InvalidInput as exc:
            # wok's own refusal, as the demo models' checks raise it: the request's fault, as a ValueError
            # is, not a failure of the check (it ended INTERNAL, with a traceback in the log).
            message = message_of(exc) or "its check raised InvalidInput with no message"
            raise InvalidInput(f"model '{self.name}' refused the request: {message}") from None
        except ValueError as exc:
            message = message_of(exc)
            if not any(m in message for m in _NUMPY_READ_ONLY):
                message = message or "its check raised ValueError with no message"
                raise InvalidInput(f"model '{self.name}' refused the request: {message}") from None
            own = exc  # numpy's refusal of a write to the request: the check is wrong, not the request
        except BaseException as exc:
            # Whatever else it raises is its own failure, BaseExceptions too: it runs on the event loop,
            # where a KeyboardInterrupt or SystemExit would end the server, and a GeneratorExit, a
            # CancelledError or another BaseException end the call's handler with no answer (a stream's
            # request never answered). Run synchronously, nothing it raises is the task's cancellation,
            # nor, on the loop, a signal's KeyboardInterrupt: `wok serve` takes its signals through the loop.
            if _signal_interrupt(exc):
                raise
            own = exc
        else:
            if result is not None and not self._check_returned:
                self._check_returned = True
                log.warning(
                    "model '%s': its check (%s) returned %s, which is ignored: a check refuses a request by "
                    "raising ValueError (logged once)",
                    self.name,
                    self.config.check,
                    type(result).__name__,
                )
            return
        self.check_failures.failed(own)
        raise ModelExecutionError(
            f"model '{self.name}': its check ({self.config.check}) failed: {error_line(own)}"
        ) from own

    def _run_own_check(self, inputs: dict[str, np.ndarray]) -> None:
        """A subclass's own `check`: a WokError it raises (its InvalidInput) is its answer to the request, as it
        is; anything else, the check's own failure, is answered in to_status's code and words (CheckFailed) and
        logged here, rate-limited, as the config's check's is: the handler logged it with a traceback on every
        request. A BaseException too, as the config's check's (`_run_user_check` says why), but a Ctrl-C in
        `wok profile`'s checks, which stays one (_signal_interrupt)."""
        try:
            self._own_check(inputs)
        except WokError:
            raise
        except BaseException as exc:
            if _signal_interrupt(exc):
                raise
            self.check_failures.failed(exc)
            raise CheckFailed(exc) from exc

    def batch_key_failed(self, exc: BaseException) -> CheckFailed:
        """The answer to a request whose `batch_key` raised `exc` (no WokError), logged rate-limited as a failed
        check is: the service calls batch_key on every request, on the event loop (where a BaseException is the
        hook's own, as a check's), and logged a traceback for each."""
        self.batch_key_failures.failed(exc)
        return CheckFailed(exc)

    def batch_key(self, inputs: dict[str, np.ndarray]) -> Hashable:
        """Requests share a batch only when their keys are equal."""
        if not self._variable_inputs:
            return None
        return tuple(inputs[n].shape[1:] for n in self._variable_inputs)

    # -- per batch, on the instance's worker thread ----------------------------------
    def assemble(
        self, requests: Sequence[dict[str, np.ndarray]], rows: int, buffers: HostBuffers
    ) -> dict[str, torch.Tensor]:
        """Copy the requests' inputs, row after row, into host buffers."""
        out = {}
        first = requests[0]
        for name, dt in self.input_types.items():
            sample_shape = first[name].shape[1:]
            buf = buffers.get(name, (rows, *sample_shape), torch_dtype(dt))
            view = to_numpy_view(buf)
            r = 0
            for req in requests:
                a = req[name]
                view[r : r + a.shape[0]] = a
                r += a.shape[0]
            out[name] = buf
        return out

    def prepare(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """On the device: cast floating inputs to the compute precision."""
        if self.compute_dtype == torch.float32:
            return tensors
        return {k: (v.to(self.compute_dtype) if v.is_floating_point() else v) for k, v in tensors.items()}

    def forward(self, module: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run the module; inputs by position, in the order of forward's parameters where their names are
        the config's input names (else the config's order); outputs named by config order."""
        result = module(*[tensors[n] for n in self._input_order])
        return self.name_outputs(result)

    def name_outputs(self, result) -> dict[str, torch.Tensor]:
        names = [t.name for t in self.config.outputs]
        what = "a tensor" if isinstance(result, torch.Tensor) else f"a {type(result).__name__}"
        if isinstance(result, torch.Tensor):
            result = (result,)
        if isinstance(result, dict):
            missing = [n for n in names if n not in result]
            if missing:
                # What it returned instead: a key misspelt, or another model's names. A few, cut: the
                # model's dict may be long, its keys anything.
                keys = [_shown_key(k) for k in itertools.islice(result, 8)]
                more = f" and {len(result) - 8:,} more" if len(result) > 8 else ""
                wanted = ", ".join(f"'{n}'" for n in missing)
                raise ModelExecutionError(
                    f"model '{self.name}': expected a dict with an output named {wanted}; got one without, its "
                    f"keys: {', '.join(keys) or 'none'}{more}"
                )
            result = [result[n] for n in names]
        elif not isinstance(result, (tuple, list)):
            # Taken apart as a sequence, a string said "returned 8 outputs" (its characters), an array
            # as many outputs as it has rows, and None failed as "'NoneType' object is not iterable".
            raise ModelExecutionError(
                f"model '{self.name}': expected a torch.Tensor, or a tuple, list or dict of them, as its result "
                f"({len(names)} output(s): {', '.join(names)}); got {type(result).__name__}"
            )
        result = list(result)
        if len(result) != len(names):
            got = "1 output" if len(result) == 1 else f"{len(result):,} outputs"
            want = "1 output" if len(names) == 1 else f"{len(names)} outputs"
            raise ModelExecutionError(
                f"model '{self.name}': expected {want} in its result, one per output its config declares: "
                f"{', '.join(quoted_name(n) for n in names)}; got {got} ({what})"
            )
        out = {}
        for n, t in zip(names, result):
            if not isinstance(t, torch.Tensor):
                raise ModelExecutionError(
                    f"model '{self.name}' output '{n}': expected a torch.Tensor; got {type(t).__name__}"
                )
            if t.layout != torch.strided or t.is_nested:
                # Rows of it cannot be cut out or read as an array: it failed later, in torch's words,
                # naming neither the output nor what it is ("Cannot access storage of SparseTensorImpl").
                layout = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
                raise ModelExecutionError(
                    f"model '{self.name}' output '{n}': expected a dense (strided) torch.Tensor; got a {layout} tensor"
                )
            if t.is_meta:
                # A shape with no values: it failed as the rows were read, in torch's words, naming no output
                # and advising a copy to host (Tensor.cpu()) that cannot be made of it.
                raise ModelExecutionError(
                    f"model '{self.name}' output '{n}': expected a torch.Tensor with data; got one on the meta "
                    "device, which holds no values"
                )
            want = torch_dtype(self.output_types[n])
            if t.dtype != want:
                ok = self._castable.get((n, t.dtype))
                if ok is None:
                    ok = casts_without_loss(t.dtype, want)
                    self._castable[(n, t.dtype)] = ok
                if not ok:
                    raise ModelExecutionError(
                        f"model '{self.name}' output '{n}': expected {self.output_types[n].name}, as its config "
                        f"declares, or a dtype that casts to it without loss; got {t.dtype}"
                    )
                t = t.to(want)
            # A view with torch's negative bit set (x.conj().imag) is -x only as torch reads it: numpy()
            # refuses it, which failed the whole batch. Made into a tensor of its values; others are returned
            # as they are. A conjugate view (the conj bit) is complex, refused by the cast check above.
            out[n] = t.resolve_neg()
        return out

    def check_shapes(self, shapes: Mapping[str, Sequence[int]], total: int) -> None:
        """ModelExecutionError unless every output's shape is `total` rows of its config's dims."""
        rows = f"{total} row" if total == 1 else f"{total} rows"
        for k, shape in shapes.items():
            if len(shape) == 0 or shape[0] != total:
                raise ModelExecutionError(
                    f"model '{self.name}' output '{k}': expected {rows}, one per sample; got shape {list(shape)}"
                )
            dims = self._output_dims[k]
            if len(shape) != len(dims) + 1 or any(d != -1 and d != n for d, n in zip(dims, shape[1:])):
                # Clients size their buffers from the model's metadata: an answer of another shape
                # would be read wrongly, or not at all, so the batch fails instead.
                raise ModelExecutionError(
                    f"model '{self.name}' output '{k}': expected shape {[total, *dims]}, as its config declares "
                    f"({rows}; -1 = any size); got {list(shape)}"
                )

    def split(self, outputs: dict[str, np.ndarray], rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """Per-request views of the batch outputs, by rows."""
        self.check_shapes({k: v.shape for k, v in outputs.items()}, sum(rows))
        per_request = []
        r = 0
        for n in rows:
            per_request.append({k: v[r : r + n] for k, v in outputs.items()})
            r += n
        return per_request


def _shown_key(key: object) -> str:
    """A key of a model's output dict, as a message shows it: a string as a name (quoted, escaped, cut),
    anything else as Python writes it, escaped and cut as well."""
    if isinstance(key, str):
        return quoted_name(key)
    text = repr(key)
    return escaped(text[:NAME_CHARS]) + ("…" if len(text) > NAME_CHARS else "")


def _copy_sharing_parameters(module: nn.Module) -> nn.Module:
    """copy.deepcopy(module), its parameters the module's own objects: the copy's buffers, plain tensor
    attributes and Python state are its own. A TorchScript module's copy is made by TorchScript, which
    copies its parameters too."""
    memo: dict[int, object] = {id(p): p for p in module.parameters()}
    return copy.deepcopy(module, memo)


def _copy_onto(module: nn.Module, device: torch.device) -> nn.Module:
    """copy.deepcopy(module), its parameters and buffers made on `device` directly.

    A plain deepcopy clones every tensor on the device it is on first: for a module on its first GPU,
    a second copy of its weights there, which for a model filling most of that GPU runs it out of
    memory before anything reaches the second one. Parameters and buffers given to deepcopy's memo
    are taken as they are: a tensor held twice (tied weights) is copied once. A buffer that is a view
    of another becomes a tensor of its own, as Module.to makes it anyway. Tensor subclasses are left
    to deepcopy and the `.to(device)` after it."""
    memo: dict[int, object] = {}
    for t in module.parameters():
        if type(t) is nn.Parameter:
            memo[id(t)] = nn.Parameter(t.detach().to(device, copy=True), requires_grad=t.requires_grad)
    for t in module.buffers():
        if type(t) is torch.Tensor:
            memo[id(t)] = t.detach().to(device, copy=True)
    return copy.deepcopy(module, memo)
