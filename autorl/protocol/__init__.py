"""The evaluation protocol (docs/PROTOCOL.md): what an agent is scored on during its budget
(:mod:`~autorl.protocol.feedback`), how sure a score is (:mod:`~autorl.protocol.statistics`), and
the experiment's one result on the test split (:mod:`~autorl.protocol.result`, chosen from the
store by :mod:`~autorl.protocol.final`)."""
