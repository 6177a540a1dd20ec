"""Integer codes for the string columns of a history or an expectation, so that checkers group,
join and test membership over ~10^7 rows in numpy instead of one Python tuple per row.

Values compare as Arrow compares them: equal strings are equal, and a null equals a null (as in
``groupby(dropna=False)`` and in merges). Codes follow the values' lexicographic order with null
last, the order pandas sorts them in, so the smallest keys are the rows a sorted merge or
groupby lists first.

Hashing the strings is most of the cost (10^7 device tokens take seconds), and every checker of
a run reads the same history and expectation; a column's dictionary encoding is therefore kept
while its frame lives and the column still holds the same (immutable) Arrow array.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

# A joint key beyond this is re-ranked before the next column is folded in: no overflow.
_KEY_LIMIT = 2**62
# Binary search into a sorted array up to this size stays in cache; beyond, sort the values.
_SEARCH_LIMIT = 2**16

Encoding = list[tuple[np.ndarray, pa.Array]]  # per chunk: (indices, dictionary)
# key -> (the Arrow arrays it was computed from, value); entries go when their frames go.
_memo: dict[tuple, tuple[tuple[object, ...], object]] = {}
_keys_of_frame: dict[int, set[tuple]] = {}


def _arrow(values: pd.Series) -> pa.ChunkedArray:
    array = pa.array(values)
    if isinstance(array, pa.Array):
        array = pa.chunked_array([array])
    if not pa.types.is_large_string(array.type):
        array = array.cast(pa.large_string())
    return array


def _source(values: pd.Series) -> object | None:
    """The immutable Arrow data behind an Arrow-backed column (None for other dtypes): while a
    column holds the same such object, anything computed from it still holds."""
    arrow_array = getattr(values.array, "__arrow_array__", None)
    source = arrow_array() if arrow_array is not None else None
    return source if isinstance(source, pa.ChunkedArray | pa.Array) else None


def _forget(frame_id: int) -> None:
    for key in _keys_of_frame.pop(frame_id, ()):
        _memo.pop(key, None)


def _remembered(
    frames: Sequence[pd.DataFrame], key: tuple, sources: tuple[object, ...], compute: Callable
) -> Any:
    entry = _memo.get(key)
    if entry is not None and all(a is b for a, b in zip(entry[0], sources, strict=True)):
        return entry[1]
    value = compute()
    if all(source is not None for source in sources):
        _memo[key] = (sources, value)
        for frame in frames:
            if id(frame) not in _keys_of_frame:
                _keys_of_frame[id(frame)] = set()
                weakref.finalize(frame, _forget, id(frame))
            _keys_of_frame[id(frame)].add(key)
    return value


def encoding(frame: pd.DataFrame, column: str) -> Encoding:
    """The column's dictionary encoding, chunk by chunk, nulls encoded as a value."""

    def encode() -> Encoding:
        encoded = []
        for chunk in _arrow(frame[column]).chunks:
            dictionary_array = pc.dictionary_encode(chunk, null_encoding="encode")
            indices = dictionary_array.indices.to_numpy(zero_copy_only=False)
            indices.setflags(write=False)  # shared by every caller: never modified
            encoded.append((indices, dictionary_array.dictionary))
        return encoded

    sources = (_source(frame[column]),)
    return _remembered([frame], ("encoding", id(frame), column), sources, encode)


def _gather(encoded: Encoding, per_value: Sequence[np.ndarray]) -> np.ndarray:
    """Per row, the value its dictionary entry maps to."""
    pieces = [mapped[indices] for (indices, _), mapped in zip(encoded, per_value, strict=True)]
    if len(pieces) == 1:
        return pieces[0]
    return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


def codes(*columns: tuple[pd.DataFrame, str]) -> tuple[list[np.ndarray], int]:
    """Codes of several (frame, column) pairs in one shared vocabulary, and its size."""
    encoded = [encoding(frame, column) for frame, column in columns]
    dictionaries = [dictionary for parts in encoded for _, dictionary in parts]
    vocabulary = pc.unique(pa.chunked_array(dictionaries, type=pa.large_string()))
    vocabulary = vocabulary.take(pc.array_sort_indices(vocabulary, null_placement="at_end"))
    result = []
    for parts in encoded:
        mapped = [
            pc.index_in(dictionary, value_set=vocabulary, skip_nulls=False)
            .to_numpy(zero_copy_only=False)
            .astype(np.int64)
            for _, dictionary in parts
        ]
        result.append(_gather(parts, mapped))
    return result, len(vocabulary)


