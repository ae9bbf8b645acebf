"""What `cifar-ray report` accepts, checked before the report's imports (pandas, matplotlib: seconds) so that a bad
option is refused at once: the formats, and a target test accuracy."""

from __future__ import annotations

from .errors import ConfigError
from .sweep import target_refusal

FORMATS = ("md", "csv", "json", "html")


def check_report_options(fmt: str, target: float | None) -> None:
    """Raises ConfigError, in one line, for a format not in FORMATS or a target that is no test accuracy."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown report format '{fmt}'; allowed: {', '.join(FORMATS)}")
    if target is not None and (refusal := target_refusal(target)):
        raise ConfigError(f"--target: {refusal}")
