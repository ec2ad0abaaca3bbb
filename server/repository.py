"""Where models come from: a repository folder, or the built-in demo models.

A repository holds one folder per model, each with a `config.toml` or `config.yaml`
(see config.ModelConfig) and the files it names. Weights never go through arbitrary
unpickling: TorchScript and torch.export files are loaded by their own loaders, state
dicts with `weights_only=True` or from safetensors.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import logging
import pickle
import re
import sys
import zipfile
from collections import OrderedDict, namedtuple
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

from .codec import in_size_range, size_range
from .config import CONFIG_NAMES, ModelConfig, inside_model_dir, load_model_config
from .datatypes import datatype
from .errors import ConfigError, InvalidVersion, ModelNotFound, error_line, quoted_name
from .numerals import ascii_digits
from .servable import Servable, forward_order
from .tables import IdRanges, id_ranges
from .tensors import torch_dtype

VERSION = "1"
# The most digits a version of at most 2**63-1 takes, leading zeros left out: longer, it is refused before
# int() reads it, which past 4,300 digits raises a ValueError of its own.
_VERSION_DIGITS = len(str(2**63 - 1))
log = logging.getLogger("wok")


_packages = itertools.count(1)

# What a model's code may raise as it is imported or built, each a failure of that model's load. A
# sys.exit() there (a script's main, an argparse parse of wok's own arguments) would otherwise end the
# server with the model's status and no word of which model, or a traceback.
_LOAD_FAILURES = (Exception, SystemExit)


def _failure(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


def _source(cfg: ModelConfig) -> str:
    """What a load error begins with: the config file to open, or the model's name for a config
    built in code."""
    return cfg.source or f"model '{cfg.name}'"


def _import_model_folder_module(cfg: ModelConfig, model_dir: Path, module_name: str, local: Path):
    """Import `local` (the folder's file for `module_name`) as a submodule of a package private to
    this model: the folder is that package, so model.py may import its sibling files relatively
    (`from .layers import head`), and two models' layers.py stay two modules. The folder is never put
    on sys.path: an absolute `import layers` finds only installed modules."""
    slug = re.sub(r"\W", "_", cfg.name)
    package = f"wok_model_{slug}_{next(_packages)}"
    # An empty package: a folder's __init__.py is not run (it was never read before model folders were
    # packages; run, it could import model.py a second time, or fail on an absolute `from model import`).
    spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
    spec.submodule_search_locations = [str(model_dir)]
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[package] = pkg
    try:
        parent = package
        for part in module_name.split(".")[:-1]:  # a dotted factory module: pkg.models is pkg/models.py
            importlib.import_module(f"{parent}.{part}")
            parent = f"{parent}.{part}"
        full = f"{package}.{module_name}"
        spec = importlib.util.spec_from_file_location(full, local)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        spec.loader.exec_module(mod)
        setattr(sys.modules[parent], module_name.rpartition(".")[2], mod)
    except BaseException:
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
        raise
    return mod


def _load_callable(cfg: ModelConfig, model_dir: Path, field: str, imported: dict[str, object]):
    """The callable a 'module:callable' field of the config names (factory, check): the module is the
    folder's file if there is one, else an installed module. `imported`: modules already imported for
    this model, by name, so that a factory and a check in one model.py run it once."""
    spec = getattr(cfg, field)
    module_name, _, attr = spec.partition(":")
    local = model_dir / (module_name.replace(".", "/") + ".py")
    where = f"{_source(cfg)}: {field} {spec!r}"
    if local.is_file():
        mod = imported.get(module_name)
        if mod is None:
            try:
                mod = _import_model_folder_module(cfg, model_dir, module_name, local)
            except _LOAD_FAILURES as exc:
                raise ConfigError(f"{where}: cannot import {str(local)!r}: {_failure(exc)}") from exc
            imported[module_name] = mod
        found_in = str(local)
    else:
        try:
            mod = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            parts = module_name.split(".")
            if exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
                raise ConfigError(f"{where}: no file {local}, and no installed module {module_name!r}") from None
            raise ConfigError(f"{where}: cannot import installed module {module_name!r}: {exc}") from None
        except ImportError as exc:
            raise ConfigError(f"{where}: cannot import installed module {module_name!r}: {exc}") from None
        except _LOAD_FAILURES as exc:  # the module itself failed as it was imported
            raise ConfigError(f"{where}: cannot import installed module {module_name!r}: {_failure(exc)}") from exc
        found_in = f"installed module {module_name!r}"
        if getattr(mod, "__file__", None):
            found_in += f" ({mod.__file__})"
    try:
        found = getattr(mod, attr)
    except AttributeError:
        raise ConfigError(f"{where}: {found_in} has no attribute {attr!r}") from None
    if field == "check":
        _check_check(found, where, attr, found_in)
    return found


def _check_check(found, where: str, attr: str, found_in: str) -> None:
    """ConfigError unless `found` can be called as a check: with one positional argument, returning
    at once (a coroutine function's call would only make a coroutine, and check nothing)."""
    if not callable(found):
        raise ConfigError(f"{where}: {attr!r} in {found_in}: expected a function; got {type(found).__name__}")
    # A class instance's async __call__ too: each call would only make a coroutine.
    if inspect.iscoroutinefunction(found) or inspect.iscoroutinefunction(type(found).__call__):
        raise ConfigError(
            f"{where}: {attr!r} in {found_in}: expected a plain function (an async one's call only makes a coroutine, "
            "and checks nothing); got an async function"
        )
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):  # some builtins have none to read: called as they are
        return
    try:
        signature.bind(None)
    except TypeError:
        raise ConfigError(
            f"{where}: {attr!r} in {found_in}: expected a function called with one argument, the request's inputs; "
            f"got one of signature {attr}{signature}"
        ) from None


def _load_weights(module: nn.Module, path: Path, cfg: ModelConfig) -> None:
    where = f"{_source(cfg)}: weights {cfg.weights!r}"
    if not path.is_file():
        raise ConfigError(f"{where}: {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            state = load_file(str(path))
        except Exception as exc:
            raise ConfigError(f"{where}: {path} is not a valid safetensors file: {exc}") from None
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            # torch's message (six lines, with terminal colour codes) advises weights_only=False,
            # which would run whatever the file's pickle holds (docs/security.md).
            found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
            what = f" ({found.group(1)})" if found else ""
            raise ConfigError(
                f"{where}: {path} is not a weights-only state dict: it is a pickled object{what}, "
                "not a state dict: save model.state_dict(), or use safetensors"
            ) from None
        except Exception as exc:
            raise ConfigError(f"{where}: {path} is not a weights-only state dict: {exc}") from None
    try:
        module.load_state_dict(state)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"{where}: {path} does not fit the module: {exc}") from None


def _check_model_file(path: Path, cfg: ModelConfig) -> None:
    """ConfigError, in one line, for a model file of the other platform (or no torch.export archive
    at all): torch.export.load logs a traceback of its own as a warning and then raises only "check
    the warnings above", and torch.jit.load calls an export archive a corrupted file."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        names = None  # for torchscript, torch.jit.load names what is wrong with it
    export = names is not None and any(n == "archive_format" or n.endswith("/archive_format") for n in names)
    script = names is not None and any(n.endswith("constants.pkl") or "/code/__torch__" in n for n in names)
    # torch.save(model) or torch.save(state_dict), the usual way to keep a trained model: torch.jit.load
    # calls it a corrupted checkpoint ("failed locating file constants.pkl"), which says nothing of the fix.
    pickled = names is not None and not export and not script and any(n.endswith("/data.pkl") for n in names)
    saved = (
        "it is a torch.save file (a pickled module or state dict), not a {what}: save the model with {how}, or "
        'serve its nn.Module with platform = "python", a factory and weights = its state dict'
    )
    where = f"{_source(cfg)}: model_file {cfg.model_file!r}"
    if cfg.platform != "torch_export":
        if export:
            raise ConfigError(
                f"{where}: cannot load torchscript file {path}: it is a torch.export program, not a "
                'TorchScript file; set platform = "torch_export"'
            )
        if pickled:
            how = "torch.jit.script(model).save(path) or torch.jit.trace(model, example_inputs).save(path)"
            raise ConfigError(
                f"{where}: cannot load torchscript file {path}: " + saved.format(what="TorchScript file", how=how)
            )
        return
    if export:
        return
    if names is None:
        reason = "it is not a zip archive, as torch.export.save writes"
    elif script:
        reason = 'it is a TorchScript file, not a torch.export program; set platform = "torchscript"'
    elif pickled:
        how = "torch.export.save(torch.export.export(model, example_inputs), path)"
        reason = saved.format(what="torch.export program", how=how)
    else:
        reason = "it holds no archive_format record, as torch.export.save writes"
    raise ConfigError(f"{where}: cannot load torch_export file {path}: {reason}")


def _user_inputs(program) -> list:
    """The input specs of `program`'s caller's inputs (not its parameters, buffers or constants), in order."""
    return [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def _takes_flat_tensors(program, n: int) -> bool:
    """Whether `program` is called as wok calls a model: `n` tensors by position, no keywords."""
    try:
        spec = program.call_spec.in_spec
        args, kwargs = spec.children()
        tensors = _user_inputs(program)
    except (AttributeError, TypeError, ValueError):  # another torch's layout: its checks stay
        return False
    return (
        spec.type is tuple
        and args.type is tuple
        and args.num_children == n
        and all(c.is_leaf() for c in args.children())
        and kwargs.type is dict
        and kwargs.num_children == 0
        and len(tensors) == n
        and all(isinstance(s.arg, TensorArgument) for s in tensors)
    )


def _traced_shape(program, spec):
    """The shape the input of `spec` was traced with, from the program's placeholder for it (raises where another
    torch lays the program out otherwise: the callers' except clauses)."""
    return next(n for n in program.graph.find_nodes(op="placeholder") if n.name == spec.arg.name).meta["val"].shape


def _check_ranks(program, cfg: ModelConfig, order: list[str]) -> None:
    """ConfigError for an input whose config's dims, the batch's before them, make another rank than the program
    was traced for: dims written Triton's way, the batch dim among them, loaded (a Linear takes any rank) to fail
    the warm-up on its output's shape, or serve requests of one dim more; a fixed one failed the guards in words
    that said nothing of the batch. Read from the program's own placeholders: left to the guards where not kept.
    Run only for a program taking flat tensors (_takes_flat_tensors): one of other inputs is left to the warm-up."""
    tensors = {t.name: t for t in cfg.inputs}
    for name, spec in zip(order, _user_inputs(program), strict=True):
        try:
            shape = _traced_shape(program, spec)
        except (AttributeError, KeyError, StopIteration, TypeError):  # another torch's layout
            continue
        dims = tensors[name].dims
        if len(shape) == len(dims) + 1 or len(shape) == 0:  # a 0-d input has no batch dim for any dims to fit
            continue
        own = [d if isinstance(d, int) else -1 for d in shape[1:]]
        raise ConfigError(
            f"{_source(cfg)}: model_file {cfg.model_file!r}: input '{name}' of its torch.export program takes tensors "
            f"of {len(shape)} dims, batch first, but model '{cfg.name}' declares dims {list(dims)}, which wok sends "
            f"as {len(dims) + 1} dims (shape {[-1, *dims]}, batch first): dims exclude the batch dim, as Triton's do "
            f"where max_batch_size > 0; write dims = {own}, the program's after its batch dim"
            + (" (-1 = any size)" if -1 in own else "")
        )


def _dim_bounds(program, spec, index: int):
    """(dim `index` of the input of `spec` as the program was traced: an int where it was exported with no Dim, else
    torch's expression for it, a symbol or one derived from symbols (2*s65); the least and most sizes it was traced
    for, None for no most: for a derived one whose range the program does not keep beside its symbols', 0 and None),
    or None where the program keeps no range for a symbol."""
    try:
        dim = _traced_shape(program, spec)[index]
        if isinstance(dim, int):
            return dim, dim, dim
        expr = dim.node.expr
        if not expr.is_Symbol and expr not in program.range_constraints:
            return expr, 0, None
        bounds = program.range_constraints[expr]
    # Another torch's layout: the guards, run at each row count, are the check.
    except (AttributeError, IndexError, KeyError, StopIteration, TypeError):
        return None
    return (expr, *_least_most(bounds))


def _least_most(bounds) -> tuple[int, int | None]:
    """The least and most sizes of a range of the program's `range_constraints`, None for no most."""
    return (
        int(bounds.lower) if bounds.lower.is_Integer else 0,
        int(bounds.upper) if bounds.upper.is_Integer else None,  # not: int_oo, a Dim with no max
    )


def _shown_size(expr, names: dict) -> str:
    """`expr`, a size torch derived from symbols (2*s65), with each symbol as `names` calls it (2 × Dim): torch's
    names are its own, made at export, and no config or Dim says them."""
    import sympy  # torch imports it for the program already

    shown = str(expr.xreplace({s: sympy.Symbol(names[s]) for s in expr.free_symbols}))
    return re.sub(r"(?<!\*)\*(?!\*)", " × ", shown)  # a product's *, not a power's **


def _steps(expr) -> tuple[int, int] | None:
    """(step, offset) where `expr`, a size torch derived from one symbol, is step × it + offset (2 × Dim: (2, 0)):
    the sizes it takes are offset plus a multiple of step; None for a size of another form."""
    if len(expr.free_symbols) != 1:
        return None
    poly = expr.as_poly(*expr.free_symbols)
    if poly is None or poly.degree() != 1:
        return None
    step, offset = poly.all_coeffs()
    if not (step.is_Integer and offset.is_Integer and step > 0):
        return None
    return int(step), int(offset)


class _Padding(NamedTuple):
    """How a torch.export program's batches are padded (_least_batch): to `rows` rows at least (1: none padded),
    for `inputs`, by name the batches each takes (as the start-up says it); `batch`: the inputs' batch dims as
    traced (torch's symbols, or the sizes exported with no Dim), to tell the outputs that carry the batch."""

    rows: int
    inputs: dict[str, str]
    batch: set

    def said(self) -> str:
        """The padded inputs and what each takes, those that take the same together: "input 'a' of its torch.export
        program takes batches of 2 rows or more, input 'b' batches of 3 rows or more"."""
        by_takes: dict[str, list[str]] = {}
        for name, takes in self.inputs.items():
            by_takes.setdefault(takes, []).append(name)
        parts = []
        for takes, names in by_takes.items():
            inputs = ("input " if len(names) == 1 else "inputs ") + ", ".join(f"'{n}'" for n in names)
            if not parts:
                verb = "takes" if len(names) == 1 else "take"
                parts.append(f"{inputs} of its torch.export program {verb} batches of {takes}")
            else:
                parts.append(f"{inputs} batches of {takes}")
        return ", ".join(parts)


def _derived(dim) -> bool:
    """Whether a dim's size is one torch derived from its symbols (`2*s65`): its guards check only its bounds."""
    return not isinstance(dim, int) and not dim.is_Symbol


def _least_batch(program, cfg: ModelConfig, order: list[str]) -> _Padding:
    """The fewest rows a batch is padded to for the program, and what for; ConfigError where an input's batch
    dim, as the program was exported, leaves out a row count wok can send it (1 to max_batch_size) that
    padding does not bring into its range. An input whose range cannot be read is left to the guards, run at
    each row count.

    The range is the program's own record of what it was traced for (`range_constraints`, from the batch
    Dim's min and max; a dim exported without a Dim is that one size). torch checks a call against it only
    in part: it asserts no lower bound of 2 (the bound a Dim with min=2, Dim.AUTO or Dim.DYNAMIC gets), so
    a one-row batch would run outside what was traced (a branch on the batch's size took the other path),
    and only the bounds of a derived size (an odd batch passes those of 2 * Dim). A batch below a least of
    2 or more is padded to it (_PaddedBatch), and so is every batch below max_batch_size where that is the one
    size a program exported with no Dim takes: wok's batching already takes each row's answer to be its own,
    whatever else shares its batch."""
    mbs = cfg.max_batch_size
    export = f'export it with a batch Dim from 1, torch.export.Dim("batch", min=1, max={mbs})'
    least, padded, batch = 1, {}, set()
    for name, spec in zip(order, _user_inputs(program), strict=True):
        bounds = _dim_bounds(program, spec, 0)
        if bounds is None:
            continue
        dim, lo, hi = bounds
        if _derived(dim):
            # Its Dim's range is left out: torch raises a min of 1 to 2 there, which the Dim said otherwise.
            symbols = sorted(dim.free_symbols, key=str)
            names = {s: "Dim" if len(symbols) == 1 else f"Dim{i}" for i, s in enumerate(symbols, 1)}
            takes = f"{_shown_size(dim, names)} rows, a size derived from a Dim"
            fix = f"torch checks only such a size's bounds, and a batch of another would run unchecked; {export}"
        elif lo == hi and lo == mbs and lo > 1:
            # One size, and the greatest wok sends: every batch is padded to it.
            least, padded[name] = lo, f"exactly {lo} rows (exported with no batch Dim)"
            batch.add(dim)
            continue
        elif lo == hi and (lo != 1 or mbs != 1):
            takes = f"exactly {lo} row(s), exported with no batch Dim"
            fix = "a batch of any other size fails its guards; "
            if lo == 1:
                fix += f"set max_batch_size = 1, or {export}"
            else:
                fix += f"set max_batch_size = {lo} (a batch of fewer rows is then padded to {lo}), or {export}"
        elif hi is not None and hi < mbs:
            takes = f"{size_range(lo, hi)} rows"
            fix = (
                f"a batch of more than {hi} rows fails its guards; set max_batch_size = {hi}, or export it with "
                f'a batch Dim up to {mbs}, torch.export.Dim("batch", min=1, max={mbs})'
            )
        elif lo > mbs:
            takes = f"{lo} rows or more" if hi is None else f"{lo} to {hi} rows"
            fix = (
                f"none is in its range, and wok pads a batch to max_batch_size rows at most; set max_batch_size = "
                f"{lo} (a batch of fewer rows is then padded to {lo}), or {export}"
            )
        else:
            batch.add(dim)
            if lo > 1:
                least, padded[name] = max(least, lo), f"{lo} rows or more"
            continue
        raise ConfigError(
            f"{_source(cfg)}: model_file {cfg.model_file!r}: input '{name}' of its torch.export program takes "
            f"batches (its dim 0) of {takes}, but model '{cfg.name}' has max_batch_size {mbs}, so wok sends it "
            f"batches of 1 to {mbs} rows: {fix}"
        )
    return _Padding(least, padded, batch)


def _dim_ranges(program, cfg: ModelConfig, order: list[str]) -> dict[str, tuple[tuple[int, int, int | None, int], ...]]:
    """By input, the sizes the program was exported for in each of its variable (-1) dims, for wok to hold each
    request to, and to run the start-up's warm-up on the least of (Servable.dim_ranges): as (the dim's index in a
    request's shape, least, most or None for no most, step: every step-th size from least); ConfigError where a
    fixed dim of the config, or a -1 dim's warmup_dims, lies outside the program's range for it.

    The range is the program's record of what it was traced for, as for the batch dim (_least_batch), and torch
    checks a call against it only in part: its guards assert no least of 2 (the least of a Dim of min=2,
    Dim.AUTO or Dim.DYNAMIC), and the tracer took the dim to be 2 or more (torch's 0/1 specialisation), so a
    dim of 1 ran outside what was traced, unrefused: a branch on that size took the other path. Unlike the
    batch's, such a dim cannot be padded. A dim exported with no Dim is that one size: a fixed dim of another
    fails the guards, run at load (_unchecked_where_safe). A size derived from a Dim (2 × Dim) has a range of its
    own, and its guards check only that: an odd size passed those of 2 × Dim, and ran as no size the program was
    traced for; its step (2) and offset are read from its expression (_steps)."""
    tensors = {t.name: t for t in cfg.inputs}
    ranges = {}
    for name, spec in zip(order, _user_inputs(program), strict=True):
        dims = tensors[name].dims
        warmup = tensors[name].warmup_dims
        held = []
        for i, size in enumerate(dims, 1):
            bounds = _dim_bounds(program, spec, i)
            if bounds is None:
                continue
            dim, lo, hi = bounds
            step = 1
            if _derived(dim):
                steps = _steps(dim)
                if steps is None:  # torch 2.13 derives a × Dim + b alone: another form is left to its guards
                    continue
                step, offset = steps
                if dim not in program.range_constraints:
                    # Its symbol's range is kept where its own is not: from 0 and None, the first size of its form,
                    # a 2 × Dim + 1 of min=2 was held to odd sizes from 1 and warmed on 1, outside what was traced.
                    try:
                        least, most = _least_most(program.range_constraints[next(iter(dim.free_symbols))])
                    except (AttributeError, KeyError, TypeError):  # another torch's layout: left to its guards
                        continue
                    lo, hi = step * least + offset, None if most is None else step * most + offset
                lo += (offset - lo) % step
                hi = None if hi is None else hi - (hi - offset) % step
            where = f"{_source(cfg)}: model_file {cfg.model_file!r}: input '{name}' of its torch.export program takes"
            takes = size_range(lo, hi, step)
            if size == -1:
                held.append((i, lo, hi, step))
                if warmup is not None and not in_size_range(warmup[i - 1], lo, hi, step):
                    # The warm-up is sent what no request may be (decode_request refuses it): outside what was
                    # traced, or failing the guards, which the start would say less of.
                    raise ConfigError(
                        f"{where} a dim {i} of {takes}, but its warmup_dims {list(warmup)} run the start-up's warm-up "
                        f"on {warmup[i - 1]} there, outside what was traced (a request of that size is refused): set "
                        f"warmup_dims to sizes in its range, or leave them out (the warm-up then takes the least)"
                    )
                if lo >= 2 or step > 1:
                    # Said once at load: a client's request of a size below it (or between its steps) is refused
                    # (decode_request), and Dim.AUTO and Dim.DYNAMIC, the common exports, start at 2.
                    log.warning(
                        "model '%s': input '%s' of its torch.export program takes a dim %d of %s: a request whose "
                        "dim %d is outside it is refused (INVALID_ARGUMENT), being outside what was traced%s",
                        cfg.name,
                        name,
                        i,
                        takes,
                        i,
                        "; a Dim of min=1 takes 1 (traced from 2 all the same: right unless the model branches on "
                        "that size)"
                        if lo == 2 and not _derived(dim)
                        else "",
                    )
                continue
            if isinstance(dim, int) or in_size_range(size, lo, hi, step):
                continue
            if lo == 2 and size < lo:
                why = (
                    f"torch's guards let a dim of {size} through (they check no least of 2), and it would run outside "
                    "what was traced, the tracer having taken the dim to be 2 or more (a branch on that size takes "
                    "the other path)"
                )
            elif lo <= size and (hi is None or size <= hi):
                symbols = sorted(dim.free_symbols, key=str)
                why = (
                    f"torch's guards let it through (they check only the bounds of a size derived from a Dim, "
                    f"{_shown_size(dim, {symbols[0]: 'Dim'})}), and it would run as no size the program was traced for"
                )
            else:
                why = "every batch would fail its guards"
            fix = f"export it with no Dim on that dim, from an example whose dim {i} is {size} (the config fixes it)"
            if size == 1:
                # Not a Dim of min=1: its range would take 1, but torch traces a Dim from 2 all the same.
                fix += ": a Dim of min=1 would let 1 through, traced from 2 all the same"
            else:
                wide = f"min={min(lo, size)}" + ("" if hi is None else f", max={max(hi, size)}")
                fix += f', or with a Dim that takes {size}, torch.export.Dim("dim{i}", {wide})'
            raise ConfigError(
                f"{where} a dim {i} of {takes}, but model '{cfg.name}' fixes it at {size} (shape {[-1, *dims]}, "
                f"batch first): {why}; {fix}"
            )
        if held:
            ranges[name] = tuple(held)
    return ranges


def _batch_outputs(program, cfg: ModelConfig, padding: _Padding) -> frozenset | None:
    """Which outputs of the program carry the batch's rows in dim 0, as _first_rows cuts them: None for its one
    tensor, else the positions (a tuple or list) or keys (a dict) of those that do. Read from the program's trace
    of each output: an output whose dim 0 is an input's batch dim (torch's symbol for the batch Dim, or the size
    exported with no Dim) carries the batch; one of another size (a table as long as the padded batch, say) does
    not, and is left whole. ConfigError for one whose dim 0 is derived from the batch's (2 × it): no rows of it
    are a padded row's alone to cut. Only the outputs Servable takes are read (a dict's other keys are dropped).

    A program exported with no Dim traced its batch as a number like any other: there, every output of as many
    rows carries the batch, as wok takes each row of a full batch's outputs to be its sample's."""
    where = f"{_source(cfg)}: model_file {cfg.model_file!r}"
    names = [t.name for t in cfg.outputs]
    try:
        node = next(iter(program.graph.find_nodes(op="output")))
        signature = zip(node.args[0], program.graph_signature.output_specs, strict=True)
        user = [a for a, s in signature if s.kind == OutputKind.USER_OUTPUT]
        values = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in user]
        spec = program.call_spec.out_spec
        if spec.num_leaves != len(values):
            raise ValueError(f"{spec.num_leaves} outputs in its call spec, {len(values)} in its graph")
        if spec.is_leaf():
            taken = {None: (names[0], values[0])}
        else:
            keyed = spec.type in (dict, OrderedDict)  # a namedtuple's type is `namedtuple` itself to torch's pytree
            keys = spec.context if keyed else range(spec.num_children)
            taken, leaf = {}, 0
            for key, child in zip(keys, spec.children(), strict=True):
                if child.is_leaf() and (key in names if keyed else spec.type in (tuple, list, namedtuple)):
                    taken[key] = (key if keyed else names[key] if key < len(names) else f"#{key}", values[leaf])
                leaf += child.num_leaves
    except (AttributeError, IndexError, KeyError, StopIteration, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{where}: which outputs of its torch.export program carry the batch cannot be read from it "
            f"({error_line(exc)}), and padding its batches of fewer than {padding.rows} rows needs it: export it "
            f'with a batch Dim from 1, torch.export.Dim("batch", min=1, max={cfg.max_batch_size})'
        ) from None
    batch = padding.batch
    cut = set()
    for key, (name, value) in taken.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        dim = value.shape[0]
        dim = dim if isinstance(dim, int) else dim.node.expr
        if dim in batch:
            cut.add(key)
        elif getattr(dim, "free_symbols", set()) & batch:
            shown = _shown_size(dim, {s: "the batch's rows" if s in batch else str(s) for s in dim.free_symbols})
            raise ConfigError(
                f"{where}: output '{name}' of its torch.export program has a dim 0 of {shown}, where wok takes one "
                f"row per sample: a batch of fewer than {padding.rows} rows, padded to {padding.rows}, cannot be "
                "cut back to its own rows in it; return one row per sample as dim 0 of each output"
            )
    return None if None in cut else frozenset(cut)


