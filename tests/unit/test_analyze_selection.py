"""A selection that selects nothing is an error, not a healthy save (issue 19 point 2): a script
gating on the verdict must not read `--rank 99` or an empty window as a clean checkpoint."""
import pytest
from unit_helpers import REPO, assert_one_line_error, run_slotscope

pytestmark = pytest.mark.unit

SAMPLE = str(REPO / "analyzer" / "sample")      # 8 ranks, recorded 04:55:45 .. 04:56:10 UTC


def test_a_rank_the_capture_does_not_hold():
    assert_one_line_error(run_slotscope("analyze", "--json", "--rank", "99", SAMPLE),
                          "no rank 99 in the capture (ranks 0-7)")
    assert_one_line_error(run_slotscope("analyze", "--rank", "3", "--rank", "12", SAMPLE), "no rank 12 ")
    assert run_slotscope("analyze", "--rank", "3", SAMPLE).returncode == 0


def test_a_window_that_selects_nothing_or_is_reversed():
    assert_one_line_error(run_slotscope("analyze", "--since", "3000", SAMPLE),
                          "nothing was recorded in the window", "the capture spans 2026-12-05T04:55:45.167")
    assert_one_line_error(run_slotscope("analyze", "--json", "--since", "30", "--until", "20", SAMPLE),
                          "--since 30 is not before --until 20")
    assert run_slotscope("analyze", "--since", "20", "--until", "30", SAMPLE).returncode == 0


@pytest.mark.parametrize("command", ["analyze", "record", "dump", "export", "top", "doctor", "demo"])
def test_every_command_says_its_exit_status(command):
    text = " ".join(run_slotscope(command, "--help").stdout.split())
    assert "exit status: 0 done; 1 an error, said in one line on stderr" in text
    assert ("the command's own status" in text) == (command == "record")


def test_cli_polish_version_tables_and_counts():
    """Issue 19 point 11: --version; dump names its tables and refuses an unknown one in one line
    ("unknown table", not "no rows in table"); demo --ranks must be at least 1."""
    from slotscope.capture.meta import slotscope_version
    from slotscope.capture.tables import TABLES
    res = run_slotscope("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"slotscope {slotscope_version()}"
    helptext = " ".join(run_slotscope("dump", "--help").stdout.split())
    assert "the table to print: " + ", ".join(sorted(TABLES)) in helptext
    assert_one_line_error(run_slotscope("dump", "-t", "nosuch", SAMPLE), "unknown table 'nosuch' (tables: agent, ")
    zero = run_slotscope("demo", "--ranks", "0")
    assert zero.returncode == 2 and "--ranks: 0 is not at least 1" in zero.stderr
