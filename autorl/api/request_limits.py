"""How large one request to the grading API may be, how long it may take to arrive and how many
connections a client may hold, and what a client is told past each limit.

Both doors an agent's request can come through apply the size limits: the relay that forwards the
agent API into the sandbox (``autorl run``) and the grader's own server (on a cluster agents reach
it directly). Defined once, so the two never disagree on what is too large or on what the client
reads. The relay holds each sandbox to :data:`MAX_AGENT_CONNECTIONS`; the grader's server holds
every client to :data:`REQUEST_READ_S`, :data:`ANSWER_WRITE_S` and the connection caps. A refusal
is the grader's usual JSON (``detail`` and ``error``, the same text naming the limit and the fix),
never a reset connection.
"""

from __future__ import annotations

import h11

#: The most a request body may hold. Every body the API takes is a small JSON object (a submit
#: holds a checkpoint's path, never its files; the largest, an experiment's registration or the
#: message of its end, about 110 KB at most written all in escapes), so anything larger is refused
#: unread.
MAX_BODY_BYTES = 128 * 1024
#: The most an agent's request body may hold: its largest is a submit's ``model_path`` (at most 4,096
#: bytes, under 13 KB as JSON escapes). An agent's body is parsed on the server's one event loop before
#: its token is checked: with 1 MiB bodies of zeros, within its fair share, one agent held another
#: experiment's requests for hundreds of milliseconds (1 MiB took 31-35 ms to parse; this, about 0.5 ms).
MAX_AGENT_BODY_BYTES = 16 * 1024
#: The most a request line and its headers may take.
MAX_HEADER_BYTES = 64 * 1024
#: After a refusal that closes the connection, what the client is still sending (the rest of a
#: large body) is read and dropped for at most this long and this much, so that the client reads
#: the answer rather than a reset; past either, the connection is closed anyway.
DRAIN_S = 5.0
DRAIN_BYTES = 64 << 20

#: How long the grader waits for one whole request (line, headers and body), counted from when it
#: begins to wait for it: the connection opened, or the previous answer on it sent. A request within
#: the size limits arrives in well under a second from any client that sends it at once, as HTTP
#: client libraries do; 30 s leaves a loaded or paused client ample room, and bounds how long a client
#: that stalls, or trickles its bytes, holds a connection and up to a body's worth of memory. Past it
#: the answer is 408 and the connection closes. (Waiting for an answer, a blocking /submit, is not
#: reading the request: it is not counted.)
REQUEST_READ_S = 30.0
#: How long what the grader writes to a connection (an answer, a refusal) may wait in its buffer for
#: the client to read it, counted from each write: the socket takes what fits at once, the rest waits
#: for the client. A client that reads its answers takes the largest (an agent's GET /scores) in well
#: under a second, and 30 s leaves a loaded or paused one ample room; a client that never read them
#: (a zero receive window), or trickled them, kept its connection and the whole unsent answer in the
#: grader's memory for as long as it liked (20 such connections each with an unread 28 MB answer
#: grew the grader from 29 to 639 MiB, still held 25 s later). Past it the connection is aborted and
#: its unsent bytes dropped.
ANSWER_WRITE_S = 30.0
#: The most connections the grader's server holds at once on each port it listens on; the agent
#: port and the admin port are counted apart, so agents that fill the agent port leave the admin
#: port to the controller. A connection holds at most one request while it is read: the head and
#: body limits above plus a read's worth, at most 256 KiB, so both ports full hold at most 128 MiB,
#: inside the chart's 2 GiB limit with the grader's own use (about 100 MiB idle, and the submit
#: path's allowance of 700 MiB in tests/integration/test_submit_burst.py) beside it. An
#: answer the client does not read is held besides, for at most ANSWER_WRITE_S; an agent's largest,
#: its GET /scores, grows with its submissions, each carrying at most its model_path
#: (autorl.api.request_bodies) and a bounded list of ignored files (autorl.checkpoints.snapshot).
MAX_CONNECTIONS = 256
#: The most connections one sandbox's agent holds open to the grading API at once: the sandbox's
#: relay accepts no more (and forwards each over one connection of its own to the grader).
MAX_AGENT_CONNECTIONS = 64
#: The most connections one client address holds at once on one port of the grader, so that one
#: agent never takes every slot from other experiments' agents or from the controller: at least four
#: addresses are needed to fill a port. On a cluster each agent pod has an address of its own and
#: gets what the relay allows an agent; on one machine (``autorl run``: a single-port grader that the
#: relay and the run's own admin client both reach from 127.0.0.1) the 16 above the relay's cap keep
#: the run's own requests served while the agent uses all of its relay's connections.
MAX_CONNECTIONS_PER_CLIENT = MAX_AGENT_CONNECTIONS + 16
#: The most connections one address holds at once on the agent port of a grader with an admin port
#: of its own (a cluster's: each agent pod has an address of its own): an experiment's agent has at
#: most its fair share of requests in flight (8) and a few more waiting, and sixteen experiments are
#: needed to fill the port (with 80 an address, four agents holding idle connections refused every
#: other experiment's for as long as they kept reopening them).
MAX_AGENT_PORT_CONNECTIONS_PER_CLIENT = MAX_CONNECTIONS // 16
#: New connections one client address may open a second, on average, on the agent port of a grader
#: with an admin port of its own (bursts of MAX_CONNECTIONS_PER_CLIENT). A request charged to a fair
#: share is paced only while its client waits for the answer; one that cannot be parsed is answered
#: before any is charged: without this, a client opening a connection for each (answered or not)
#: made the grader serve about 4,000 of them a second. Past it a new connection is closed
#: unanswered. A client that keeps its connections, or opens one for each request within its fair
#: share (10 a second), never meets it.
NEW_CONNECTIONS_PER_S = 20.0
#: The Retry-After of a connection refused over a cap: connections free as requests are answered
#: and their answers read: a connection waits at most REQUEST_READ_S for a request and
#: ANSWER_WRITE_S for the client to read what was written to it (a refused one at most DRAIN_S).
RETRY_AFTER_S = 5

HEADERS_TOO_LARGE = (
    f"the request line and headers are over the grading API's limit of {MAX_HEADER_BYTES} bytes; "
    "send only the Authorization and Content-Type headers the API needs"
)


def body_too_large(limit: int) -> str:
    """The reason of a request whose body is over ``limit`` bytes (413)."""
    return (
        f"the request body is over the grading API's limit of {limit} bytes; its bodies are small JSON "
        'objects: to submit, send only the checkpoint\'s path, as {"model_path": "output/v1"}'
    )


def request_too_slow(read_s: float = REQUEST_READ_S) -> str:
    """The reason of a request that was not received whole within ``read_s`` seconds (408)."""
    return (
        f"the request did not arrive whole within the grading API's limit of {read_s:g} s; send the "
        "request line, headers and body at once, as an HTTP client library does, on a new connection"
    )


def too_many_connections(limit: int, *, per_client: bool) -> str:
    """The reason of a connection refused over a cap (503): one address's, or one port's."""
    held = (
        f"your address already holds {limit} connections to the grader, the grading API's limit per address"
        if per_client
        else f"the grader already holds {limit} connections on this port, its limit"
    )
    return (
        f"{held}; retry after the Retry-After header's seconds, and close connections you no longer "
        "use (send each request at once: one not received whole in time is refused)"
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