class _PaddedBatch(nn.Module):
    """A torch.export program's module (`program`) for batches of `rows` rows or more (2 or more): a batch of
    fewer is padded to `rows` with copies of its first row, and the outputs that carry the batch (`parts`, as
    _first_rows takes them) are cut back to its rows (the copies' answers dropped). Its inputs come in the
    config's order (its forward names none), and go to the program in `take`'s (indices into them; None: the
    same)."""

    def __init__(self, program: nn.Module, rows: int, take: list[int] | None, parts: frozenset | None) -> None:
        super().__init__()
        self.program = program
        self.rows = rows
        self.take = take
        self.parts = parts

    def forward(self, *inputs: torch.Tensor):
        if self.take is not None:
            inputs = tuple(inputs[i] for i in self.take)
        n = inputs[0].shape[0]
        if n >= self.rows:
            return self.program(*inputs)
        extra = self.rows - n
        # expand: the copies are views of the first row, made into rows by the one cat.
        result = self.program(*(torch.cat((x, x[:1].expand(extra, *x.shape[1:]))) for x in inputs))
        return _first_rows(result, n, self.parts)


def _first_rows(result, n: int, parts: frozenset | None):
    """`result` (a tensor, or a tuple, list or dict of them, as Servable takes a model's outputs) with the
    tensors `parts` names cut to their first `n` rows: None, `result` itself; else the positions (a tuple or
    list) or keys (a dict) of those to cut."""
    if parts is None:
        return result[:n]
    if isinstance(result, dict):
        return {k: (v[:n] if k in parts else v) for k, v in result.items()}
    if isinstance(result, tuple) and hasattr(result, "_fields"):  # a namedtuple takes its fields one by one
        return type(result)(*(t[:n] if i in parts else t for i, t in enumerate(result)))
    if isinstance(result, (tuple, list)):
        return type(result)(t[:n] if i in parts else t for i, t in enumerate(result))
    return result


