"""Slurm's array and dependency syntax: what parses, what each condition needs, and clear errors."""

from __future__ import annotations

import pytest

from corral.cli.batch_script import command, directives
from corral.config.array_spec import (
    MET,
    NEVER,
    WAIT,
    Progress,
    judge,
    parse_array,
    parse_dependency,
)
from corral.core.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "indices", "cap"),
    [
        ("0-99%8", tuple(range(100)), 8),
        ("0-15:4", (0, 4, 8, 12), 0),
        ("1,3,5-7", (1, 3, 5, 6, 7), 0),
        ("7", (7,), 0),
        ("10-12,0-1%1", (0, 1, 10, 11, 12), 1),
        (" 2-5:2 ", (2, 4), 0),
    ],
)
def test_array_specs(text: str, indices: tuple[int, ...], cap: int) -> None:
    spec = parse_array(text)
    assert spec.indices == indices and spec.max_running == cap


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "names no task"),
        ("%4", "names no task"),
        ("5-1", "the range 5-1 ends before it begins"),
        ("0-9:0", "the step of 0-9:0 must be at least 1"),
        ("0-9%0", "%N needs a whole number of at least 1"),
        ("0-9%x", "%N needs a whole number"),
        ("1,1", "task 1 is named twice"),
        ("a-b", "'a-b' is not an index, a range or a stepped range"),
        ("-3", "is not an index"),
        ("0-200000", "makes more than 100,000 tasks"),
    ],
)
def test_bad_array_specs_say_what_is_wrong_and_how_to_write_it(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_array(text)
    assert says in err.value.detail and err.value.where == "--array"
    assert err.value.fix


def test_dependencies() -> None:
    dep = parse_dependency("afterok:j1:j2,afterany:j3_4,singleton")
    assert dep.on == (("afterok", "j1"), ("afterok", "j2"), ("afterany", "j3_4")) and dep.singleton
    assert parse_dependency("singleton").on == ()
    assert parse_dependency("after:j1,afternotok:j1").targets == ("j1",)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("afterok", "names no job"),
        ("afterok:", "names no job"),
        ("afterok:j1?afterany:j2", "`?` (any one of) is not supported"),
        ("aftercorr:j1", "'aftercorr' is not a dependency type"),
        ("afterok:j1+10", "is not a job id"),
        ("afterok:$(rm)", "is not a job id"),
    ],
)
def test_bad_dependencies(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_dependency(text)
    assert says in err.value.detail and err.value.fix


def test_what_each_condition_needs() -> None:
    waiting, running = Progress(1), Progress(1, started=1)
    ok, failed = Progress(1, 1, finished=1), Progress(1, 1, not_ok=1)
    assert [judge("after", p) for p in (waiting, running, ok)] == [WAIT, MET, MET]
    assert [judge("afterany", p) for p in (running, ok, failed)] == [WAIT, MET, MET]
    assert [judge("afterok", p) for p in (running, ok, failed)] == [WAIT, MET, NEVER]
    assert [judge("afternotok", p) for p in (running, ok, failed)] == [WAIT, NEVER, MET]
    array = Progress(3, started=3, finished=2)  # one task still running
    assert judge("afterok", array) == WAIT and judge("afterany", array) == WAIT
    assert judge("afterok", Progress(3, 3, finished=2, not_ok=1)) == NEVER
    assert judge("afternotok", Progress(3, 3, finished=2, not_ok=1)) == MET


def test_corral_lines_of_a_script() -> None:
    text = "#!/bin/bash\n#SBATCH --gpus 2\n#CORRAL --gpus 4  # four\n#CORRAL --env 'A=a b'\n"
    text += "echo\n#CORRAL --x\n"
    assert directives(text) == ["--gpus", "4", "--env", "A=a b"]
    assert directives("#!/bin/sh\n#CORRALX --gpus 1\n") == []
    with pytest.raises(ConfigError, match="line 2"):
        directives("#!/bin/sh\n#CORRAL --name 'open\n")
    from pathlib import Path

    assert command(Path("/x/run.py"), "#!/usr/bin/env python3\nprint(1)\n", ["a"]) == [
        "/usr/bin/env",
        "python3",
        "-c",
        "#!/usr/bin/env python3\nprint(1)\n",
        "run.py",
        "a",
    ]
