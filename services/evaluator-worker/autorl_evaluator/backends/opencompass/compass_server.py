"""A warm OpenCompass: its modules imported once, one forked process per evaluation.

An OpenCompass run of the ``opencompass`` command is three Python processes (the command, its
inference task, its evaluation task), and each imports OpenCompass anew: seconds of every
evaluation, more than a resident engine takes to answer the whole split. In the warm worker
(``AUTORL_EVAL_WARM_WORKER``) the worker runs this program once in OpenCompass's own Python; it
imports OpenCompass's command and what a GSM8K run uses, then waits. For each evaluation it forks:
the child runs OpenCompass's own command-line entry (``opencompass.cli.main.main``) on the
worker's config with ``--debug``, OpenCompass's mode that runs its tasks in its own process, so
the prompts, the inference task, the evaluation task and the summary are OpenCompass's, run by
the modules already in memory. Nothing of a submission ever reaches this process: the child gets
the run's folder, arguments and environment, and exits when the run ends.

The child is a process group and session of its own (the worker ends it and everything it
started on a timeout, as it ends the ``opencompass`` command's group) and dies with this
process. This process is a child subreaper (``PR_SET_CHILD_SUBREAPER``): what a run started and
left behind, even in a group or session of its own, is handed to it when its parent ends. It runs
one run at a time, so once a run's child has ended, every process still under the server is a
leftover of that run: it gets SIGTERM, SIGKILL five seconds later, and is reaped before the run's
end is reported; when the server is ended, everything under it is ended at once (SIGTERM, then
SIGKILL). Requests, one JSON object per connection on a Unix socket in a 0700 folder:

- ``{"op": "run", "argv": [...], "cwd": DIR, "env": {...}, "log": FILE}``: answered with
  ``{"pid": N}`` when the child exists, then ``{"returncode": N, "survivors": [...]}`` when it
  and what it left have ended (survivors: those still alive after SIGKILL);
- ``{"op": "ping"}``: ``{"ok": true}``.

It needs the standard library, the worker's ``json_lines.py`` (loaded by its path) and OpenCompass
only (it runs in OpenCompass's environment).

    PYTHON compass_server.py --socket PATH
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autorl_evaluator import json_lines
else:  # OpenCompass's Python has none of our packages
    _spec = importlib.util.spec_from_file_location(
        "autorl_json_lines", Path(__file__).resolve().parents[2] / "json_lines.py"
    )
    json_lines = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(json_lines)

#: Largest request accepted (arguments and an environment).
MAX_REQUEST_BYTES = 1024 * 1024
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: After SIGTERM, how long what a run left behind gets before SIGKILL.
KILL_GRACE_S = 5.0
#: How long SIGKILLed processes get to go before they are reported as survivors.
REAP_WAIT_S = 10.0

#: The server's folder (its socket's, its home's), removed when the server is ended.
_folder: Path | None = None


def preload() -> None:
    """OpenCompass's command and the modules a GSM8K run imports (datasets, models, tasks,
    evaluators, summarizers), so that a forked run imports nothing it can share. Nothing here
    starts CUDA; importing torch and pyarrow starts a few threads of theirs, which a forked process
    does not have (it is one thread)."""
    import opencompass.cli.main
    import opencompass.datasets
    import opencompass.models
    import opencompass.openicl
    import opencompass.summarizers
    import opencompass.tasks  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    unformatted_config_dumps()
    length_checks_within_bounds()
    plain_role_copies()
    prompts_parsed_once()


def unformatted_config_dumps() -> None:
    """OpenCompass writes its config to files as a run goes (the whole config once, each task's
    before the task runs, in this process with ``--debug``), and mmengine lays each file's text out
    with yapf: most of a warm run's own time, seconds per evaluation (docs/PERFORMANCE.md). A run
    here dumps the same Python unformatted: the same config when read back, only its layout
    differs."""
    from mmengine.config import Config

    formatted_dump = Config.dump
    if getattr(formatted_dump, "unformatted", False):
        return

    def dump(self: Any, file: Any = None) -> Any:
        object.__setattr__(self, "_format_python_code", False)  # Config's own setattr is its dict's
        return formatted_dump(self, file)

    dump.unformatted = True  # type: ignore[attr-defined]
    Config.dump = dump


#: OpenCompass's chat models whose ``get_token_len`` renders the chat template and counts its
#: tokens (``add_special_tokens=False``): those :func:`token_bound` reads.
CHAT_MODELS = ("VLLMwithChatTemplate", "HuggingFacewithChatTemplate")
#: Normalizers a token bound is known for: the most UTF-8 bytes a normalized text has per byte
#: of its source (Unicode's maximum expansion factors, UAX #15).
NORMALIZER_EXPANSION = {None: 1, "NFC": 3, "NFD": 3, "NFKC": 11, "NFKD": 11}
#: Pre-tokenizers that only split the text (no character added) beside the byte-level one.
SPLITTING_PRE_TOKENIZERS = ("Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit")


def byte_expansion(tokenizer: Any) -> int | None:
    """For a tokenizer whose every token covers at least one byte of the normalized text (a fast
    tokenizer: byte-level BPE, pre-tokenizers that only split, no space added in front), the most
    tokens a text gets per UTF-8 byte of its source: its normalizer's expansion factor; None for
    any other tokenizer."""
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    # Each part's own description (the whole tokenizer's, its vocabulary with it, is megabytes).
    normalizer = json.loads(backend.normalizer.__getstate__()) if backend.normalizer is not None else None
    if normalizer is not None and set(normalizer) != {"type"}:
        return None
    expansion = NORMALIZER_EXPANSION.get(normalizer and normalizer["type"])
    pre = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    byte_level = [step for step in steps if step.get("type") == "ByteLevel"]
    if (
        expansion is None
        or type(backend.model).__name__ != "BPE"
        or len(byte_level) != 1
        or byte_level[0].get("add_prefix_space")
        or any(step.get("type") not in ("ByteLevel", *SPLITTING_PRE_TOKENIZERS) for step in steps)
    ):
        return None
    return expansion


def token_bound(model: Any, template: Any) -> int | None:
    """At least the token count OpenCompass's ``model.get_token_len_from_template(template,
    mode='gen')`` gives, without tokenizing: the same chat template rendered the same way, its UTF-8
    bytes (times the tokenizer's :func:`byte_expansion` where some are not ASCII). None where that
    bound is not known."""
    if type(model).__name__ not in CHAT_MODELS:
        return None
    cache = model.__dict__.setdefault("_autorl_byte_expansion", {})
    tokenizer = model.tokenizer
    if id(tokenizer) not in cache:
        cache.clear()
        cache[id(tokenizer)] = byte_expansion(tokenizer)
    expansion = cache[id(tokenizer)]
    if expansion is None:
        return None
    from opencompass.utils.prompt import PromptList

    parsed = model.parse_template(template, mode="gen")
    if isinstance(parsed, list) and not isinstance(parsed, PromptList):  # a batch: counted as asked
        return None
    convert = sys.modules[type(model).__module__]._convert_chat_messages
    prompt = str(parsed)
    rendered = tokenizer.apply_chat_template(convert([prompt])[0], add_generation_prompt=True, tokenize=False)
    if not isinstance(rendered, str):
        return None
    # ASCII is the same text under each of those normalizers: one byte a character.
    return len(rendered) if rendered.isascii() else expansion * len(rendered.encode("utf-8"))


def length_checks_within_bounds() -> None:
    """OpenCompass's GSM8K inference counts the tokens of every prompt to see whether it fits the
    model's ``max_seq_len`` (dropping in-context examples until it does): rendering and tokenizing
    the whole 4-shot prompt once per problem, most of a warm run's own time on the CPU
    (docs/PERFORMANCE.md). A run here asks the count only of a prompt whose :func:`token_bound` is
    over ``max_seq_len``: where the bound fits, so does the count, so the same prompts are kept, the
    same examples dropped."""
    from opencompass.openicl.icl_inferencer.icl_gen_inferencer import GenInferencer

    original = GenInferencer.get_generation_prompt_list_from_retriever_indices
    if getattr(original, "bounded", False):
        return

    def prompt_list(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = self.model
        max_seq_len = kwargs.get("max_seq_len", args[3] if len(args) > 3 else None)
        if max_seq_len is None or "get_token_len_from_template" in model.__dict__:
            return original(self, *args, **kwargs)
        exact = model.get_token_len_from_template

        def count(templates: Any, mode: str = "ppl") -> Any:
            # Only compared with max_seq_len: a bound within it gives the comparison's answer.
            bound = token_bound(model, templates) if mode == "gen" else None
            return bound if bound is not None and bound <= max_seq_len else exact(templates, mode=mode)

        model.get_token_len_from_template = count
        try:
            return original(self, *args, **kwargs)
        finally:
            del model.get_token_len_from_template

    prompt_list.bounded = True  # type: ignore[attr-defined]
    GenInferencer.get_generation_prompt_list_from_retriever_indices = prompt_list


#: Values ``copy.deepcopy`` returns as they are.
_ATOMS = (str, int, float, bool, type(None))


def _atoms_only(table: dict[Any, Any]) -> bool:
    return all(type(key) in _ATOMS and type(item) in _ATOMS for key, item in table.items())


def plain_copy(value: Any, memo: Any = None) -> Any:
    """``copy.deepcopy(value)``, without its general machinery for a dict of such values or of
    dicts of them (a prompt template's role table): plain dicts copied, the rest shared, as deepcopy
    shares them. Anything else goes to ``copy.deepcopy``."""
    import copy

    if type(value) is dict and memo is None:
        copied: dict[Any, Any] = {}
        for key, item in value.items():
            if type(key) in _ATOMS and type(item) in _ATOMS:
                copied[key] = item
            elif type(key) in _ATOMS and type(item) is dict and _atoms_only(item):
                copied[key] = dict(item)
            else:
                return copy.deepcopy(value)
        return copied
    return copy.deepcopy(value, memo)


def plain_role_copies() -> None:
    """OpenCompass's prompt templates copy their role table with ``copy.deepcopy`` for every round
    of every prompt, several times per prompt (five 4-shot rounds, three parses of each prompt in a
    GSM8K inference): a second of a warm run's own time on the CPU for the split. A run here copies
    a table of strings as deepcopy would, by :func:`plain_copy`."""
    import opencompass.models.base as base
    import opencompass.models.base_api as base_api

    for module in (base, base_api):
        module.deepcopy = plain_copy


def _plain_items(items: Any, *, any_dict: bool = False) -> Any:
    """A copy of a parsed prompt (a string, or a list of strings and dicts of plain values) whose
    dicts are new; None for anything else. ``any_dict``: a dict of a subclass (a config's) is
    copied as a plain dict (a copy to compare with, not to hand out)."""
    if isinstance(items, str):
        return items
    copied: list[Any] = []
    for item in items:
        if type(item) is str:
            copied.append(item)
        elif (type(item) is dict or (any_dict and isinstance(item, dict))) and _atoms_only(item):
            copied.append(dict(item))
        else:
            return None
    return type(items)(copied)


def prompts_parsed_once() -> None:
    """OpenCompass parses each prompt with the model's meta template three times in a GSM8K
    inference (for its length check, for the predictions file, for generation), the same prompt
    object each time. A run here parses a prompt once per mode and hands each later call a copy of
    that parse, as long as the prompt still equals what was parsed (``parse_template`` reads only
    the prompt and the template)."""
    from opencompass.models.base_api import APITemplateParser
    from opencompass.utils.prompt import PromptList

    original = APITemplateParser.parse_template
    if getattr(original, "once", False):
        return

    def parse_template(self: Any, prompt_template: Any, mode: str) -> Any:
        if type(prompt_template) is not PromptList:
            return original(self, prompt_template, mode)
        parsed_before = self.__dict__.setdefault("_autorl_parsed", {})
        key = (id(prompt_template), mode)
        held = parsed_before.get(key)
        if held is not None and held[0] is prompt_template and held[1] == prompt_template:
            return _plain_items(held[2])
        parsed = original(self, prompt_template, mode)
        as_parsed, kept = _plain_items(prompt_template, any_dict=True), _plain_items(parsed)
        if as_parsed is not None and kept is not None:
            parsed_before[key] = (prompt_template, as_parsed, kept)
        return parsed

    parse_template.once = True  # type: ignore[attr-defined]
    APITemplateParser.parse_template = parse_template


def _reseed() -> None:
    """Fresh random states, as a new process has: a forked one would start from the server's."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    fingerprint = sys.modules.get("datasets.fingerprint")
    if fingerprint is not None and hasattr(fingerprint, "fingerprint_rng"):
        fingerprint.fingerprint_rng.seed()


def _under_server() -> list[int]:
    """Live processes whose ancestry leads to this server, from one scan of /proc. (The worker's
    ``autorl.process_group`` does the same; this program cannot import it.)"""
    parents: dict[int, int] = {}
    live: set[int] = set()
    for name in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            stat = Path("/proc", name, "stat").read_text()
            state, parent = stat[stat.rfind(")") + 2 :].split()[:2]
            parents[int(name)] = int(parent)
            if state not in ("Z", "X"):
                live.add(int(name))
    server, found = os.getpid(), []
    for pid in live:
        ancestor, steps = parents[pid], 0
        while ancestor in parents and ancestor != server and steps < len(parents):
            ancestor, steps = parents[ancestor], steps + 1
        if ancestor == server:
            found.append(pid)
    return sorted(found)


def _end_all_under_server(grace_s: float) -> list[int]:
    """SIGTERM every process under the server, SIGKILL what is left after ``grace_s`` (again each
    round: one may start another between the scan and the signal), reaping the server's children
    as they end; the pids still alive :data:`REAP_WAIT_S` after that."""
    left = _under_server()
    _signal_all(left, signal.SIGTERM)
    kill_at = time.monotonic() + grace_s
    while left and time.monotonic() < kill_at + REAP_WAIT_S:
        time.sleep(0.1)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        left = _under_server()
        if time.monotonic() >= kill_at:
            _signal_all(left, signal.SIGKILL)
    return left


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _run_child(request: dict[str, Any], server: int) -> int:
    """In the forked child: OpenCompass's command on the worker's arguments; its exit code."""
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server:  # the server died before the request to die with it was made
        return 1
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    _reseed()
    log = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(str(request["cwd"]))
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
    sys.argv = ["opencompass", *(str(arg) for arg in request["argv"])]
    from opencompass.cli.main import main

    try:
        main()
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _serve(request: dict[str, Any], connection: json_lines.Connection, listener: socket.socket) -> None:
    if request.get("op") == "ping":
        connection.reply({"ok": True})
        return
    if request.get("op") != "run":
        connection.reply({"ok": False, "error": f"unknown op {request.get('op')!r}"})
        return
    server = os.getpid()
    # The child starts with SIGTERM blocked, until it has put the default handlers back.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            connection.close()
            listener.close()
            code = _run_child(request, server)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    connection.reply({"ok": True, "pid": pid})
    # Reaping on the way what the run left behind (handed to the server) that ended.
    while (reaped := os.waitpid(-1, 0))[0] != pid:
        pass
    # The run has ended (no other runs): whatever is still under the server is its leftover.
    survivors = _end_all_under_server(KILL_GRACE_S)
    returncode = os.waitstatus_to_exitcode(reaped[1])
    connection.reply({"ok": True, "returncode": returncode, "survivors": survivors})


def _end(signum: int, _frame: object) -> None:
    # The run going on, and anything under the server, goes with it now.
    _end_all_under_server(0)
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
    os._exit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    # The script's folder (the worker's package) is not where a run imports from, as for the command.
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)
    global _folder
    _folder = Path(args.socket).resolve().parent
    signal.signal(signal.SIGTERM, _end)
    signal.signal(signal.SIGINT, _end)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    preload()
    listener = json_lines.listen(Path(args.socket))
    print(f"compass server listening on {args.socket}", flush=True)
    json_lines.serve(
        listener,
        lambda request, connection: _serve(request, connection, listener),
        max_request_bytes=MAX_REQUEST_BYTES,
    )


if __name__ == "__main__":
    sys.exit(main())
