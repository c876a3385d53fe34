"""ConversionReport: what a converter read, what it set aside on purpose, what it did not understand.

It sits below batch.py, which carries a report with the traces it describes, and below
masreplay.convert, whose converters fill it in."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ConversionReport:
    """Attached to every converted batch as ``batch.conversion_report``.

    Nothing a converter reads disappears without a trace here: ``ignored`` counts records
    it understood and chose not to turn into events (with the reason in the key), ``unknown``
    counts records it did not understand, and ``warnings`` names file and line of records that
    were kept but look wrong (a tool result whose call is missing, a reference to nothing).
    """

    format: str
    sources: list[str] = field(default_factory=list)
    records: int = 0
    traces: int = 0
    events: int = 0
    ignored: Counter[str] = field(default_factory=Counter)
    unknown: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def combine(cls, reports: list[ConversionReport]) -> ConversionReport:
        """One report for batches concatenated together: counts summed, sources and warnings
        kept in order, formats named once each."""
        formats = list(dict.fromkeys(report.format for report in reports))
        combined = cls("+".join(formats))
        for report in reports:
            combined.sources += report.sources
            combined.records += report.records
            combined.traces += report.traces
            combined.events += report.events
            combined.ignored += report.ignored
            combined.unknown += report.unknown
            combined.warnings += report.warnings
        return combined

    @property
    def clean(self) -> bool:
        """True when every record was understood and nothing looked wrong."""
        return not self.unknown and not self.warnings

    def __str__(self) -> str:
        lines = [f"{self.format}: {self.records} records -> {self.traces} traces, {self.events} events"]
        lines += [f"  ignored {count} x {what}" for what, count in sorted(self.ignored.items())]
        lines += [f"  unknown {count} x {what}" for what, count in sorted(self.unknown.items())]
        lines += [f"  warning {text}" for text in self.warnings]
        return "\n".join(lines)