def _without_mode_switch(module: nn.Module) -> nn.Module:
    """`module`, a torch.export program's, with its train()/eval() torch's own again: torch makes them raise
    (its mode was fixed at export), but Servable calls eval() on every module, through a _PaddedBatch too."""
    for attr in ("train", "eval"):
        module.__dict__.pop(attr, None)
    return module


def _exported_module(program, checked: nn.Module, cfg: ModelConfig) -> tuple[nn.Module, dict, list[str] | None]:
    """The module a torch.export program is served as, the sizes of its variable dims for wok to hold each
    request to (_dim_ranges), and the order its forward takes the inputs in (forward_order; None where it is not
    called by position with tensors, _takes_flat_tensors: which input is which is not read). The module:
    `checked` (program.module(), which checks every call's inputs against the program's shape guards), or the
    same graph without those checks where every batch wok can send passes them; either padded (_PaddedBatch)
    where the program's batch range starts above 1 row, or is one size only, max_batch_size.

    The checks run in Python on every forward: a pre-hook that flattens the call's arguments to compare
    their structure with the program's, then the guards, one assert per dim. For the demo mlp on one row
    they were 1.3 × its forward's time (docs/performance.md). wok sends each input as rows (1 to
    max_batch_size, or from the program's least where it pads) of the dims its config declares, and refuses
    a request of any other shape before it is queued: where those dims are fixed (no -1), there are at most
    max_batch_size shapes in all, and each is run through the program's guards here, once. Where the fewest
    rows fail, the load is refused (the start-up's warm-up would fail on them); where more fail, the checks
    stay, with a warning: such a batch would fail. torch has no public switch for the pre-hook:
    `validate_inputs` is the attribute it reads (torch.export's own _swap sets it), and `_guards_fn` the
    guards' module; where either is gone, the checks stay. A program called by position with tensors whose
    batch range leaves out a row count wok sends, padded or not, is refused first, with or without the checks:
    they do not refuse every such batch (_least_batch), as is one whose range for a fixed dim leaves out the
    config's size (_dim_ranges). (Any other program is served checked, its ranges unread.)"""
    names = [t.name for t in cfg.inputs]
    if not _takes_flat_tensors(program, len(names)):
        return _without_mode_switch(checked), {}, None
    order = forward_order(checked, names)
    _check_ranks(program, cfg, order)
    padding = _least_batch(program, cfg, order)
    ranges = _dim_ranges(program, cfg, order)
    module = _without_mode_switch(_unchecked_where_safe(program, checked, cfg, order, padding.rows))
    if padding.rows == 1:
        return module, ranges, order
    parts = _batch_outputs(program, cfg, padding)
    log.info(
        "model '%s': %s: batches of fewer than %d rows are padded to %d, copies of their first row, the copies' "
        "answers dropped",
        cfg.name,
        padding.said(),
        padding.rows,
        padding.rows,
    )
    take = [names.index(n) for n in order]
    return _PaddedBatch(module, padding.rows, None if take == list(range(len(take))) else take, parts), ranges, order


