"""`corral submit --array/--dependency`, batch scripts with `#CORRAL` lines, arrays in `corral jobs`,
`show`, `cancel`, `hold` and `release`, against a real server."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import Cli


def test_an_array_is_one_line_and_expands_on_request(cli: Cli) -> None:
    out = cli.ok("submit", "--queue", "research", "--name", "sweep", "--array", "0-9%3", "--", "true").stdout
    array = out.split()[0]
    assert "array of 10 tasks (0-9%3, at most 3 at once)" in out
    listing = cli.ok("jobs").stdout
    lines = [line for line in listing.splitlines() if "sweep" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{array}[0-9]") and "10 pending" in lines[0]
    expanded = [line for line in cli.ok("jobs", "--expand").stdout.splitlines() if "sweep" in line]
    assert [line.split()[0] for line in expanded] == [f"{array}_{i}" for i in range(10)]
    assert cli.ok("show", array).stdout.count("at most 3 running") == 1
    assert cli.ok("hold", f"{array}_3").stdout.strip() == f"{array}_3: pending (held)"
    assert "10 pending" in cli.ok("hold", array).stdout
    cli.ok("release", array)
    tasks = cli.json("jobs", "--array", array)["jobs"]
    assert len(tasks) == 10 and not any(t["held"] for t in tasks)
    assert cli.ok("cancel", array).stdout.strip() == f"{array}: array of 10 tasks: 10 cancelled"


def test_dependency_flag_and_bad_specs(cli: Cli) -> None:
    first = cli.json("submit", "--queue", "research", "--", "true")["id"]
    out = cli.ok("submit", "--queue", "research", "--dependency", f"afterok:{first}", "--", "true").stdout
    assert out.rstrip().endswith(f"waits for {first} to finish successfully")
    bad = cli("submit", "--queue", "research", "--array", "5-1", "--", "true")
    assert bad.exit_code != 0 and "the range 5-1 ends before it begins" in bad.output
    unknown = cli("submit", "--queue", "research", "--dependency", "afterany:j777", "--", "true")
    assert unknown.exit_code != 0 and "no job or array j777" in unknown.output


def test_a_batch_script_carries_its_flags_and_the_command_line_wins(cli: Cli, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/bash\n"
        "# a comment\n"
        "#CORRAL --name from-script --queue research\n"
        "#CORRAL --time-limit 2h --env A=1 --array 0-3%2\n"
        "\n"
        'echo "task $SLURM_ARRAY_TASK_ID" "$@"\n'
        "#CORRAL --name ignored-after-the-first-command\n"
    )
    out = cli.ok("submit", "--json", "--time-limit", "30m", "--env", "B=2", script, "x", "y").stdout
    array = json.loads(out)
    assert array["tasks"] == 4 and array["max_running"] == 2 and array["name"] == "from-script"
    task = cli.json("show", array["first_task"])
    assert task["time_limit"] == 1800  # the command line wins
    assert task["command"][:3] == ["/bin/bash", "-c", script.read_text()]
    assert task["command"][3:] == ["train.sh", "x", "y"]
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\n#CORRAL --no-such-flag 1\ntrue\n")
    result = cli("submit", bad)
    assert result.exit_code != 0 and "no-such-flag" in result.output
