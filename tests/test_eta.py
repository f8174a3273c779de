"""The estimate of a study's time left: fixed figures, then a simulated study with a known truth."""

import random

import pytest

from virtlab.eta import Durations, expected_s, relative_error, remaining_s, stored_durations
from virtlab.progress import eta_text
from virtlab.schedule import Task, plan_rounds

FAST, SLOW = ("native", "fast"), ("native", "slow")


def trials(cell, count, start=0):
    return [Task(*cell, index) for index in range(start, start + count)]


def test_nothing_measured_is_no_estimate_and_shows_a_question_mark():
    assert remaining_s(trials(FAST, 3), Durations()) is None
    assert eta_text(None) == "?"
    assert remaining_s([], Durations()) == 0.0  # nothing left: nothing to wait for


def test_before_any_trial_the_warmups_stand_for_their_cells():
    durations = Durations()
    durations.add(Task(*FAST, None), 0.1)
    durations.add(Task(*SLOW, None), 2.0)
    assert remaining_s(trials(FAST, 3) + trials(SLOW, 3), durations) == pytest.approx(3 * 0.1 + 3 * 2.0)


def test_a_cell_own_trials_come_before_its_warmups_and_their_median_before_their_mean():
    durations = Durations()
    durations.add(Task(*SLOW, None), 10.0)
    for seconds in (1.0, 5.0, 1.2):  # the first trial placed the files: 5 s
        durations.add(Task(*SLOW, 0), seconds)
    assert expected_s(Task(*SLOW, 3), durations) == pytest.approx(1.2)
    assert expected_s(Task(*SLOW, None), durations) == pytest.approx(10.0)  # a warm-up by warm-ups


def test_a_warmup_left_is_estimated_by_its_cell_trials_when_no_warmup_has_run():
    durations = Durations()
    durations.add(Task(*SLOW, 0), 2.0)
    durations.add(Task(*FAST, None), 0.1)
    assert expected_s(Task(*SLOW, None), durations) == pytest.approx(2.0)


def test_a_cell_not_measured_takes_the_same_workload_elsewhere_then_anything_measured():
    durations = Durations()
    durations.add(Task("native", "pi", 0), 2.0)
    durations.add(Task("native", "pi", 1), 4.0)
    durations.add(Task("container", "pi", None), 6.0)
    durations.add(Task("native", "dd", 0), 100.0)
    # pi in the VM: pi's times in the other environments, warm-ups included (median of 2, 4, 6).
    assert expected_s(Task("vm", "pi", 0), durations) == pytest.approx(4.0)
    # A workload run nowhere yet: the median of every task measured (2, 4, 6, 100).
    assert expected_s(Task("vm", "zstd", 0), durations) == pytest.approx(5.0)


def test_the_tasks_of_a_failed_cell_take_no_time():
    durations = Durations()
    durations.add(Task(*FAST, 0), 0.5)
    durations.add(Task(*SLOW, 0), 3.0)
    left = [Task(*cell, index) for index in (1, 2) for cell in (SLOW, FAST)]  # interleaved
    assert remaining_s(left, durations, skipped={SLOW}) == pytest.approx(1.0)
    assert remaining_s(left, durations) == pytest.approx(7.0)


def test_stored_trials_seed_a_resumed_study():
    durations = stored_durations([(SLOW, 2.0), (SLOW, 2.2), (FAST, 0.1)])
    assert durations.trials == {SLOW: [2.0, 2.2], FAST: [0.1]}
    assert durations.warmups == {}
    assert remaining_s(trials(SLOW, 2, 2), durations) == pytest.approx(4.2)


def test_relative_error():
    assert relative_error(13.0, 10.0) == pytest.approx(0.3)
    assert relative_error(7.0, 10.0) == pytest.approx(-0.3)
    assert relative_error(None, 10.0) is None
    assert relative_error(5.0, 0.0) is None


def simulated_study(order, seed):
    """A study of cells whose true times differ by 40x, each trial's time drawn with 10% noise
    around its cell's, after 300 s of provisioning (an image build and two VM boots)."""
    rng = random.Random(seed)
    true_s = {("native", "fast"): 0.1, ("native", "slow"): 2.0, ("vm", "fast"): 0.4, ("vm", "slow"): 4.0}
    cells = [("native", "fast"), ("vm", "fast"), ("native", "slow"), ("vm", "slow")]
    rounds = plan_rounds(cells, {}, trials=10, warmups=1, order=order, seed=seed)
    tasks = [task for tasks in rounds for task in tasks]
    taken = [true_s[task.cell] * rng.lognormvariate(0, 0.1) for task in tasks]
    return tasks, taken, 300.0


@pytest.mark.parametrize("order", ["interleave", "shuffle"])
@pytest.mark.parametrize("seed", range(5))
def test_on_a_simulated_study_the_eta_is_near_the_truth_from_the_first_round_on(order, seed):
    tasks, taken, provisioning_s = simulated_study(order, seed)
    durations = Durations()
    errors, old_errors = [], []
    for done, (task, seconds) in enumerate(zip(tasks, taken, strict=True), start=1):
        durations.add(task, seconds)
        truth = sum(taken[done:])
        if done >= len(tasks) // 10 and truth > 0:  # from 10% of the study on
            errors.append(relative_error(remaining_s(tasks[done:], durations), truth))
            # What progress_line used to print: the elapsed time, provisioning included, per task.
            elapsed = provisioning_s + sum(taken[:done])
            old_errors.append(relative_error(elapsed / done * (len(tasks) - done), truth))
    assert max(abs(error) for error in errors) <= 0.30
    assert max(abs(error) for error in old_errors) > 1.0  # the old ETA: far off at first


def test_the_first_trials_of_a_study_whose_cells_are_unmeasured_need_the_warmups():
    """Without warm-ups, the first trials of the slow cells are unknown until they have run once: the
    estimate then comes from the fast cells and is too low; it is right once every cell has run."""
    tasks = trials(FAST, 1) + trials(SLOW, 1) + trials(FAST, 1, 1) + trials(SLOW, 1, 1)
    durations = Durations()
    durations.add(tasks[0], 0.1)
    assert remaining_s(tasks[1:], durations) == pytest.approx(0.3)  # 3 x 0.1: slow not yet seen
    durations.add(tasks[1], 2.0)
    assert remaining_s(tasks[2:], durations) == pytest.approx(2.1)
