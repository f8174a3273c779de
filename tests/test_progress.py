"""The live display: provisioning may report before the trials are counted."""

import io

from rich.console import Console

from virtlab.progress import RichProgress


def test_provisioning_lines_before_start_then_trials_with_a_total():
    out = io.StringIO()
    progress = RichProgress(Console(file=out, force_terminal=True, width=120))
    progress.trial("vm", "provisioning", "image: mmdebstrap I: retrieving Packages")
    [task] = progress._progress.tasks
    assert task.description == "provisioning @ vm · image: mmdebstrap I: retrieving Packages"
    assert task.total is None  # not known yet: no ETA invented
    progress.start(total=4)
    progress.trial("vm", "pi", "trial 1")
    progress.advance()
    assert (task.total, task.completed, task.description) == (4, 1, "pi @ vm · trial 1")
    progress.note("a note")
    progress.stop()
    assert "a note" in out.getvalue() and "1/4" in out.getvalue()
