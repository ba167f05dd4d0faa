"""What an agent may read of a failed evaluation.

Once the test split is loaded, an exception's text can carry test data: a chat template that
raises with the last message, a tokenizer error quoting its input, a log line of OpenCompass. So
after that point the agent is told only what the evaluator's own code chose to say: the message
of a :class:`PublicEvaluationError` (written by this package, quoting nothing of the test split),
a fixed sentence for a failing chat template, or :data:`GENERIC_FAILURE`. The full error goes to
the evaluator's own storage (``EVAL_DIR/submissions/<id>/error.txt``) and its log names only the
exception's type.
"""

from __future__ import annotations

import errno

from autorl.checkpoints.chat_template import ChatTemplateError
from autorl.errors import EVALUATOR_FAULT_PREFIX, EvaluationError


def evaluator_fault_message(message: str) -> str:
    """What an agent reads of a failure that is the evaluator's: it says so, and that it does not
    count against the submission limit (the prefix the store counts by), then ``message``."""
    return (
        f"{EVALUATOR_FAULT_PREFIX} (not your checkpoint's fault; it does not count against your "
        f"submission limit, and an operator has the details): {message}"
    )


GENERIC_FAILURE = (
    "the evaluation failed after the test data was loaded; the details stay in the evaluator's log "
    "because they may quote test problems. Check that the checkpoint loads with "
    "AutoModelForCausalLM.from_pretrained(path) and generates from the prompt of a train question "
    "(task.render_prompt), or ask an operator"
)
#: The template rendered is the base model's, never the submission's: its failure is the platform's.
#: Fixed text: the error itself may quote a test prompt, so it stays in evaluator storage.
TEMPLATE_FAILURE = evaluator_fault_message(
    "the base model's chat template, which the platform renders every test prompt with, failed on a "
    "test prompt or could not be rendered; a submission's own template is never used, so submitting "
    "again will not help until an operator fixes the evaluator or the experiment's base model"
)

#: The evaluator's own fault: it does not count against the submission limit, and a sealed final
#: that fails so is made again.
STORAGE_FULL = (
    f"{EVALUATOR_FAULT_PREFIX} (not your checkpoint's fault; it does not count against your submission "
    "limit): the evaluator's storage is full (no space left on its disk), so this submission was not "
    "scored; submit it again once an operator has freed space in the evaluator's storage (AUTORL_EVAL_DIR)"
)
#: Errors of a full disk or quota, or a file size limit.
STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class PublicEvaluationError(EvaluationError):
    """A failure whose message is the evaluator's own text, safe to show the agent; ``detail``
    (logs, tracebacks) stays in evaluator storage."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class EvaluatorFaultError(PublicEvaluationError):
    """The evaluator failed, not the submission (its architecture is the base model's, checked at
    submit): the agent is told so, and the submission does not count against its limit."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(evaluator_fault_message(message), detail)


def storage_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in STORAGE_FULL_ERRNOS


def setup_message(exc: BaseException) -> str:
    """What the agent is told about ``exc``, raised before the test split was loaded: the set-up
    (the snapshot, the recorded config, the task, the split) reads nothing the agent wrote after
    the grader's checks, so its failure is the evaluator's and does not count against the limit.
    Fixed text and the error's type only: loading the split may raise with its contents (a seed, a
    row) or the evaluator's paths in the error; the whole error goes to evaluator storage."""
    if storage_full(exc):
        return STORAGE_FULL
    return evaluator_fault_message(
        f"the evaluation could not be set up ({type(exc).__name__}), before the checkpoint ran; "
        "submit it again once an operator has fixed the evaluator"
    )


def agent_message(exc: BaseException) -> str:
    """What the agent is told about ``exc``, raised after the test split was loaded."""
    if storage_full(exc):
        return STORAGE_FULL
    if isinstance(exc, PublicEvaluationError):
        return str(exc)
    if isinstance(exc, ChatTemplateError):
        return TEMPLATE_FAILURE
    return GENERIC_FAILURE


def operator_detail(exc: BaseException) -> str:
    """Everything about ``exc``, for evaluator storage only."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, PublicEvaluationError) and exc.detail:
        text += "\n" + exc.detail
    return text
