"""What every subcommand shares: the target, padding-row variant and device
options, resolved in one place, and one meaning for exit statuses (0 every
check held, 1 a target failed a check, 2 a usage or set-up error)."""

from __future__ import annotations

import argparse
import os

from .. import options
from ..failures import TargetUnavailable, UsageError
from ..options import DEVICE_ENV, add_to_argparse
from ..targets import Target, load_target, resolve_padding_rows, resolve_spec, use_device

PADDING_ROWS_OPTION = options.PADDING_ROWS_OPTION.cli


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    add_to_argparse(parser, options.TARGET_OPTION)
    add_padding_rows_argument(parser)
    add_device_argument(parser)


def add_padding_rows_argument(parser: argparse.ArgumentParser) -> None:
    add_to_argparse(parser, options.PADDING_ROWS_OPTION)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    add_to_argparse(parser, options.DEVICE_OPTION)


def choose_device(name: str | None) -> str:
    """The device from ``--device``, else ``$C128A_DEVICE``, else the default;
    prepared (Triton's interpreter on the CPU) before any kernel is imported."""
    return use_device(name or os.environ.get(DEVICE_ENV) or None)


def padding_rows_override(value: str | None) -> tuple[str | None, str]:
    """(variant, where it came from) from ``--padding-rows``, else
    ``$C128A_PADDING_ROWS``; (None, "declared by the target") when neither
    names one. A bad value is a usage error naming its origin."""
    return resolve_padding_rows(value, PADDING_ROWS_OPTION)


def load(
    spec: str | None, option: str = "--target", padding_rows: str | None = None
) -> tuple[Target, str]:
    """(target, where its spec came from): the option, else ``$C128A_TARGET``,
    else the default; held to the variant ``--padding-rows`` (``padding_rows``)
    or ``$C128A_PADDING_ROWS`` names, else the one it declares. A usage error
    names the origin."""
    spec, origin = resolve_spec(spec, option)
    variant, _ = padding_rows_override(padding_rows)
    try:
        return load_target(spec, variant), origin
    except (UsageError, TargetUnavailable) as exc:
        raise UsageError(f"{exc} (target from {origin})") from exc


def prepare(args: argparse.Namespace) -> tuple[str, Target, str]:
    """Choose the device, then load the target: (device, target, origin)."""
    device = choose_device(args.device)
    target, origin = load(args.target, padding_rows=getattr(args, "padding_rows", None))
    return device, target, origin
