"""The ``mtpdiag.report/1`` JSON document (docs/design.md): what automation reads."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from itertools import accumulate, chain
from json.encoder import encode_basestring_ascii
from operator import attrgetter, itemgetter
from typing import Any

from mtpdiag.model import Frame, Mismatch, RankView, Report, Site

# Above this many ranks the JSON is compact: indenting forces Python's pure-Python encoder, which is
# several times slower than the C one (seconds at 16k ranks). Consumers parse it either way.
INDENT_MAX_RANKS = 1024

_encode = json.JSONEncoder(separators=(",", ":")).encode  # what json.dumps(..., separators=...) runs
_encode_sorted = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode

# The fields the compact writer spells out, in the order of each class's ``to_dict``. A model that grew
# or renamed a field is written the generic (slower, equally correct) way until this module catches up.
_WRITTEN_FIELDS = {
    RankView: ("rank", "pid", "host", "state", "coords", "op", "site", "stack", "peer", "error"),
    Mismatch: ("op", "site", "group", "members", "entered", "absent", "gate", "absent_doing", "role"),
    Frame: ("function", "file", "line", "args", "native"),
    Site: ("file", "line", "function"),
}
FAST_PATH_MATCHES_MODEL = all(tuple(f.name for f in fields(cls)) == names for cls, names in _WRITTEN_FIELDS.items())

# The to_dicts as %-templates. Every object gets a leading comma; the first one's is cut off.
# A rank is written as three pieces, head + stack + tail, so that its (shared) stack text is not copied
# into a per-rank string; "coords" is either one %s or, when all ranks share its keys, one %s per key.
_RANK_HEAD = ',{"rank":%s,"pid":%s,"host":%s,"state":%s,"coords":%s,"op":%s,"site":%s,"stack":'
_RANK_TAIL = "%s%s}"  # peer, error: each '' when to_dict leaves it out
_MISMATCH = (',{"op":%s,"site":%s,"group":%s,"members":[%s],"entered":[%s],"absent":[%s],"gate":%s,'
             '"absent_doing":{%s},"role":%s}')
_SITE = '{"file":%s,"line":%s,"function":%s}'
_FRAME = '{"file":%s,"line":%s,"function":%s%s}'

_NONE = {type(None)}
_STRINGS = {str, type(None)}
_INTS = {int}
_ARRAYS = {tuple, list}


def render(report: Report) -> str:
    """The report as JSON: indented up to ``INDENT_MAX_RANKS`` ranks, else compact (the same document)."""
    if len(report.ranks) <= INDENT_MAX_RANKS:
        return json.dumps(report.to_dict(), indent=2)
    if not FAST_PATH_MATCHES_MODEL:
        return _encode(report.to_dict())
    return _compact(report)


def _compact(report: Report) -> str:
    """``json.dumps(report.to_dict(), separators=(",", ":"))``, character for character, in a fraction of
    the time.

    A big job's ranks share a few hosts, stacks, sites and coordinate names: those are encoded once each,
    and the rank (and mismatch) objects are filled in a column at a time by C-level map/zip/%, instead of
    being built as 16k dicts of dicts for the encoder to walk. Each rank is read once (16k objects spread
    over memory: passes over them are what costs), and the text is joined once at the end. The other
    keys go through the C encoder as before.
    """
    writer = _Writer()
    own = {"ranks": writer.ranks, "mismatches": writer.mismatches}
    pieces = ["{"]
    # to_dict of all the rest gives the keys in to_dict's order, extra keys and their setdefault included
    for key, value in replace(report, ranks=(), mismatches=()).to_dict().items():
        if len(pieces) > 1:
            pieces.append(",")
        write = own.pop(key, None) if type(key) is str else None
        if write is None:
            pieces.append(_encode({key: value})[1:-1])
        else:
            pieces.append(encode_basestring_ascii(key) + ":[")
            pieces.extend(write(getattr(report, key)))
            pieces.append("]")
    pieces.append("}")
    return "".join(pieces)


def _columns(items: Sequence[Any], names: tuple[str, ...]) -> list[tuple]:
    """The named attributes of all items, one tuple per name, reading each item once."""
    if not items:
        return [()] * len(names)
    return list(zip(*map(attrgetter(*names), items)))


def _types(values) -> set:
    return set(map(type, values))


def _unlead(texts: list[str]) -> list[str]:
    """Cut the first object's leading comma (the templates give each object one)."""
    if texts:
        texts[0] = texts[0][1:]
    return texts