def _unchecked_where_safe(program, checked: nn.Module, cfg: ModelConfig, order: list[str], least: int) -> nn.Module:
    """_exported_module's choice of `checked` or the graph without its checks, for batches of `least` to
    max_batch_size rows; ConfigError where the guards refuse `least` rows."""
    guards = getattr(checked, "_guards_fn", None)
    if any(t.variable for t in cfg.inputs) or guards is None:
        return checked
    dims = {t.name: t.dims for t in cfg.inputs}
    for rows in range(least, cfg.max_batch_size + 1):
        # No memory per row: the guards read sizes only.
        batch = [torch.empty_strided((rows, *dims[n]), (0,) * (len(dims[n]) + 1)) for n in order]
        try:
            guards(*batch)
        except Exception as exc:
            shapes = ", ".join(f"{n} {[rows, *dims[n]]}" for n in order)
            if rows == least:
                # Dims the program was not exported for, or a guard on the batch's size its range does not say
                # (x.shape[0] // 2 != 1): the warm-up's one row, padded to `least` or not, would fail the start.
                said = "the fewest wok sends it" if least == 1 else "what wok pads a batch of fewer rows to"
                raise ConfigError(
                    f"{_source(cfg)}: model_file {cfg.model_file!r}: its torch.export program refuses a batch of "
                    f"{rows} row(s) ({shapes}), {said}: {error_line(exc)}; every batch of {rows} row(s) or fewer, "
                    "and the start-up's warm-up, would fail: give the config the dims the program was exported for, "
                    "or export it for the config's, every batch size from 1 to max_batch_size"
                ) from None
            # Some batches pass (the warm-up's among them): the others fail, as the guards still say why.
            log.warning(
                "model '%s': its torch.export program refuses a batch of %d row(s) (%s), which its config lets "
                "through: %s; such batches will fail, and its checks stay on every batch: export it so that every "
                "batch of 1 to %d rows passes them (no condition on the batch's size), or set max_batch_size = %d",
                cfg.name,
                rows,
                shapes,
                error_line(exc),
                cfg.max_batch_size,
                rows - 1,
            )
            return checked
    if "check_guards" not in inspect.signature(program.module).parameters:  # a torch without it: checks stay
        return checked
    fast = program.module(check_guards=False)
    if not hasattr(fast, "validate_inputs"):
        return checked
    fast.validate_inputs = False
    return fast


