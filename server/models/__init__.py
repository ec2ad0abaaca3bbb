"""The built-in demo models, served when no model repository is given."""

from __future__ import annotations

from collections.abc import Callable

from ..servable import Servable
from . import encoder, mlp, recsys

DEMO_MODELS: dict[str, Callable[..., Servable]] = {
    "mlp": mlp.build,
    "recsys": recsys.build,
    "encoder": encoder.build,
}


def build_demo(name: str, **options) -> Servable:
    """Build the demo model `name` with its size options (keywords of its `build`)."""
    builder = DEMO_MODELS.get(name)
    if builder is None:
        raise ValueError(f"unknown demo model {name!r}; known: {', '.join(DEMO_MODELS)}")
    return builder(**options)


__all__ = ["DEMO_MODELS", "build_demo"]
