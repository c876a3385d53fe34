"""MultiAgentBench (MARBLE) result logs -> one trace per episode (one JSON Lines record).

Per iteration: ``task_assignments`` -> an orchestrator_decision by ``planner`` and a message
to each assigned agent; ``communications`` -> messages, parsed from their "From A to B:"
lines; ``task_results`` -> a return by each agent (MARBLE writes an entry either as
``{"agent_id": ..., "result": ...}`` or, in its minecraft and discussion runs, as
``{"<agent>": "<result>"}``); ``summary`` -> an aggregate by the planner. The planner's
events have the role ``orchestrator``, the agents' ``sub-agent``.
Episode scores become reward channels (``planning``, ``communication``: the mean of the
scored rounds; ``task_evaluation.<name>``, ``code_quality.<name>``); a score of -1 means
"not scored" and is left out (listed in the trace's ``missing_scores``). ``agent_kpis`` is
the channel ``milestones.<agent>`` and that agent's ``milestones`` reward on its last return; ``token_usage`` is the trace's token
cost. MARBLE logs have no timestamps: ``t`` is the event's position in the episode and
wall_clock_s is 0. The trace id is ``<file stem>:<line>``, the task id ``marble-`` and the
first 16 hex digits of the task text's SHA-256. The conversion runs in the Rust core
(``masreplay._core.convert_marble``), episodes in parallel.
"""

from __future__ import annotations

import os
from typing import Any

from masreplay import _core
from masreplay.batch import TraceBatch
from masreplay.convert._converted import converted
from masreplay.convert._lines import _read, local_path, records


def marble(source: Any) -> TraceBatch:
    """Converts MARBLE episodes: a path to a result ``.jsonl`` file, one episode dict, or a list."""
    if isinstance(source, (str, os.PathLike)):
        name = local_path(source)
        data: Any = _read(name)
    else:
        name, numbered = records(source)
        data = [record for _, record in numbered]
    return converted("marble", [name], _core.convert_marble((name, os.path.basename(name), data)))