def load_servable(model_dir: Path, cfg: ModelConfig | None = None) -> Servable:
    """Build the Servable for the model in `model_dir`."""
    cfg = cfg or load_model_config(model_dir)
    source = _source(cfg)
    for kind, tensors in (("input", cfg.inputs), ("output", cfg.outputs)):
        for i, t in enumerate(tensors):
            if t.datatype == "BYTES":
                # Checked before any model code is imported: the batch would fail at its first
                # assembly, after the server had loaded everything else.
                raise ConfigError(
                    f"{source}: {kind}s.{i}.datatype: {kind} '{t.name}' is BYTES, which wok's models cannot take "
                    "or return: they run on torch tensors, which hold no byte strings; send text as token ids "
                    "(INT64) or raw bytes as UINT8"
                )
    imported: dict[str, object] = {}
    dim_ranges: dict = {}
    if cfg.platform == "python":
        factory = _load_callable(cfg, model_dir, "factory", imported)
        try:
            made = factory(**cfg.parameters)
        except _LOAD_FAILURES as exc:
            raise ConfigError(
                f"{source}: factory {cfg.factory!r} failed with parameters {cfg.parameters}: {_failure(exc)}"
            ) from exc
        if isinstance(made, Servable):
            # A Servable carries a config of its own: serving it would silently drop this
            # model's config file (its name, inputs, batching, instances and weights).
            raise ConfigError(
                f"{source}: factory {cfg.factory!r}: expected an nn.Module as its result (a repository model is "
                f"configured by its config file); got a Servable (model '{made.name}' with its own config)"
            )
        if not isinstance(made, nn.Module):
            raise ConfigError(
                f"{source}: factory {cfg.factory!r}: expected an nn.Module as its result; got {type(made).__name__}"
            )
        module = made
    else:
        path = inside_model_dir(model_dir, cfg.model_file, source, "model_file")
        if not path.is_file():
            raise ConfigError(f"{source}: model_file {cfg.model_file!r}: {path} does not exist")
        _check_model_file(path, cfg)
        try:
            if cfg.platform == "torchscript":
                module = torch.jit.load(str(path), map_location="cpu")
            else:
                program = torch.export.load(str(path))
                module, dim_ranges, order = _exported_module(program, program.module(), cfg)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"{source}: model_file {cfg.model_file!r}: cannot load {cfg.platform} file {path}: {exc}"
            ) from None
    if cfg.weights:
        _load_weights(module, inside_model_dir(model_dir, cfg.weights, source, "weights"), cfg)
    check = _load_callable(cfg, model_dir, "check", imported) if cfg.check else None
    if cfg.platform != "torch_export":
        ids = _id_ranges(cfg, module, forward_order(module, [t.name for t in cfg.inputs]))
    elif order is not None:
        ids = _id_ranges(cfg, program, order)
    else:  # called with other structures than wok's tensors by position: which input is which is not read
        ids = IdRanges()
    return Servable(
        cfg,
        module,
        check=check,
        dim_ranges=dim_ranges,
        id_ranges=ids.rows,
        id_least={n: least for n, least in ids.least.items() if least < 0},
        id_bounds=ids.bounds,
    )


