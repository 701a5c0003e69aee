"""aotrt/progress.py: steps are logged; shown as status lines only on a terminal."""

from __future__ import annotations

import io
import logging

import pytest

from aotrt import progress


class Terminal(io.StringIO):
    """A StringIO that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_step_logs_begin_and_end_with_the_time(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="aotrt.progress"):
        with progress.step("compiling 3 kernel(s)"):
            pass
    msgs = [(r.getMessage(), r.aotrt_progress) for r in caplog.records]
    assert msgs[0] == ("compiling 3 kernel(s) ...", "begin")
    assert msgs[1][0].startswith("compiling 3 kernel(s): ") and msgs[1][0].endswith(" s")
    assert msgs[1][1] == "end" and len(msgs) == 2


def test_a_failed_step_says_so_and_raises(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="aotrt.progress"):
        with pytest.raises(KeyError):
            with progress.step("lowering"):
                raise KeyError("x")
    assert [r.getMessage() for r in caplog.records] == ["lowering ...", "lowering: failed"]


def test_a_terminal_shows_status_lines_that_steps_overwrite() -> None:
    term = Terminal()
    level, propagate = progress.LOGGER.level, progress.LOGGER.propagate
    with progress.shown_on(term, prefix="x") as shown:
        assert shown
        with progress.step("capturing m"):
            assert term.getvalue() == "\r\x1b[Kx: capturing m ..."    # no newline yet
        with progress.step("lowering m"):
            pass
    out = term.getvalue()
    assert out.count("\n") == 2 and out.endswith(" s\n")
    assert "\r\x1b[Kx: capturing m: " in out and "\r\x1b[Kx: lowering m ..." in out
    # The logger is as it was: nothing shows after the block.
    assert progress.LOGGER.handlers == [] and progress.LOGGER.level == level
    assert progress.LOGGER.propagate == propagate
    with progress.step("later"):
        pass
    assert term.getvalue() == out


@pytest.mark.parametrize("stream", [io.StringIO(), object()], ids=["pipe", "no isatty"])
def test_anything_but_a_terminal_stays_quiet(stream: object) -> None:
    with progress.shown_on(stream) as shown:  # type: ignore[arg-type]
        assert not shown and progress.LOGGER.handlers == []
        with progress.step("compiling"):
            pass
    if isinstance(stream, io.StringIO):
        assert stream.getvalue() == ""


def test_a_closed_stream_stays_quiet() -> None:
    closed = open(__file__)  # noqa: SIM115 - closed at once on purpose
    closed.close()
    with pytest.raises(ValueError):
        closed.isatty()
    with progress.shown_on(closed) as shown:
        assert not shown
