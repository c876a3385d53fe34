"""Trace-length bands: the seed's benchmark recommendations group traces by their number of
events. The buffer samples by band, the metrics table labels each trace with its band, and
``masreplay report`` averages per band."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from masreplay.errors import InvalidArgumentError

#: Band b holds traces with b/10 < n_events <= b (band 10 holds 1..10 events).
LENGTH_BANDS = (10, 100, 1000, 10000)


def band_limits(band: int) -> tuple[int, int]:
    """The (fewest, most) events of a trace in ``band``."""
    if band not in LENGTH_BANDS:
        raise InvalidArgumentError(f"band must be one of {LENGTH_BANDS}, not {band!r}")
    return (1 if band == 10 else band // 10 + 1, band)


def length_bands(n_events: np.ndarray) -> pa.Array:
    """The band (10, 100, 1000 or 10000) of each event count; null above the largest band."""
    bands = np.zeros(len(n_events), dtype=np.int32)
    for band in LENGTH_BANDS:
        low, high = band_limits(band)
        bands[(n_events >= low) & (n_events <= high)] = band
    return pa.array(bands, mask=bands == 0)
