"""Shared fixtures and hypothesis profiles of the masreplay test suite."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# tests/ is not a package; make `import strategies` work from every test module.
sys.path.insert(0, str(Path(__file__).parent))

# The tests start a local Ray: keep it on the loopback address (Ray's single-machine mode;
# read when ray is first imported) instead of the machine's network interface.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT / "tests" / "data"
SEED_SCHEMA_PATH = DATA / "seed_schema" / "trace_schema.json"


@pytest.fixture(scope="session")
def seed_example() -> dict:
    """The seed schema's example trace, as bundled with the package."""
    from masreplay.demo import SEED_EXAMPLE, bundled

    path = bundled(SEED_EXAMPLE)
    assert path.is_file(), f"bundled seed example missing at {path}"
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def seed_schema() -> dict:
    """The published seed JSON Schema (draft 2020-12); its absence is a failure, not a skip."""
    if not SEED_SCHEMA_PATH.is_file():
        pytest.fail(
            f"the seed trace JSON Schema is missing: expected it at {SEED_SCHEMA_PATH} "
            "(tests/data/seed_schema/trace_schema.json in the repository; see tests/data/README.md)",
            pytrace=False,
        )
    return json.loads(SEED_SCHEMA_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def seed_validator(seed_schema):
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(seed_schema)
    return jsonschema.Draft202012Validator(seed_schema)