def _id_ranges(cfg: ModelConfig, model, order: list[str]) -> IdRanges:
    """The embedding tables the model's integer inputs reach (tables.id_ranges), said at the start with the
    inputs that reach one in a way not followed, which are not checked. A model with no integer input is not read
    (a python model's forward is not traced)."""
    dtypes = {t.name: torch_dtype(datatype(t.datatype)) for t in cfg.inputs}
    dtypes = {n: dt for n, dt in dtypes.items() if not dt.is_floating_point and dt != torch.bool}
    if not dtypes:
        return IdRanges()
    try:
        found = id_ranges(model, order, dtypes)
    except Exception as exc:  # a graph laid out otherwise than read: no check, not a failed start
        log.info(
            "model '%s': its inputs' ids are not checked against its embedding tables: its graph could not "
            "be read (%s)",
            cfg.name,
            error_line(exc),
        )
        return IdRanges()
    if found.rows or found.unclear:
        # Said only where some input is checked: of a model whose every input is "not checked", the line promised
        # refusals that never come.
        refused = " (a request with an id outside its input's range is refused, INVALID_ARGUMENT)" if found.rows else ""
        log.info("model '%s': integer inputs that reach embedding tables%s: %s", cfg.name, refused, found.said())
    return found


def _has_config(root: Path, folder: Path) -> bool:
    """Whether `folder` holds a config; where not, a warning names it, as a misnamed config (config.tml, a Triton
    config.pbtxt) or a folder this user may not read would otherwise skip a model unseen."""
    names = " or ".join(CONFIG_NAMES)
    try:
        if any((folder / n).is_file() for n in CONFIG_NAMES):
            return True
        triton = (folder / "config.pbtxt").is_file()
    except OSError as exc:
        # A folder this user may not search (a volume's root-owned lost+found, under a server not run as root):
        # is_file raises where it cannot look, and the start ended in a traceback.
        why = exc.strerror or error_line(exc)
        log.warning("model repository %s: folder %s cannot be read (%s); it is not served", root, folder.name, why)
        return False
    # A Triton user's first repository: the one config it has is named, and what to write in its place.
    pbtxt = " (its config.pbtxt is Triton's format, which wok does not read: write config.toml, as README.md shows)"
    told = pbtxt if triton else ""
    log.warning("model repository %s: folder %s has no %s%s; it is not served", root, folder.name, names, told)
    return False


