"""Tasks on several hosts at once, each host in its own planned order (virtlab.study.lanes)."""

from __future__ import annotations

import threading
import time
from collections import deque

import pytest

from virtlab.study.lanes import finished, host_queues, ready, run_by_host

A, B, C = "a", "b", "c"


def hosts(*names: str) -> frozenset[str]:
    return frozenset(names)


def test_each_host_queues_its_tasks_in_planned_order():
    queues = host_queues([hosts(A), hosts(B), hosts(A, B), hosts(A)])
    assert queues == {A: deque([0, 2, 3]), B: deque([1, 2])}
    with pytest.raises(ValueError, match="task 1 involves no host"):
        host_queues([hosts(A), frozenset()])


def test_the_next_task_of_each_free_host_is_ready():
    involved = [hosts(A), hosts(B), hosts(A), hosts(C)]
    queues = host_queues(involved)
    assert ready(queues, involved, busy=set()) == [0, 1, 3]
    assert ready(queues, involved, busy={B}) == [0, 3]
    finished(queues, involved, 0)
    assert ready(queues, involved, busy={B}) == [2, 3]


def test_a_task_of_two_hosts_waits_for_both_and_holds_both():
    involved = [hosts(A), hosts(A, B), hosts(B), hosts(A)]
    queues = host_queues(involved)
    # B's next is the two-host task, which waits for A's first: B's later task may not jump it.
    assert ready(queues, involved, busy=set()) == [0]
    finished(queues, involved, 0)
    assert ready(queues, involved, busy=set()) == [1]
    assert ready(queues, involved, busy={B}) == []
    finished(queues, involved, 1)
    assert ready(queues, involved, busy=set()) == [2, 3]


def test_a_host_done_with_its_tasks_does_not_hide_the_next_hosts():
    involved = [hosts(A), hosts(B), hosts(B)]
    queues = host_queues(involved)
    finished(queues, involved, 0)
    finished(queues, involved, 1)
    assert ready(queues, involved, busy=set()) == [2]


def test_a_task_finished_out_of_order_is_refused():
    involved = [hosts(A), hosts(A)]
    queues = host_queues(involved)
    with pytest.raises(ValueError, match="task 1 finished out of 'a'"):
        finished(queues, involved, 1)


@pytest.mark.parametrize(("host_of", "max_parallel"), [(lambda task: A, 4), (lambda task: str(task), 1)])
def test_one_host_or_one_at_a_time_runs_in_this_thread_in_planned_order(host_of, max_parallel):
    order, threads = [], set()

    def run(task: int) -> None:
        order.append(task)
        threads.add(threading.current_thread())

    run_by_host([3, 1, 2], lambda task: hosts(host_of(task)), run, max_parallel=max_parallel)
    assert order == [3, 1, 2]
    assert threads == {threading.current_thread()}


def test_hosts_run_side_by_side_each_in_its_own_order_one_task_at_a_time():
    tasks = [(A, 0), (B, 0), (A, 1), (B, 1), (A, 2), (B, 2)]
    started: dict[str, list[int]] = {A: [], B: []}
    running: dict[str, int] = {A: 0, B: 0}
    at_once, overlaps, names, lock = [0], [], set(), threading.Lock()
    both = threading.Barrier(2, timeout=10)

    def run(task: tuple[str, int]) -> None:
        host, number = task
        with lock:
            started[host].append(number)
            running[host] += 1
            if running[host] > 1:
                overlaps.append(task)
            at_once[0] = max(at_once[0], sum(running.values()))
            names.add(threading.current_thread().name.rpartition("_")[0])
        if number == 0:
            both.wait()  # A's and B's first tasks must be running at the same time to pass
        time.sleep(0.01 if host == A else 0.04)  # A's end while B's still run
        with lock:
            running[host] -= 1

    run_by_host(tasks, lambda task: hosts(task[0]), run, max_parallel=2)
    assert started == {A: [0, 1, 2], B: [0, 1, 2]}
    assert at_once[0] == 2
    assert overlaps == []
    assert names == {"virtlab-host"}