def lookup(frame: pd.DataFrame, column: str, vocabulary: Sequence[str] | pa.Array) -> np.ndarray:
    """Per row, the position of its value in ``vocabulary`` (strings), -1 if absent or null."""
    if isinstance(vocabulary, pa.Array):
        value_set = vocabulary.cast(pa.large_string())
    else:
        value_set = pa.array(list(vocabulary), pa.large_string())
    parts = encoding(frame, column)
    mapped = [
        pc.index_in(dictionary, value_set=value_set, skip_nulls=True)
        .fill_null(-1)
        .to_numpy(zero_copy_only=False)
        .astype(np.int64)
        for _, dictionary in parts
    ]
    return _gather(parts, mapped)


def rows_with(frame: pd.DataFrame, column: str, wanted: Iterable[object] | pa.Array) -> np.ndarray:
    """Per row: may its value be one of ``wanted``? Every row equal to a wanted string, and
    every null row when something wanted is not a string. A superset: the caller still checks
    each such row with its own comparison."""
    if isinstance(wanted, pa.Array):
        strings, nulls_too = wanted.drop_null().cast(pa.large_string()), wanted.null_count > 0
    else:
        wanted = list(wanted)
        strings = pa.array([w for w in wanted if isinstance(w, str)], pa.large_string())
        nulls_too = any(not isinstance(w, str) for w in wanted)
    parts = encoding(frame, column)
    mapped = []
    for _, dictionary in parts:
        hit = pc.is_in(dictionary, value_set=strings, skip_nulls=True)
        hit = hit.to_numpy(zero_copy_only=False).astype(bool)
        if nulls_too:
            hit |= dictionary.is_null().to_numpy(zero_copy_only=False).astype(bool)
        mapped.append(hit)
    return _gather(parts, mapped).astype(bool)


def values_at(frame: pd.DataFrame, column: str, positions: np.ndarray) -> pa.Array:
    """The distinct values of a column at the given row positions."""
    parts = encoding(frame, column)
    found = []
    start = 0
    for indices, dictionary in parts:
        inside = positions[(positions >= start) & (positions < start + len(indices))] - start
        found.append(dictionary.take(pa.array(np.unique(indices[inside]))))
        start += len(indices)
    if not found:
        return pa.array([], pa.large_string())
    distinct = pc.unique(pa.chunked_array(found, type=pa.large_string()))
    return distinct.combine_chunks() if isinstance(distinct, pa.ChunkedArray) else distinct


def joint_keys(frames: Sequence[pd.DataFrame], columns: Sequence[str]) -> list[np.ndarray]:
    """One int64 per row of each frame for the tuple of ``columns``: equal tuples get equal keys
    in every frame, and keys sort as the tuples sort. Callers must not modify the arrays."""

    def compute() -> list[np.ndarray]:
        keys = [np.zeros(len(frame), dtype=np.int64) for frame in frames]
        for column in columns:
            column_codes, size = codes(*((frame, column) for frame in frames))
            span = max((int(k.max()) + 1 for k in keys if len(k)), default=1)
            if span * max(size, 1) >= _KEY_LIMIT:
                lengths = np.cumsum([len(k) for k in keys])[:-1]
                everything = np.concatenate(keys)
                dense = np.searchsorted(sorted_unique(everything), everything)
                keys = np.split(dense.astype(np.int64), lengths)
            keys = [k * size + c for k, c in zip(keys, column_codes, strict=True)]
        for k in keys:
            k.setflags(write=False)  # shared by every caller: never modified
        return keys

    key = ("joint", tuple(id(frame) for frame in frames), tuple(columns))
    sources = tuple(_source(frame[column]) for frame in frames for column in columns)
    return _remembered(frames, key, sources, compute)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` by sorting (numpy's hash-based unique is many times slower here)."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


def member(values: np.ndarray, universe: np.ndarray, ordered: bool = False) -> np.ndarray:
    """``np.isin(values, universe)`` for a sorted, duplicate-free universe (``ordered``: the
    values are sorted too)."""
    if not len(universe):
        return np.zeros(len(values), dtype=bool)
    if ordered or len(universe) <= _SEARCH_LIMIT:
        found = np.minimum(np.searchsorted(universe, values), len(universe) - 1)
        return universe[found] == values
    # Sorted lookups walk the universe once instead of jumping around it.
    order = np.argsort(values)
    hit = np.empty(len(values), dtype=bool)
    hit[order] = member(values[order], universe, ordered=True)
    return hit


def first_rows(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Position of the first row holding each wanted key (each must occur), in wanted's order;
    for the handful of keys a verdict shows as examples."""
    positions = np.flatnonzero(np.isin(keys, wanted))
    found, first = np.unique(keys[positions], return_index=True)
    return positions[first[np.searchsorted(found, wanted)]]
