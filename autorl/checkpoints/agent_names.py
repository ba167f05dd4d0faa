"""Names and values a submission chose (tensor names, file names, config values), as a refusal
shows them.

A refusal reaches the agent, the operator's terminal and the experiment's status; what the
submission named in it is data there. :func:`quoted` writes a name between single quotes, every
character that does not show as itself escaped (:func:`autorl.untrusted_text.printable`, a quote
as ``\\'``), in at most :data:`MAX_NAME_CHARS` characters; :func:`quoted_names` lists at most
:data:`MAX_NAMES_SHOWN` of them, then how many more there are; :func:`shown_value` writes a JSON
value as JSON, shortened the same way. A refusal's length so does not grow with what a file holds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from autorl.untrusted_text import printable, shortened

#: The most characters one name or value takes in a message (its quotes aside); a longer one is
#: cut between two characters, never inside an escape (:func:`autorl.untrusted_text.shortened`).
MAX_NAME_CHARS = 100
#: How many names one message lists before "and N more".
MAX_NAMES_SHOWN = 3


def _quoted_text(text: str) -> str:
    return printable(text).replace("'", "\\'")


def quoted(name: str) -> str:
    """``name`` between single quotes, escaped and shortened (see the module)."""
    return f"'{shortened(name, MAX_NAME_CHARS, _quoted_text)}'"


def quoted_names(names: Sequence[str], most: int = MAX_NAMES_SHOWN) -> str:
    """The first ``most`` of ``names``, each :func:`quoted`, then how many more there are."""
    listed = ", ".join(quoted(name) for name in names[:most])
    return f"{listed} and {len(names) - most} more" if len(names) > most else listed


def shown_value(value: object) -> str:
    """A JSON value (a config field, a header entry) as JSON, ASCII only, shortened (see the module)."""
    return shortened(json.dumps(value), MAX_NAME_CHARS, str)
