"""What every subcommand shares: the target, padding-row variant and device
options, resolved in one place, and one meaning for exit statuses (0 every
check held, 1 a target failed a check, 2 a usage or set-up error)."""

from __future__ import annotations

import argparse
import os

from ..contract import PADDING_ROWS
from ..failures import TargetUnavailable, UsageError
from ..targets import (
    DEVICE_ENV,
    PADDING_ROWS_ENV,
    Target,
    load_target,
    resolve_padding_rows,
    resolve_spec,
    use_device,
)
from ..targets.specs import TARGET_ENV

PADDING_ROWS_OPTION = "--padding-rows"


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        metavar="SPEC",
        default=None,
        help=f"triton (default), triton-inert, reference, reference-inert, vllm, MODULE or "
        f"MODULE:ATTR; falls back to ${TARGET_ENV}",
    )
    add_padding_rows_argument(parser)
    add_device_argument(parser)


def add_padding_rows_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        PADDING_ROWS_OPTION,
        choices=PADDING_ROWS,
        default=None,
        help="hold the target to this padding-row variant: slots (a padding token's decode "
        "row holds real slot ids, vLLM 0.33/0.34) or inert (the row is -1 in every column "
        f"< W); default: ${PADDING_ROWS_ENV}, else what the target declares (slots where it "
        "declares none)",
    )


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help=f"default: ${DEVICE_ENV}, else CUDA when available, else the CPU under "
        "Triton's interpreter",
    )


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