def _model_folders(root: Path) -> list[Path]:
    """The folders of the repository at `root` that hold a model's config, by name; ConfigError where there are none."""
    try:
        if not root.exists():
            raise ConfigError(f"model repository {root} does not exist")
        if not root.is_dir():
            raise ConfigError(f"model repository {root} is not a folder")
        folders = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    except OSError as exc:  # a name too long for the file system, a folder that cannot be listed
        raise ConfigError(f"model repository {root} cannot be read: {exc.strerror or exc}") from None
    dirs = [d for d in folders if _has_config(root, d)]
    if not dirs:
        if any((root / n).is_file() for n in CONFIG_NAMES):
            raise ConfigError(
                f"model repository {root} has no model folders, but a config file of its own: it is a model's "
                "folder; give the folder above it, the repository, which holds one folder per model"
            )
        raise ConfigError(f"model repository {root} has no model folders (each needs {' or '.join(CONFIG_NAMES)})")
    return dirs


def _load(root: Path, folder: Path, cfg: ModelConfig | None = None) -> Servable:
    # Said before, not after: a model's code that hangs (a download, a lock) leaves the start
    # silent, and this line names the model it is in.
    log.info("model repository %s: loading %s", root, folder.name)
    return load_servable(folder, cfg)


def _two_named(source: str, first: ModelConfig, second: ModelConfig) -> ConfigError:
    return ConfigError(
        f"{source}: two models are named '{first.name}': {_source(first)} and {_source(second)}; "
        "expected one name per model"
    )


