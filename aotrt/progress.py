"""Progress of long steps (an export, a first load's kernel compile), for a person watching.

Library code reports a step with `step(...)`; that only logs to the "aotrt.progress" logger
(at INFO, so nothing shows by default). A front end that wants a status line, the CLI,
wraps its work in `shown_on(sys.stderr)`, which shows the steps only when that stream is a
terminal: piped or redirected output stays quiet.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import IO, Iterator

__all__ = ["LOGGER", "step", "TerminalHandler", "shown_on"]

#: the logger every progress record goes to
LOGGER = logging.getLogger("aotrt.progress")


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Report `what` as begun, then as done with its duration (or as failed)."""
    LOGGER.info("%s ...", what, extra={"aotrt_progress": "begin"})
    t0 = time.perf_counter()
    try:
        yield
    except BaseException:
        LOGGER.info("%s: failed", what, extra={"aotrt_progress": "end"})
        raise
    LOGGER.info("%s: %.1f s", what, time.perf_counter() - t0, extra={"aotrt_progress": "end"})


class TerminalHandler(logging.Handler):
    """Writes progress to a terminal: a begun step as a status line that its end overwrites."""

    def __init__(self, stream: IO[str], prefix: str = "aotrt") -> None:
        super().__init__(logging.INFO)
        self.stream = stream
        self.prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        """Draw `record`: begin without a newline (the end replaces it), end with one."""
        try:
            text = f"{self.prefix}: {record.getMessage()}"
            # \r and erase-line: the end of a step replaces its status line in place.
            end = "" if getattr(record, "aotrt_progress", "end") == "begin" else "\n"
            self.stream.write(f"\r\x1b[K{text}{end}")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging's contract: a display error is reported
            self.handleError(record)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


@contextlib.contextmanager
def shown_on(stream: IO[str], prefix: str = "aotrt") -> Iterator[bool]:
    """Show progress on `stream` within the block when it is a terminal; yields whether."""
    if not _is_terminal(stream):
        yield False
        return
    handler = TerminalHandler(stream, prefix)
    level, propagate = LOGGER.level, LOGGER.propagate
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    # Shown here, so not also through the root logger's handler (under --verbose).
    LOGGER.propagate = False
    try:
        yield True
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)
        LOGGER.propagate = propagate
