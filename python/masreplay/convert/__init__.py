"""Converters from foreign trace formats to masreplay traces.

``to_otel`` writes traces back out as OpenTelemetry GenAI spans with credit attached. Each
converter returns a validated :class:`~masreplay.TraceBatch` whose ``conversion_report`` (a
:class:`ConversionReport`) counts what was read, set aside and not understood. A record that
cannot be read raises :class:`~masreplay.ConversionError` naming file and line;
no other exception leaves a converter.
"""

from masreplay.conversion_report import ConversionReport
from masreplay.convert.claude_code import claude_code
from masreplay.convert.marble import marble
from masreplay.convert.otel import otel
from masreplay.convert.otel_export import to_otel
from masreplay.convert.seed import masreplay_traces, seed, to_seed, write

#: The converters by the name ``masreplay convert --from`` takes.
FORMATS = {"claude_code": claude_code, "otel": otel, "marble": marble, "seed": seed, "masreplay": masreplay_traces}

__all__ = [
    "FORMATS",
    "ConversionReport",
    "claude_code",
    "marble",
    "masreplay_traces",
    "otel",
    "seed",
    "to_otel",
    "to_seed",
    "write",
]