def load_model(root: Path, name: str) -> Servable:
    """The model named `name` of the repository at `root`, built alone (`wok profile`'s): every folder's config is
    read, for its name, and only the model's own folder is built, so that a sibling whose build fails, takes long or
    loads torch's dynamo (a torch.compile) leaves it as it is. Until 2026-12-07 the whole repository was built, as
    `wok serve` builds it. A folder whose config is refused is left out (its model's name unknown), unless it is
    the folder of that name, whose model `name` is then refused for it; ModelNotFound names the models found."""
    root = Path(root)
    found: list[tuple[Path, ModelConfig]] = []
    refused: dict[str, ConfigError] = {}
    for folder in _model_folders(root):
        try:
            cfg = load_model_config(folder)
        except ConfigError as exc:
            refused[folder.name] = exc
            continue
        found.append((folder, cfg))
    named = [(folder, cfg) for folder, cfg in found if cfg.name == name]
    if len(named) > 1:
        raise _two_named(str(root), named[0][1], named[1][1])
    if named:
        return _load(root, *named[0])
    if name in refused:
        raise refused[name]
    # A set: two siblings of one name (theirs to clash, not refused here) were listed twice.
    known = ", ".join(sorted({cfg.name for _, cfg in found})) or "(none)"
    unread = f" (and the folders whose config is refused: {', '.join(sorted(refused))})" if refused else ""
    raise ModelNotFound(f"unknown model {quoted_name(name)}; model repository {root} holds: {known}{unread}")


class ModelRepository:
    """The models a server serves, by name (one version each, "1")."""

    def __init__(self, servables: Iterable[Servable], source: str) -> None:
        self.source = source
        self.models: dict[str, Servable] = {}
        for s in servables:
            if s.name in self.models:
                raise _two_named(source, self.models[s.name].config, s.config)
            self.models[s.name] = s

    @classmethod
    def from_directory(cls, root: Path) -> ModelRepository:
        root = Path(root)
        return cls((_load(root, d) for d in _model_folders(root)), str(root))

    @classmethod
    def demo(cls, names: Iterable[str], **options) -> ModelRepository:
        from .models import build_demo

        def build(name: str) -> Servable:
            try:
                return build_demo(name, **options.get(name, {}))
            except (ValueError, TypeError) as exc:  # an unknown name, option or a bad value
                raise ConfigError(f"demo model {name!r}: {exc}") from None

        return cls((build(n) for n in names), "built-in demo models")

    def get(self, name: str, version: str = "") -> Servable:
        # The version first, as Triton reads it before it looks the model up: a version that is no integer is
        # INVALID_ARGUMENT whatever the name. (Tested here first: ModelInfer passes on every request.)
        odd = version not in ("", VERSION)
        if odd:
            check_version(version, name)
        s = self.models.get(name)
        if s is None:
            known = ", ".join(sorted(self.models)) or "(none)"
            raise ModelNotFound(f"unknown model {quoted_name(name)}; this server serves: {known}")
        if odd and version.lstrip("0") != VERSION:
            raise ModelNotFound(f"model '{name}' has no version {quoted_name(version)}; available: {VERSION}")
        return s


def check_version(version: str, name: str = "") -> None:
    """InvalidVersion unless `version` is '' or an integer of 0 to 2**63-1, as Triton reads a model version (an
    int64: "01" is version 1). Stricter than its std::stol, which reads " 1", "+1", "1.0" and "1abc" as 1. `name`,
    the model asked for, is named in the message when given."""
    if version in ("", VERSION):
        return
    digits = version.lstrip("0") or "0"
    if ascii_digits(version) and len(digits) <= _VERSION_DIGITS and int(digits) < 2**63:
        return
    asked = f"model {quoted_name(name)}: " if name else ""
    raise InvalidVersion(
        f"{asked}model version: expected an integer from 0 to 2**63-1 in decimal digits, or '' for the version "
        f"served ({VERSION}); got {quoted_name(version)}"
    )
