"""What an agent is scored on during its budget, and the split an evaluation scores: the values
every surface spells (the API, the CRD, the CLI, the store, results.csv) are these."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import WithJsonSchema


class Feedback(enum.StrEnum):
    """What an agent is scored on during its budget (docs/PROTOCOL.md)."""

    TEST = "test"  # every submission on the test split (the reference's behaviour)
    SEALED = "sealed"  # every submission on a validation split; one final evaluation on test

    @property
    def scored_split(self) -> Split:
        """The split the agent's submissions are scored on during the budget."""
        return Split.VALIDATION if self is Feedback.SEALED else Split.TEST


class Split(enum.StrEnum):
    """The split an evaluation scores."""

    TEST = "test"
    VALIDATION = "validation"


#: The feedback modes, as a command line's choices.
FEEDBACK_MODES = tuple(mode.value for mode in Feedback)

#: The feedback mode as a model's field: its schema inline, as the enum of its values (the CRD's
#: structural schema takes no ``$ref``; a wrong value is refused naming them).
FeedbackField = Annotated[Feedback, WithJsonSchema({"enum": list(FEEDBACK_MODES), "type": "string"})]
