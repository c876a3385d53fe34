"""The masreplay command: validate trace files, print their shape statistics, convert foreign
traces, report orchestration metrics, view a trace, compute offline credit over Parquet dumps,
run the demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from masreplay._text import print_table, stats_table
from masreplay.convert import FORMATS, write
from masreplay.errors import MasreplayError, TraceValidationError
from masreplay.io import load_traces
from masreplay.vocabulary import STRATA


def _validate_file(path: str, strict_seed: bool) -> bool:
    """Prints one line per trace of ``path``; True when all are valid."""
    try:
        batch = load_traces(path, strict_seed=strict_seed, on_error="skip")
    except (MasreplayError, OSError) as error:
        print(f"{path}: INVALID {error}")
        return False
    rejected = {position: error for position, _, error in batch.rejected}
    accepted = iter(batch.trace_ids)
    for position in range(len(batch) + len(rejected)):
        if position in rejected:
            error: TraceValidationError = rejected[position]
            print(f"{path}: INVALID trace {error.trace_id!r} at {error.path or '/'}: {error.reason}")
        else:
            print(f"{path}: valid trace {next(accepted)!r}")
    return not rejected


def _stats(path: str) -> int:
    try:
        batch = load_traces(path)
    except (MasreplayError, OSError) as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    print(f"{path}:")
    print_table(stats_table(batch), values="left")
    return 0


def _convert(source_format: str, source: str, target: str) -> int:
    try:
        batch = FORMATS[source_format](source)
        write(batch, target)
    except (MasreplayError, OSError, ValueError) as error:
        print(f"masreplay convert: {error}", file=sys.stderr)
        return 1
    print(f"{target}: wrote {len(batch)} traces, {batch.num_events} events")
    print(batch.conversion_report)
    return 0


def _report(paths: Sequence[str], plot_path: str | None) -> int:
    from masreplay.report import run

    try:
        return run(paths, plot_path)
    except (MasreplayError, OSError, ImportError) as error:
        print(f"masreplay report: {error}", file=sys.stderr)
        return 1


def _version() -> str:
    try:
        return version("masreplay")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _view(source: str, trace: str | None, color: str | None, out: str | None) -> int:
    from masreplay.viewer import view

    try:
        batch = load_traces(source)
        if len(batch) == 0:
            print(f"masreplay view: {source} holds no trace", file=sys.stderr)
            return 1
        page = view(batch, trace if trace is not None else 0, color=color)
        target = out or f"{page.trace_id.replace('/', '_')}.html"
        page.save(target)
    except (MasreplayError, OSError) as error:
        print(f"masreplay view: {error}", file=sys.stderr)
        return 1
    print(f"{target}: trace {page.trace_id!r}, {len(page.data['traces'])} traces embedded (open it in a browser)")
    return 0


def _credit(args: argparse.Namespace) -> int:
    from masreplay.offline import credit_dump

    wanted = args.estimator is not None or args.normalize_by or not (args.counterfactual or args.metrics)
    options = {"estimator": args.estimator or "grpo"}
    if args.normalize_by:
        options["normalize_by"] = args.normalize_by
    try:
        summary = credit_dump(
            args.source,
            args.destination,
            advantages=options if wanted else None,
            counterfactual=args.counterfactual,
            metrics=args.metrics,
            engine=args.engine,
            memory_limit=args.memory_limit,
            resume=args.resume,
            on_error=args.on_error,
            progress=not args.quiet,
        )
    except (MasreplayError, OSError, ImportError) as error:
        print(f"masreplay credit: {error}", file=sys.stderr)
        return 1
    print(f"{args.destination}:")
    print_table(summary.rows(), values="left")
    for entry in summary.rejected:
        print(f"  rejected trace {entry['trace_id']!r} at {entry['pointer'] or '/'}: {entry['reason']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "validate":
        results = [_validate_file(path, args.strict_seed) for path in args.files]
        return 0 if all(results) else 1
    if args.command == "stats":
        return _stats(args.file)
    if args.command == "convert":
        return _convert(args.source_format, args.source, args.target)
    if args.command == "report":
        return _report(args.files, args.plot)
    if args.command == "view":
        return _view(args.source, args.trace, args.color, args.output)
    if args.command == "credit":
        return _credit(args)
    from masreplay.demo import run

    return run()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="masreplay", description=__doc__)
    parser.add_argument("--version", action="version", version=f"masreplay {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_trace_file_commands(commands)
    _add_view_command(commands)
    _add_credit_command(commands)
    commands.add_parser(
        "demo",
        help="run the main job on the bundled data, narrated",
        description="Ingest, store, sample and credit the bundled traces, explaining each step.",
    )
    return parser


def _add_trace_file_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """validate, stats, convert and report: each reads trace files and prints what it found."""
    validate = commands.add_parser(
        "validate",
        help="check trace files; exit 1 if any trace is invalid",
        description="Check trace files (JSON, JSON Lines, Parquet): one line per trace, exit 0 when all are "
        "valid and 1 otherwise.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE", help="trace files to check")
    validate.add_argument("--strict-seed", action="store_true", help="accept only the seed schema (no masreplay additions)")
    stats = commands.add_parser(
        "stats",
        help="shape statistics of a trace file",
        description="Traces, events, agents, depth, branching and event-type counts of one trace file.",
    )
    stats.add_argument("file", metavar="FILE", help="a trace file (JSON, JSON Lines, Parquet)")
    convert = commands.add_parser(
        "convert",
        help="convert Claude Code, OpenTelemetry, MARBLE or seed traces",
        description="Convert traces written by another system into masreplay's layout, then write them "
        "as seed JSON, seed JSON Lines or Parquet.",
    )
    convert.add_argument("--from", dest="source_format", required=True, choices=sorted(FORMATS), help="the input's format")
    convert.add_argument("source", help="the input file (a Claude Code session .jsonl reads its subagents/ folder too)")
    convert.add_argument("target", help="output: .json (seed JSON), .jsonl (seed JSON Lines) or .parquet")
    report = commands.add_parser(
        "report",
        help="orchestration metrics per trace-length band",
        description="Orchestration metrics of every trace (critical path, parallelism, finish rate, "
        "overheads), averaged per trace-length band.",
    )
    report.add_argument("files", nargs="+", metavar="FILE", help="trace files (JSON, JSON Lines, Parquet)")
    report.add_argument("--plot", metavar="OUT.png", help="also draw the distributions to this image file (needs matplotlib)")


def _add_view_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    viewer = commands.add_parser(
        "view",
        help="write one trace as a self-contained interactive HTML page",
        description="Writes one trace as a self-contained HTML page (no network needed to open it): agent lanes "
        "over time, the critical path, events coloured by credit, the trace's GRPO siblings and branch rollouts.",
    )
    viewer.add_argument("source", metavar="IN", help="a trace file (.json, .jsonl, .parquet) or a directory of Parquet files")
    viewer.add_argument("--trace", metavar="ID", help="the trace id to show (default: the first trace)")
    viewer.add_argument(
        "--color",
        metavar="advantage|shapley|counterfactual|COLUMN",
        help="colour events by GRPO advantage, Shapley credit, counterfactual credit, or a numeric event column or "
        "per-event reward channel (default: by event type)",
    )
    viewer.add_argument("-o", "--output", metavar="OUT.html", help="where to write the page (default: TRACE_ID.html)")


def _add_credit_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    credit = commands.add_parser(
        "credit",
        help="advantages, branch credit and metrics of a Parquet dump, in bounded memory",
        description="Advantages, counterfactual branch credit and orchestration metrics of every trace of a Parquet "
        "dump, equal to the in-memory functions, in bounded memory; a stopped run continues where it stopped.",
    )
    credit.add_argument("source", metavar="IN", help="a Parquet file, a directory of them, or a glob")
    credit.add_argument("destination", metavar="OUT", help="output directory (traces/, events/, _manifest.json)")
    credit.add_argument("--estimator", choices=["grpo", "rloo", "opo"], help="advantage estimator (default: grpo)")
    credit.add_argument("--normalize-by", nargs="+", choices=STRATA, help="strata of the statistics")
    credit.add_argument("--counterfactual", action="store_true", help="add branch credit (credit, stderr, n_branches)")
    credit.add_argument("--metrics", action="store_true", help="add the orchestration metrics per trace")
    credit.add_argument("--engine", choices=["local", "ray"], default="local", help="one machine, or Ray Data (default: local)")
    credit.add_argument("--memory-limit", default="1GB", help="working memory bound, e.g. 1GB, 512MiB (default: 1GB)")
    credit.add_argument(
        "--on-error", choices=["raise", "skip"], default="raise", help="skip (and list) invalid traces instead of stopping"
    )
    credit.add_argument("--no-resume", dest="resume", action="store_false", help="start over instead of continuing a stopped run")
    credit.add_argument("--quiet", action="store_true", help="no progress bar")


if __name__ == "__main__":
    sys.exit(main())
