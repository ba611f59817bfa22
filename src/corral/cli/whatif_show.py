"""What `corral whatif` and the `--what-if` of `corral queues set` / `corral admin policy` share:
the proposal built from flags, the replay, and the side-by-side tables (or JSON)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli.remote import EXIT_REFUSED, fail, print_json
from corral.cli.whatif_data import counts_text, decision_json, fetch, report_path

if TYPE_CHECKING:
    from corral.client import Client

WhatIfOpt = Annotated[
    bool,
    typer.Option(
        "--what-if", help="first replay recent history under the change, show it, ask (docs/whatif.md)"
    ),
]
SinceOpt = Annotated[str, typer.Option("--since", help="with --what-if: the window replayed (e.g. 7d)")]
ReportOpt = Annotated[
    Path | None, typer.Option(help="with --what-if: write its HTML report here (a name: the dashboard's)")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="with --what-if: apply without asking")]
ForceOpt = Annotated[bool, typer.Option("--force", help="apply without the what-if the server requires")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="with --force: why (kept with the revision)")]


def proposal_of(
    corral: Client,
    export: Mapping[str, Any],
    policy: str | None,
    args: Mapping[str, Mapping[str, Any]],
    queues: Path | None,
    revision: int | None,
    queue_change: tuple[str, Mapping[str, Any]] | None = None,
) -> tuple[dict[str, Any], str]:
    """(the proposed configuration, a few words naming the change)."""
    from corral.sim.whatif import proposed_body

    if queues is not None and revision is not None:
        fail("--queues and --revision both propose queues", "give one of them")
    revision_body, queue_list, words = None, None, []
    if revision is not None:
        revision_body = corral.revision(revision)["config"]
        words.append(f"revision {revision}")
    if queues is not None:
        queue_list = _queues_file(queues)
        words.append(f"queues of {queues.name}")
    if queue_change is not None:
        words.append(
            f"queue {queue_change[0]}: "
            + ", ".join(f"{k}={v}" for k, v in queue_change[1].items() if v is not None)
        )
    if policy is not None:
        words.append(f"policy {policy}")
    if args:
        words.append(", ".join(f"{p}.{k}={v}" for p, kv in args.items() for k, v in kv.items()))
    if not words:
        fail("nothing proposed", "give --queues FILE, --revision N, --policy P or --arg PLUGIN.KEY=VALUE")
    body = proposed_body(
        export["config"], queues=queue_list, revision_body=revision_body, policy=policy, args=args or None,
        queue_change=queue_change,
    )  # fmt: skip
    return body, "; ".join(words)


def _queues_file(path: Path) -> list[dict[str, Any]]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")
    except yaml.YAMLError as exc:
        fail(f"{path}: not YAML ({exc})")
    found = data.get("queues") if isinstance(data, dict) else data
    if not isinstance(found, list) or not all(isinstance(q, dict) for q in found):
        fail(
            f"{path}: no list of queues",
            "write `queues: [{name: research, quota: 16}, ...]` as in a cluster file",
        )
    return found


def compute(
    export: Mapping[str, Any], proposed: Mapping[str, Any], change: str, report: Path | None
) -> dict[str, Any]:
    """The what-if's result; a bad window or proposal exits 2 with the error (nothing applied)."""
    from corral.core.errors import ConfigError
    from corral.sim.whatif_run import what_if

    try:
        return what_if(export, proposed, change, report)
    except ConfigError as exc:
        fail(str(exc))


def run_and_show(
    export: Mapping[str, Any], proposed: Mapping[str, Any], change: str, report: Path | None, as_json: bool
) -> dict[str, Any]:
    result = compute(export, proposed, change, report)
    if as_json:
        print_json(json.loads(json.dumps(result, default=float)))
    else:
        show(result)
    return result


