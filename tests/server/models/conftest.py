"""Built demo models, shared by the tests of a module (building them takes a moment)."""

from __future__ import annotations

import pytest

from wok.models import build_demo
from wok.servable import Servable


@pytest.fixture(scope="module")
def mlp() -> Servable:
    return build_demo("mlp")


@pytest.fixture(scope="module")
def recsys() -> Servable:
    return build_demo("recsys")


@pytest.fixture(scope="module")
def encoder() -> Servable:
    return build_demo("encoder")
