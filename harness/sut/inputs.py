"""The caller's inputs as an engine must leave them: a deep snapshot of what a call is handed, taken before the call
and compared after it.

An engine may read what its caller hands it but must not change it: a prompt list it extends, sampling parameters it
resolves in place, a round of requests it reorders would reach the caller's next use of them (the warm pass serves the
same requests again; a caller may share one ``SamplingParams`` between requests and engines). Each place that hands
inputs to an engine API watches them (``Watch``) and puts what it compared in the pass's result
(``PassResult.inputs``, one ``InputsCheck`` per API), which the ``inputs`` oracle judges.

A snapshot is a copy in plain values (dicts, lists, numbers, strings), so it shares nothing with the object it was
taken of, and travels as JSON. Standard library only: the vLLM child (vLLM's interpreter, none of our packages) loads
this file by its path, as a module that ``sys.modules`` does not list: hence no ``from __future__ import annotations``
here (a dataclass's string annotations are resolved through its module's entry there).
"""
import dataclasses
import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

#: what a snapshot holds where the object had nothing (a key removed, a list cut short).
ABSENT = "<absent>"
#: how deep a snapshot follows an object's fields; deeper, it keeps the ``repr``.
MAX_DEPTH = 8
#: characters of a value a finding shows.
SHOWN = 120
#: the label of a call's own containers in a view (the lists it was handed, their lengths), beside its requests'.
CALL = "the call's lists"


@dataclass(slots=True, kw_only=True)
class InputsCheck:
    """One engine API's inputs over one pass: what was compared before and after each call, and what changed.

    ``where`` says what could have written them: an engine in the caller's process could; a server in another process
    cannot, and there only the harness's own client path is judged (it says so)."""

    call: str                 # the API handed the inputs: "serve", "LLM.generate", "POST /completion"
    where: str                # who held them during the call, in words
    compared: int = 0         # requests compared (a call's own containers are compared too, not counted)
    changes: list[dict] = field(default_factory=list)  # {"request", "field", "check", "before", "after"}, as found

    def add(self, compared: int, changes: list[dict]) -> None:
        """Count one call's comparison."""
        self.compared += compared
        self.changes.extend(changes)

    def to_json(self) -> dict:
        return {"call": self.call, "where": self.where, "compared": self.compared, "changes": list(self.changes)}

    @classmethod
    def from_json(cls, doc: Mapping) -> "InputsCheck":
        """An ``InputsCheck`` from ``to_json``'s dict (an engine child's answer); a malformed one raises ``ValueError``
        naming the field."""
        for name, kind in (("call", str), ("where", str), ("compared", int), ("changes", list)):
            if not isinstance(doc.get(name), kind) or isinstance(doc.get(name), bool):
                raise ValueError(f"malformed inputs check: field {name!r} should be {kind.__name__}, "
                                 f"got {doc.get(name)!r:.80}")
        return cls(call=doc["call"], where=doc["where"], compared=doc["compared"], changes=list(doc["changes"]))


def snapshot(value: object, depth: int = 0) -> object:
    """``value`` as plain values, sharing nothing with it: a dataclass, a msgspec struct (vLLM's ``SamplingParams``) or
    an object's ``__dict__`` as a dict of its fields (private ones too: an engine resolving one in place changed it),
    a sequence as a list, a set sorted, an enum by name, anything else past ``MAX_DEPTH`` or unknown by its ``repr``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if depth >= MAX_DEPTH:
        return repr(value)
    if isinstance(value, (list, tuple)):
        if all(type(item) in (int, float, str) for item in value):  # a prompt: thousands of ints, copied at once
            return list(value)
        return [snapshot(item, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((snapshot(item, depth + 1) for item in value), key=repr)
    if isinstance(value, Mapping):
        return {str(key): snapshot(item, depth + 1) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: snapshot(getattr(value, f.name, ABSENT), depth + 1) for f in dataclasses.fields(value)}
    names = getattr(type(value), "__struct_fields__", None)
    if names is not None:
        return {name: snapshot(getattr(value, name, ABSENT), depth + 1) for name in names}
    if hasattr(value, "__dict__"):
        return {key: snapshot(item, depth + 1) for key, item in vars(value).items()}
    return repr(value)


def differences(before: object, after: object, path: str = "") -> list[tuple[str, object, object]]:
    """Where two snapshots differ: (path, before, after) for each key or item that differs, the deepest path that
    names it (``prompt_token_ids[31:]``: the list from index 31 on, where one is longer than the other)."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in dict.fromkeys([*before, *after]):
            found += differences(before.get(key, ABSENT), after.get(key, ABSENT), f"{path}.{key}" if path else key)
        return found
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            common = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
            return [(f"{path}[{common}:]", before[common:], after[common:])]
        found = []
        for i, (old, new) in enumerate(zip(before, after)):
            found += differences(old, new, f"{path}[{i}]")
        return found
    return [] if before == after else [(path, before, after)]


def field_of(path: str) -> str:
    """A change's field with its list positions left out (``prompt.prompt_token_ids[31:]`` →
    ``prompt.prompt_token_ids[]``): the check a reproducer keeps, the same whatever length its shrunk prompt has."""
    return re.sub(r"\[\d+:?\]", "[]", path)


def shown(value: object) -> str:
    """``value`` as a finding shows it: its repr, cut at ``SHOWN`` characters."""
    text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def at(items: list | tuple, index: int) -> object:
    """``items[index]``, or ``ABSENT`` where the list no longer reaches it."""
    return items[index] if index < len(items) else ABSENT


class Watch:
    """What one call is handed, snapshotted now and compared when ``changes`` is asked. ``view`` lays the inputs out
    by request (label → what that request was handed; a label of the call's own for its containers) and is read
    again after the call, so an item the engine replaced in a caller's list is seen as well as one it changed."""

    def __init__(self, view: Callable[[], Mapping[str, object]]) -> None:
        self.view = view
        self.before = snapshot(view())

    @classmethod
    def by_request(cls, rids: Sequence[str], **lists: list) -> "Watch":
        """A watch of a call handed parallel lists, one item per request (vLLM's prompts, ``SamplingParams`` and
        priorities): each request's items under their list's name, and the lists' lengths under ``CALL``."""

        def view() -> dict[str, object]:
            held = {rid: {name: at(items, i) for name, items in lists.items()} for i, rid in enumerate(rids)}
            return {**held, CALL: {name: len(items) for name, items in lists.items()}}

        return cls(view)

    @property
    def compared(self) -> int:
        """The requests compared (the call's own entry, ``CALL``, not counted)."""
        return sum(label != CALL for label in self.before)

    def check(self, call: str, where: str) -> InputsCheck:
        """This watch's comparison as one call's ``InputsCheck``."""
        return InputsCheck(call=call, where=where, compared=self.compared, changes=self.changes())

    def changes(self) -> list[dict]:
        """Every difference since the snapshot: the request (the view's label), the field's path, before and after."""
        after = snapshot(self.view())
        found = []
        for label in dict.fromkeys([*self.before, *after]):
            for path, old, new in differences(self.before.get(label, ABSENT), after.get(label, ABSENT)):
                whole = "(the whole input)"
                found.append({"request": label, "field": path or whole, "check": field_of(path) or whole,
                              "before": shown(old), "after": shown(new)})
        return found

