"""Tasks on several hosts at once, each host keeping its own order: pure scheduling and its runner.

A study's round is a list of tasks in the order the plan asks (interleave, shuffle). Each task
involves one host or more (a network path holds both ends' hosts). A host runs one task at a time,
its own tasks in their planned order: a task starts when it is the next of every host it involves
and none of them is busy. Tasks on different hosts run side by side, at most ``max_parallel`` at
once. On one host this is the planned order, one task after another, as a study has always run.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

_SETTLE_S = 0.01
T = TypeVar("T")
R = TypeVar("R")
Host = Hashable


def host_queues(hosts_of: Sequence[frozenset[Host]]) -> dict[Host, deque[int]]:
    """Each host's tasks (their indices) in planned order."""
    queues: dict[Host, deque[int]] = {}
    for index, hosts in enumerate(hosts_of):
        if not hosts:
            raise ValueError(f"task {index} involves no host")
        for host in hosts:
            queues.setdefault(host, deque()).append(index)
    return queues


def ready(
    queues: Mapping[Host, deque[int]], hosts_of: Sequence[frozenset[Host]], busy: set[Host]
) -> list[int]:
    """The tasks that may start now, in planned order: each the next of every host it involves,
    none of those hosts busy. Two of them never share a host."""
    found: list[int] = []
    taken: set[Host] = set(busy)
    for queue in queues.values():
        if not queue:
            continue
        index = queue[0]
        hosts = hosts_of[index]
        if index in found or hosts & taken:
            continue
        if all(queues[host][0] == index for host in hosts):
            found.append(index)
            taken |= hosts
    return sorted(found)


def finished(queues: Mapping[Host, deque[int]], hosts_of: Sequence[frozenset[Host]], index: int) -> None:
    """Task ``index`` is done: it leaves the head of each of its hosts' queues."""
    for host in hosts_of[index]:
        if queues[host][0] != index:
            raise ValueError(f"task {index} finished out of {host!r}'s order")
        queues[host].popleft()


def run_by_host(
    tasks: Sequence[T],
    hosts_of: Callable[[T], frozenset[Host]],
    run: Callable[[T], R],
    max_parallel: int,
    start: Callable[[T], None] = lambda task: None,
    done: Callable[[T, R], None] = lambda task, result: None,
    admits: Callable[[Sequence[T], T], bool] | None = None,
) -> None:
    """Runs every task, each host's in planned order, tasks on different hosts at once (at most
    ``max_parallel``). ``start`` and ``done`` are called in this thread, just before a task runs and
    as soon as it has returned, so that what they record (a store, a display) sees one thread;
    ``run`` may be called in another. With one host, or ``max_parallel`` 1, everything runs in this
    thread, in planned order. ``run`` must not raise (a task's failure is its result); if it does,
    no new task starts, the running ones end (``done`` is called for them), and the first error is
    raised here. Ctrl-C in this thread waits for the running tasks (their results are kept).
    ``admits(running, task)``, when given, must also agree before a ready task starts (the memory
    of the environments provisioning at once); a task it refuses waits for a later turn, and when
    nothing runs and it refuses every ready task, the tasks left are not run."""
    involved = [hosts_of(task) for task in tasks]
    queues = host_queues(involved)
    if len(queues) <= 1 or max_parallel <= 1:
        for task in tasks:
            if admits is not None and not admits([], task):
                return
            start(task)
            done(task, run(task))
        return
    busy: set[Host] = set()
    running: dict[Future[None], int] = {}
    error: BaseException | None = None
    # Each result goes to the outbox the moment its task returns (deque.append is atomic), so that
    # a Ctrl-C that lands anywhere here, even inside submit, loses no finished task's result.
    outbox: deque[tuple[int, R]] = deque()
    begun: set[int] = set()
    ended: set[int] = set()

    def work(index: int) -> None:
        begun.add(index)
        try:
            outbox.append((index, run(tasks[index])))
        finally:
            ended.add(index)

    def deliver() -> None:
        while outbox:
            index, result = outbox.popleft()
            done(tasks[index], result)

    pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="virtlab-host")
    try:
        while True:
            if error is None:
                # Only as many as there are free workers: a task never waits queued, so that a
                # Ctrl-C starts nothing more.
                for index in ready(queues, involved, busy):
                    if len(running) >= max_parallel:
                        break
                    if admits is not None and not admits([tasks[i] for i in running.values()], tasks[index]):
                        continue
                    busy |= involved[index]
                    start(tasks[index])
                    running[pool.submit(work, index)] = index
            if not running:
                break
            finished_now, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished_now:
                index = running.pop(future)
                busy -= involved[index]
                finished(queues, involved, index)
                error = error or future.exception()
            deliver()
    except KeyboardInterrupt:
        # Nothing new starts; the running tasks end on their own and their results are kept. A
        # Ctrl-C inside submit can leave a task running on a thread the pool has not recorded yet
        # (shutdown does not wait for it): wait for every task that began until it has ended.
        _settle(pool, begun, ended)
        deliver()
        raise
    finally:
        pool.shutdown(wait=True)
    if error is not None:
        raise error


def _settle(pool: ThreadPoolExecutor, begun: set[int], ended: set[int]) -> None:
    """Waits until every task that began has ended, whatever further Ctrl-C comes meanwhile: a task
    whose result were dropped would leave what it made (a VM half-provisioned) to nobody."""
    while True:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            while not begun <= ended:
                time.sleep(_SETTLE_S)
            return
        except KeyboardInterrupt:
            continue
