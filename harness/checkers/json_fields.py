"""Fields of a history row's JSON ``detail`` read in DuckDB SQL, as Python's ``json.loads``
would read them (a detail that is not a JSON object reads as {}), and pandas columns handed to
DuckDB as Arrow. Checkers that judge millions of audit records query these instead of parsing
each record in Python: the same query over a history on disk and one in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa


def json_object(column: str) -> str:
    """The column as a JSON object, or NULL (not JSON, or not an object: read as {})."""
    return (
        f"CASE WHEN json_valid({column}) THEN "
        f"(CASE WHEN json_type({column}) = 'OBJECT' THEN {column}::JSON END) END"
    )


def json_string(doc: str, field: str) -> str:
    """``doc[field]`` when it is a JSON string, else NULL."""
    path = f"'$.\"{field}\"'"
    return (
        f"CASE WHEN json_type({doc}, {path}) = 'VARCHAR' "
        f"THEN json_extract_string({doc}, {path}) END"
    )


def json_push_channel(doc: str) -> str:
    """The record is the push channel's: it names no ``channel``, or names ``push`` (an email or
    in-app record must not stand in for a push job's own)."""
    return f"(json_type({doc}, '$.channel') IS NULL OR {json_string(doc, 'channel')} = 'push')"


def json_whole_number(doc: str, field: str) -> str:
    """``doc[field]`` as a whole number: an integer, a float (truncated) or a string of
    digits; NULL for anything else (a boolean too)."""
    path = f"'$.\"{field}\"'"
    text = f"json_extract_string({doc}, {path})"
    return f"""CASE json_type({doc}, {path})
        WHEN 'UBIGINT' THEN TRY_CAST({text} AS BIGINT)
        WHEN 'BIGINT' THEN TRY_CAST({text} AS BIGINT)
        WHEN 'DOUBLE' THEN TRY_CAST(trunc(TRY_CAST({text} AS DOUBLE)) AS BIGINT)
        WHEN 'VARCHAR' THEN CASE WHEN regexp_full_match(trim({text}), '[+-]?[0-9]+')
            THEN TRY_CAST(trim({text}) AS BIGINT) END
        END"""


def json_truthy(doc: str, field: str) -> str:
    """``doc[field]`` is there and true as Python reads a JSON value (a non-empty string,
    list or object, a non-zero number, true)."""
    path = f"'$.\"{field}\"'"
    text = f"json_extract_string({doc}, {path})"
    return f"""coalesce(CASE json_type({doc}, {path})
        WHEN 'BOOLEAN' THEN {text} = 'true'
        WHEN 'VARCHAR' THEN length({text}) > 0
        WHEN 'UBIGINT' THEN TRY_CAST({text} AS DOUBLE) <> 0
        WHEN 'BIGINT' THEN TRY_CAST({text} AS DOUBLE) <> 0
        WHEN 'DOUBLE' THEN TRY_CAST({text} AS DOUBLE) <> 0
        WHEN 'ARRAY' THEN json_array_length({doc}, {path}) > 0
        WHEN 'OBJECT' THEN {text} <> '{{}}'
        END, false)"""


def strings(values: pd.Series) -> pa.Array:
    """A column of strings with its missing values (None or NaN) as nulls."""
    return pa.array(
        [v if isinstance(v, str) else None for v in values.astype(object).tolist()], pa.string()
    )


def rows_table(rows: pd.DataFrame, texts: Sequence[str], integers: Sequence[str] = ()) -> pa.Table:
    """History rows as an Arrow table DuckDB can query: ``pos`` (their order), ``time`` (a NaN
    as null, as the store reads it), the ``texts`` columns as strings and the ``integers`` as
    int64."""
    return pa.table(
        {
            "pos": pa.array(np.arange(len(rows), dtype=np.int64)),
            "time": pa.array(rows["time"].to_numpy(dtype=np.float64), from_pandas=True),
            **{c: strings(rows[c]) for c in texts},
            **{c: pa.array(rows[c].to_numpy(dtype=np.int64)) for c in integers},
        }
    )


def key_text(value: Any) -> str:
    """A key part read from DuckDB as the in-memory path spells it (a missing one reads <NA>
    in a frame's string column)."""
    return str(pd.NA) if value is None else str(value)
