"""The batch a core converter returns, with its conversion report attached."""

from __future__ import annotations

from collections import Counter

from masreplay.batch import TraceBatch
from masreplay.conversion_report import ConversionReport


def converted(converter: str, sources: list[str], result: tuple) -> TraceBatch:
    """The batch of a ``_core.convert_*`` result (batch, records read, ignored counts, unknown
    counts, warnings), its report naming the converter and the sources read."""
    core, records, ignored, unknown, warnings = result
    batch = TraceBatch(core, [])
    batch.conversion_report = ConversionReport(
        converter,
        sources=sources,
        records=records,
        traces=len(batch),
        events=batch.num_events,
        ignored=Counter(dict(ignored)),
        unknown=Counter(dict(unknown)),
        warnings=warnings,
    )
    return batch
