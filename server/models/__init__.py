"""The built-in demo models, served when no model repository is given.

Importing this package imports no torch: `wok serve` refuses an unknown demo model name, or an
unknown option of one, before seconds of imports. A model's module (torch with it) is imported
when its builder is looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from ..errors import quoted_name

if TYPE_CHECKING:
    from ..servable import Servable


class _Builders(Mapping[str, "Callable[..., Servable]"]):
    """Demo model name -> its `build`, each given as "module:function" within this package and
    imported on first look-up. Membership, iteration and `get` of an unknown name import nothing."""

    def __init__(self, refs: dict[str, str]) -> None:
        self._refs = refs

    def __getitem__(self, name: str) -> Callable[..., Servable]:
        module, _, function = self._refs[name].partition(":")
        return getattr(importlib.import_module(f".{module}", __name__), function)

    def __contains__(self, name: object) -> bool:
        # Mapping's own would look the builder up, importing it.
        return name in self._refs

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)


DEMO_MODELS: Mapping[str, Callable[..., Servable]] = _Builders(
    {"mlp": "mlp:build", "recsys": "recsys:build", "encoder": "encoder:build"}
)

# Each builder's keywords and their types, in its signature's order, for `--demo-option` to check
# without importing the builder (torch); tests/server/test_config.py holds them to the signatures.
_SIZES = {"max_batch_size": int, "max_queue_delay_ms": float, "max_queue_size": int}
DEMO_OPTIONS: Mapping[str, Mapping[str, type]] = {
    "mlp": {"in_features": int, "hidden": int, "out_features": int, "layers": int, **_SIZES},
    "recsys": {"num_embeddings": int, "dim": int, "dense_features": int, "hidden": int, **_SIZES},
    "encoder": {
        "vocab": int,
        "max_length": int,
        "d_model": int,
        "nhead": int,
        "layers": int,
        "dim_feedforward": int,
        **_SIZES,
    },
}


def check_demo_name(name: str) -> None:
    """Raise ValueError unless `name` is a demo model; imports no model (nor torch)."""
    if name not in DEMO_MODELS:
        raise ValueError(f"unknown demo model {quoted_name(name)}; known: {', '.join(DEMO_MODELS)}")


def build_demo(name: str, **options) -> Servable:
    """Build the demo model `name` with its size options (keywords of its `build`)."""
    check_demo_name(name)
    return DEMO_MODELS[name](**options)


__all__ = ["DEMO_MODELS", "DEMO_OPTIONS", "build_demo", "check_demo_name"]
