"""Structured one-line logs; access logs never show an agent's token."""

from __future__ import annotations

import logging
import re

from autorl.untrusted_text import PrintableArgs

CAPABILITY_PATH = re.compile(r"/a/[^/\s\"?]+")


def redact(text: str) -> str:
    return CAPABILITY_PATH.sub("/a/<redacted>", text)


class RedactTokens(logging.Filter):
    """Rewrites capability URLs in a record's message and arguments (uvicorn's access log passes the
    path as an argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


#: uvicorn's loggers format with uvicorn's own formatter: their arguments are escaped here.
_UVICORN_LOGGERS = ("uvicorn.access", "uvicorn.error")


def install_redaction() -> None:
    """Tokens redacted, and arguments escaped so that an agent's string cannot forge a line: the
    grader's own records are escaped whole by the formatter ``autorl grader`` logs through
    (:func:`autorl.untrusted_text.log_printable_lines`), uvicorn's arguments by a filter."""
    for name in (*_UVICORN_LOGGERS, "autorl", "autorl.grader", "autorl.grader.reconciler"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in logger.filters):
            logger.addFilter(RedactTokens())
            if name in _UVICORN_LOGGERS:
                logger.addFilter(PrintableArgs())
