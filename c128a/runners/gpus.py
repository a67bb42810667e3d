"""The former home of GPU pinning, kept so that code importing
``c128a.runners.gpus`` still works: it is :mod:`c128a.gpu.pinning`."""

from __future__ import annotations

from ..gpu.pinning import *  # noqa: F403 - this module is pinning under its former name
