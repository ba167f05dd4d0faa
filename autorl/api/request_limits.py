"""How large one request to the grading API may be, and what a client is told when it is larger.

Both doors an agent's request can come through apply these: the relay that forwards the agent
API into the sandbox (``autorl run``) and the grader's own server (on a cluster agents reach it
directly). Defined once, so the two never disagree on what is too large or on what the client
reads. A refusal is the grader's usual JSON (``detail`` and ``error``, the same text naming the
limit and the fix), never a reset connection.
"""

from __future__ import annotations

import h11

#: The most a request body may hold. Every body the API takes is a small JSON object (a submit
#: holds a checkpoint's path, never its files), so anything larger is refused unread.
MAX_BODY_BYTES = 1 << 20
#: The most a request line and its headers may take.
MAX_HEADER_BYTES = 64 * 1024
#: After a refusal that closes the connection, what the client is still sending (the rest of a
#: large body) is read and dropped for at most this long and this much, so that the client reads
#: the answer rather than a reset; past either, the connection is closed anyway.
DRAIN_S = 5.0
DRAIN_BYTES = 64 << 20

BODY_TOO_LARGE = (
    f"the request body is over the grading API's limit of {MAX_BODY_BYTES} bytes; its bodies are small "
    'JSON objects: to submit, send only the checkpoint\'s path, as {"model_path": "output/v1"}'
)
HEADERS_TOO_LARGE = (
    f"the request line and headers are over the grading API's limit of {MAX_HEADER_BYTES} bytes; "
    "send only the Authorization and Content-Type headers the API needs"
)


def unparsable_request(status_hint: int, reason: str) -> tuple[int, str]:
    """The status and reason for bytes that are not an HTTP/1.1 request, from the parser's
    (h11's) status hint and message: a header block over the limit is 431, the rest 400."""
    if status_hint == 431:
        return 431, HEADERS_TOO_LARGE
    return status_hint, f"not a valid HTTP/1.1 request ({reason}); send it with an HTTP client library"


class RequestParser(h11.Connection):
    """h11's server side, with :data:`MAX_HEADER_BYTES` as a hard limit on each request's line and
    headers: h11's own limit counts only a head still incomplete, so one that arrives whole in a
    single read passes at any size. A head over the limit raises h11's error for it (status hint
    431), once parsed, so the answer can be sent as to any request."""

    def __init__(self) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        before = len(self.trailing_data[0]) if self.their_state is h11.IDLE else 0
        event = super().next_event()
        if isinstance(event, h11.Request) and before - len(self.trailing_data[0]) > MAX_HEADER_BYTES:
            raise h11.RemoteProtocolError("the request line and headers are too long", error_status_hint=431)
        return event