def _fmt(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _signed(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    text = fmt.format(value)
    return text if text.startswith("-") or value == 0 else "+" + text


def show(result: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from corral.sim.whatif_compare import MEASURES

    console = Console(width=max(120, Console().width))
    console.print(f"[bold]{result['fidelity_text']}[/bold]")
    fid = Table("queue", "jobs", "live avg wait (s)", "replayed avg wait (s)", "difference", "within")
    for queue, f in result["fidelity"]["queues"].items():
        error = "-" if f["error"] is None else f"{f['error']:.1%}"
        fid.add_row(
            queue, str(f["jobs"]), f"{f['live_avg_wait']:.3f}", f"{f['replayed_avg_wait']:.3f}",
            f"{f['difference_s']:+.3f} s ({error})", "yes" if f["within"] else "NO",
        )  # fmt: skip
    console.print(fid)
    console.print(
        "differences the replay cannot have: the live scheduler's cycle spacing (>= 20 ms) and the "
        "agents' start latency add to live waits (here up to "
        f"{result['fidelity']['latency_s']:.3g} s, p90, for jobs the replay starts at once)"
    )
    days = result["window"]["days"]
    console.print(f"window: {days:.3g} days; {counts_text(result['counts'])}")
    console.print(f"baseline: configuration revision {result['revision']}; proposed: {result['change']}")
    for queue in result["baseline"]:
        table = Table(f"[bold]{queue}[/bold]", "baseline", "proposed", "difference")
        for key, label, fmt, _ in MEASURES:
            b, p = result["baseline"][queue].get(key), result["proposed"].get(queue, {}).get(key)
            table.add_row(
                label, _fmt(b, fmt), _fmt(p, fmt), _signed(result["difference"][queue].get(key), fmt)
            )
        console.print(table)
    if result.get("report"):
        console.print(f"report: {result['report']}")


def confirm_and_decide(
    corral: Client,
    export: Mapping[str, Any],
    proposed: Mapping[str, Any],
    change: str,
    report: Path | None,
    yes: bool,
    as_json: bool,
) -> dict[str, Any]:
    """Run the what-if, show it, ask (unless --yes); the decision to send with the change."""
    result = compute(export, proposed, change, report)
    if not as_json:
        show(result)
    if not yes and not typer.confirm("apply this change?", default=False, err=True):
        typer.echo("not applied", err=True)
        raise typer.Exit(EXIT_REFUSED)
    return {**decision_json(result), "_result": result}


def decide(
    corral: Client,
    what_if: bool,
    since: str,
    report: Path | None,
    yes: bool,
    force: bool,
    reason: str,
    as_json: bool,
    propose: Any,
) -> dict[str, Any]:
    """The decision a change carries: a what-if's evidence (`propose(export)` gives the proposed
    configuration and the change's words), and/or `--force` with its reason."""
    if force and not reason.strip():
        fail("--force needs a reason", 'add --reason "why this cannot wait for a what-if"')
    decision: dict[str, Any] = {"force": True, "reason": reason} if force else {}
    if not what_if:
        if report is not None or yes:
            fail("--report and --yes go with --what-if", "add --what-if")
        return decision
    export = fetch(corral, since, None)
    proposed, change = propose(export)
    where = report_path(report, corral.reports()) if report is not None else None
    decision.update(confirm_and_decide(corral, export, proposed, change, where, yes, as_json))
    return decision


def print_decided(out: Mapping[str, Any], result: Mapping[str, Any] | None, as_json: bool, text: str) -> None:
    """The change's answer; with --json and a what-if, one document holding both."""
    if as_json:
        shown = (
            dict(out) if result is None else {**out, "what_if": json.loads(json.dumps(result, default=float))}
        )
        print_json(shown)
        return
    typer.echo(
        text + ("; the what-if is kept with it (`corral queues history`)" if result is not None else "")
    )


def evidence_text(evidence: dict[str, Any] | None) -> str:
    """`what-if 7d, 812 jobs, report R: <summary>` or `forced: <reason>`; empty when none."""
    if not evidence:
        return ""
    parts = []
    if evidence.get("what_if"):
        w = evidence["what_if"]
        report = f", report {w['report']}" if w.get("report") else ""
        parts.append(f"what-if {w['window_days']:.3g}d, {w['jobs']} jobs{report}: {w['summary']}")
    if evidence.get("forced"):
        parts.append(f"forced: {evidence['forced']['reason']}")
    return "; ".join(parts)
