"""Small, named exceptions shared by every service; the API edge maps them to HTTP errors."""

from __future__ import annotations

#: How the error of a failure that is the evaluator's own (an engine that refused to start, a GPU
#: fault), not the submission's, begins. Only the evaluator writes errors, so an agent cannot forge it.
EVALUATOR_FAULT_PREFIX = "evaluator error"


class AutoRLError(Exception):
    """Base class. `str(err)` is a message for a person and names the fix."""


class UsageError(AutoRLError):
    """Bad command-line input: `autorl` prints it as one line and exits with code 2."""


class ConfigurationError(UsageError):
    """A setting is missing or unsafe; the service refuses to start. A setting is the user's input:
    `autorl` exits with code 2, as for any bad input."""


class UnknownTaskError(AutoRLError):
    """No task is registered under the given name."""


class ModelSourceError(AutoRLError):
    """A model source (hub id, local folder, builtin:NAME) cannot be resolved."""


class ModelSourceUnreachableError(ModelSourceError):
    """The hub could not be asked (network, outage): trying again later may succeed, unlike a model
    the hub says does not exist."""


class CheckpointError(AutoRLError):
    """A submitted checkpoint breaks one of the trust-model rules."""


class UnreadableCheckpointError(CheckpointError):
    """A submitted file or folder the grader may not read (no group permission on it)."""


class CostlyCheckpointError(CheckpointError):
    """A checkpoint refused after the grader began reading its weight data (its files changed while
    they were copied and hashed): the refusal cost the platform that read, so the grader counts it
    against the experiment's submission limit as it counts a submission."""


class MalformedCheckpointError(CheckpointError):
    """A submission's files made a check fail in a way none of its rules names (a value of a type
    or size no rule expected): refused all the same, before any weight data is read, so it costs
    what any such refusal costs (nothing). ``__cause__`` is the failure, for the platform's log."""


class InvalidRequestError(AutoRLError):
    """A well-formed request naming something it may not (a submission that is not scored)."""


class ForbiddenError(AutoRLError):
    """The caller may never do this (an agent setting its own baseline)."""


class NotFoundError(AutoRLError):
    """The experiment or submission does not exist (or is not visible to the caller)."""


class ConflictError(AutoRLError):
    """The request conflicts with the current state (an existing name, a finished experiment)."""


class DeadlineExceededError(AutoRLError):
    """The experiment's time budget is over."""


class SubmissionLimitError(AutoRLError):
    """The experiment reached its maximum number of submissions."""


class ServiceUnavailableError(AutoRLError):
    """Postgres or Redis cannot be reached, or the grader cannot take the request for now; retrying
    later may work. ``retry_after_s``, when given, is sent as the answer's ``Retry-After``."""

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EvaluationError(AutoRLError):
    """The evaluation backend failed; the submission is marked failed with this message."""
