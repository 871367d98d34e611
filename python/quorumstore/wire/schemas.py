"""Arrow schemas of the rows the data service carries, which clients and servers share."""

from __future__ import annotations

import pyarrow as pa

#: Rows a client writes or stages (`WriteArrow`, `StageArrow`): a key and its value.
ROWS_SCHEMA = pa.schema(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary(), nullable=False)]
)
#: Records a scan returns (`ScanArrow`).
SCAN_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("version_id", pa.int64(), nullable=False),
        pa.field("modifications_count", pa.int64(), nullable=False),
        pa.field("created_ms", pa.int64(), nullable=False),
        pa.field("modified_ms", pa.int64(), nullable=False),
    ]
)
#: A scan through a secondary index: each record and the secondary key it was found by.
INDEX_SCAN_SCHEMA = SCAN_SCHEMA.append(pa.field("secondary_key", pa.string(), nullable=False))