def test_a_host_with_a_long_task_does_not_hold_the_others_back():
    events, lock = [], threading.Lock()

    def run(task: tuple[str, int]) -> None:
        host, number = task
        with lock:
            events.append(("start", task))
        time.sleep(0.3 if host == A else 0.01)
        with lock:
            events.append(("end", task))

    run_by_host([(A, 0), (B, 0), (B, 1), (B, 2)], lambda task: hosts(task[0]), run, max_parallel=2)
    assert events.index(("end", (B, 2))) < events.index(("end", (A, 0)))


def test_max_parallel_bounds_the_hosts_at_once():
    at_once, now, lock = [0], [0], threading.Lock()

    def run(task: str) -> None:
        with lock:
            now[0] += 1
            at_once[0] = max(at_once[0], now[0])
        time.sleep(0.01 if task == A else 0.08)  # A's end first: a slot frees while two still wait
        with lock:
            now[0] -= 1

    outstanding, most = [0], [0]  # started and not yet done: a task never waits queued for a worker

    def start(task: str) -> None:
        outstanding[0] += 1
        most[0] = max(most[0], outstanding[0])

    def done(task: str, result: None) -> None:
        outstanding[0] -= 1

    run_by_host([A, B, C, A, B, C], lambda task: hosts(task), run, max_parallel=2, start=start, done=done)
    assert at_once[0] == 2
    assert most[0] == 2


def test_a_failing_task_stops_new_ones_and_its_error_is_raised():
    ran = []

    def run(task: tuple[str, int]) -> None:
        ran.append(task)
        if task == (A, 0):
            raise RuntimeError("boom")
        time.sleep(0.05)
        raise RuntimeError("later")  # B's fails too, after A's: the first error is the one raised

    with pytest.raises(RuntimeError, match="boom"):
        run_by_host([(A, 0), (B, 0), (A, 1), (B, 1)], lambda task: hosts(task[0]), run, max_parallel=2)
    assert (A, 1) not in ran and (B, 1) not in ran
    assert (B, 0) in ran


@pytest.mark.parametrize("host_of", [lambda task: A, lambda task: task[0]])
def test_start_and_done_are_called_in_this_thread_with_each_result(host_of):
    main = threading.current_thread()
    calls, lock = [], threading.Lock()

    def start(task: tuple[str, int]) -> None:
        calls.append(("start", task, threading.current_thread() is main))

    def run(task: tuple[str, int]) -> str:
        time.sleep(0.01)
        return f"{task[0]}{task[1]}"

    def done(task: tuple[str, int], result: str) -> None:
        assert result == f"{task[0]}{task[1]}"  # each result comes with its own task
        with lock:
            calls.append(("done", result, threading.current_thread() is main))

    tasks = [(A, 0), (B, 0), (A, 1)]
    run_by_host(tasks, lambda task: hosts(host_of(task)), run, max_parallel=2, start=start, done=done)
    assert all(in_main for _, _, in_main in calls)
    assert sorted(what for kind, what, _ in calls if kind == "start") == sorted(tasks)
    assert sorted(what for kind, what, _ in calls if kind == "done") == ["a0", "a1", "b0"]
    assert [c for c in calls if c[1] in ("a0", "a1")] == [("done", "a0", True), ("done", "a1", True)]


def test_ctrl_c_keeps_the_results_of_the_running_tasks_and_starts_no_more():
    # max_parallel 2: A's and B's first run, C's is queued for a worker when Ctrl-C comes.
    import _thread

    results = []

    b_started = threading.Event()

    def run(task: tuple[str, int]) -> str:
        if task == (A, 0):
            b_started.wait(10)
            _thread.interrupt_main()  # Ctrl-C while B's first task still runs
            return "a0"
        b_started.set()
        time.sleep(0.2)
        return f"{task[0]}{task[1]}"

    with pytest.raises(KeyboardInterrupt):
        run_by_host(
            [(A, 0), (B, 0), (C, 0), (A, 1), (B, 1)],  # C's waits for a worker: it must not start
            lambda task: hosts(task[0]),
            run,
            max_parallel=2,
            done=lambda task, result: results.append(result),
        )
    assert sorted(results) == ["a0", "b0"]
