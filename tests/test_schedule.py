from virtlab.schedule import Task, cells_needing_more, next_trial, plan_rounds

CELLS = [("native", "pi"), ("vm", "pi"), ("native", "stream"), ("vm", "stream")]


def test_rounds_interleave_every_cell_before_the_next_trial():
    rounds = plan_rounds(CELLS, {}, trials=3, warmups=1)
    assert len(rounds) == 4
    assert rounds[0] == [Task(env, wl, None) for env, wl in CELLS]
    for index, tasks in enumerate(rounds[1:]):
        assert [task.cell for task in tasks] == CELLS
        assert {task.trial for task in tasks} == {index}


def test_resume_skips_stored_trials_and_complete_cells():
    done = {("native", "pi"): {0, 1, 2}, ("vm", "pi"): {0}}
    rounds = plan_rounds(CELLS, done, trials=3, warmups=1)
    # the complete cell gets no warm-up and no trial; vm/pi continues at its 2nd trial
    assert ("native", "pi") not in {task.cell for tasks in rounds for task in tasks}
    vm_pi = [task.trial for tasks in rounds for task in tasks if task.cell == ("vm", "pi")]
    assert vm_pi == [None, 1, 2]
    stream = [task.trial for tasks in rounds for task in tasks if task.cell == ("native", "stream")]
    assert stream == [None, 0, 1, 2]


def test_shuffle_is_a_seeded_permutation_of_each_round():
    plain = plan_rounds(CELLS, {}, trials=4, warmups=0)
    shuffled = plan_rounds(CELLS, {}, trials=4, warmups=0, order="shuffle", seed=7)
    again = plan_rounds(CELLS, {}, trials=4, warmups=0, order="shuffle", seed=7)
    assert shuffled == again
    assert [sorted(t.cell for t in r) for r in shuffled] == [sorted(t.cell for t in r) for r in plain]
    assert any([t.cell for t in a] != [t.cell for t in b] for a, b in zip(shuffled, plain, strict=True))


def test_nothing_to_do_when_all_cells_are_complete():
    assert plan_rounds(CELLS, dict.fromkeys(CELLS, {0, 1, 2, 3, 4}), trials=5, warmups=2) == []


def test_adaptive_picks_only_noisy_cells_below_the_limit():
    spreads = {("native", "pi"): 0.10, ("vm", "pi"): 0.01, ("native", "stream"): 0.2, ("vm", "stream"): None}
    counts = {("native", "pi"): 5, ("vm", "pi"): 5, ("native", "stream"): 20}
    assert cells_needing_more(spreads, counts, target_cov_pct=5, limit=20) == [("native", "pi")]


def test_resume_fills_in_a_trial_missing_from_the_middle():
    """Trial 1 of native/pi removed by hand: it is run again under its own number, nothing else of
    that cell is (its trials 0 and 2 stay), and it still gets its warm-up first."""
    done = {cell: {0, 1, 2} for cell in CELLS} | {("native", "pi"): {0, 2}}
    rounds = plan_rounds(CELLS, done, trials=3, warmups=1)
    assert rounds == [[Task("native", "pi", None)], [Task("native", "pi", 1)]]


def test_a_cells_next_trial_comes_after_its_highest_stored_one():
    assert next_trial({0, 2}) == 3 and next_trial({0, 1}) == 2 and next_trial(set()) == 0