def _runs(pieces: list[str], lengths: list[int]) -> list[str]:
    """Consecutive runs of ``pieces``, of the given lengths, each comma-joined."""
    ends = list(accumulate(lengths))
    return list(map(",".join, map(pieces.__getitem__, map(slice, [0, *ends[:-1]], ends))))


class _Strings(dict):
    """str (or None) -> its JSON, computed once. Other values are encoded each time and never kept, so
    that ``True`` (equal to, and hashing like, ``1``) can never be answered with another value's text."""

    __slots__ = ()

    def __missing__(self, value):
        text = _encode(value)
        if type(value) is str or value is None:
            self[value] = text
        return text


class _Writer:
    """JSON text of whole columns of values, with what repeats encoded once per render.

    The fast paths check that the values are what the model declares (exact ``int``, ``str``, ``dict``,
    tuples of ints); a column holding anything else is encoded value by value, as the encoder would.
    """

    def __init__(self):
        self.strings = _Strings()

    # ------------------------------------------------------------ the two big arrays

    def ranks(self, views: Sequence[RankView]) -> list[str]:
        """The pieces of the ranks array's text, RankView.to_dict each: head, stack and tail per rank."""
        rank, pid, host, state, coords, op, site, stack, peer, error = _columns(views, _WRITTEN_FIELDS[RankView])
        keys, coord_columns = self.same_key_objects(coords)
        if keys is None:
            head, coord_columns = _RANK_HEAD, [self.objects(coords)]
        else:
            head = _RANK_HEAD.replace('"coords":%s', '"coords":' + _object_template(keys))
        heads = _unlead(list(map(head.__mod__, zip(
            self.ints(rank), self.ints(pid), self.texts(host), self.texts(state), *coord_columns,
            self.texts(op), self.shared(site, self.sites)))))
        if _types(peer) == _NONE and not any(error):
            tails = ["}"] * len(views)
        else:
            tails = list(map(_RANK_TAIL.__mod__, zip(
                [',"peer":' + self.scalar(p) if p is not None else "" for p in peer],
                [',"error":' + self.scalar(e) if e else "" for e in error])))
        return list(chain.from_iterable(zip(heads, self.shared(stack, self.stacks), tails)))

    def mismatches(self, mismatches: Sequence[Mismatch]) -> list[str]:
        """Mismatch.to_dict of each, as text."""
        op, site, group, members, entered, absent, gate, doing, role = _columns(
            mismatches, _WRITTEN_FIELDS[Mismatch])
        return _unlead(list(map(_MISMATCH.__mod__, zip(
            self.texts(op), self.shared(site, self.sites), self.texts(group), self.int_arrays(members),
            self.int_arrays(entered), self.int_arrays(absent), self.objects(gate),
            self.absent_doings(doing), self.texts(role)))))

    # ------------------------------------------------------------ columns

    def texts(self, values: Sequence) -> list[str]:
        """Strings (or None), each encoded once; anything else is encoded as it comes."""
        try:
            return list(map(self.strings.__getitem__, values))
        except TypeError:  # unhashable
            return list(map(_encode, values))

    def ints(self, values: Sequence) -> Sequence:
        """The values themselves if all are exact ints (``%s`` writes them as JSON does), else their JSON."""
        if _types(values) <= _INTS:
            return values
        return list(map(_encode, values))

    def shared(self, objects: Sequence, write: Callable[[list], list[str]]) -> list[str]:
        """Each object's text, written once per distinct object (``objects`` keeps the ids valid)."""
        ids = list(map(id, objects))
        distinct = dict(zip(ids, objects))
        texts = dict(zip(distinct, write(list(distinct.values()))))
        return list(map(texts.__getitem__, ids))

    def sites(self, sites: list[Site | None]) -> list[str]:
        real = [site for site in sites if site]  # the to_dicts test truthiness
        file, line, function = _columns(real, _WRITTEN_FIELDS[Site])
        texts = iter(map(_SITE.__mod__, zip(self.texts(file), self.ints(line), self.texts(function))))
        return [next(texts) if site else "null" for site in sites]

    def stacks(self, stacks: list[tuple[Frame, ...]]) -> list[str]:
        frames = self.shared(list(chain.from_iterable(stacks)), self.frames)
        return list(map("[%s]".__mod__, _runs(frames, list(map(len, stacks)))))

    def frames(self, frames: list[Frame]) -> list[str]:
        function, file, line, args, native = _columns(frames, _WRITTEN_FIELDS[Frame])
        texts = iter(self.objects([a for a in args if a], self.same_key_pairs))
        return list(map(_FRAME.__mod__, zip(
            self.texts(file), self.ints(line), self.texts(function),
            [(',"args":' + next(texts) if a else "") + (',"native":true' if n else "")
             for a, n in zip(args, native)])))

    def same_key_objects(self, mappings: Sequence) -> tuple[tuple | None, list]:
        """(the keys, one column of values per key) when every mapping is a dict with the same string keys
        in the same order and int values, as a layout's coords are; else (None, [])."""
        if not mappings or _types(mappings) != {dict}:
            return None, []
        keys = tuple(mappings[0])
        # dict keys are distinct, so a concatenation of them that repeats ``keys`` is ``keys`` every time
        if list(chain.from_iterable(mappings)) != list(keys) * len(mappings):
            return None, []
        return self._int_columns(keys, list(chain.from_iterable(map(dict.values, mappings))))

    def same_key_pairs(self, pair_tuples: Sequence) -> tuple[tuple | None, list]:
        """``same_key_objects`` of ``dict(pairs)`` for each, as frame args are stored."""
        if not pair_tuples or _types(pair_tuples) != {tuple}:
            return None, []
        keys = tuple(pair[0] for pair in pair_tuples[0])
        flat = list(chain.from_iterable(pair_tuples))
        if (len(set(keys)) != len(keys) or set(map(len, pair_tuples)) != {len(keys)}
                or _types(flat) != {tuple} or set(map(len, flat)) != {2}
                or list(map(itemgetter(0), flat)) != list(keys) * len(pair_tuples)):
            return None, []
        return self._int_columns(keys, list(map(itemgetter(1), flat)))

    def _int_columns(self, keys: tuple, values: list) -> tuple[tuple | None, list]:
        if not all(type(k) is str for k in keys) or not _types(values) <= _INTS:
            return None, []
        return keys, [values[i::len(keys)] for i in range(len(keys))]

    def objects(self, mappings: Sequence, same_keys: Callable | None = None) -> list[str]:
        """``dict(m)`` of each (``null`` for None), as the to_dicts write a gate, coords or frame args."""
        keys, columns = (same_keys or self.same_key_objects)(mappings)
        if keys is not None:
            return list(map(_object_template(keys).__mod__, zip(*columns))) if keys else ["{}"] * len(mappings)
        return [_encode(dict(m)) if m is not None else "null" for m in mappings]

    def int_arrays(self, sequences: Sequence) -> list[str]:
        """The items of each int sequence, comma-joined (the template adds the brackets)."""
        if sequences and _types(sequences) <= _ARRAYS:
            text = _encode(sequences)
            if text.count("],[") == len(sequences) - 1:  # only between the arrays: splitting there is exact
                return text[2:-2].split("],[")
        return [_encode(list(sequence))[1:-1] for sequence in sequences]

    def absent_doings(self, mappings: Sequence) -> list[str]:
        """The members of ``{str(k): v for k, v in sorted(m.items())}`` (Mismatch.to_dict's form).

        For dicts with int keys that is what the encoder writes with ``sort_keys``: it sorts the items
        by their original keys and writes an int key as its ``str``."""
        if (mappings and _types(mappings) == {dict} and _types(chain.from_iterable(mappings)) <= _INTS
                and _types(chain.from_iterable(map(dict.values, mappings))) <= _STRINGS):  # nothing to sort inside
            text = _encode_sorted(mappings)
            if text.count("},{") == len(mappings) - 1:  # only between the objects: splitting there is exact
                return text[2:-2].split("},{")
        return [_encode({str(k): v for k, v in sorted(m.items())})[1:-1] for m in mappings]

    # ------------------------------------------------------------ single values

    def scalar(self, value: Any) -> str:
        return str(value) if type(value) is int else self.strings[value]


def _object_template(keys: tuple[str, ...]) -> str:
    """The %-template of an object with these string keys and one %s value each."""
    return "{" + ",".join(encode_basestring_ascii(k).replace("%", "%%") + ":%s" for k in keys) + "}"
