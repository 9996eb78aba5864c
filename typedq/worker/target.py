"""What a worker runs: the tasks, queues and schedules of its target (a task or an app)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..schedule import Schedule
from ..task import Registry, Task, TaskBase, check_queues, expand_queues

__all__ = ["WorkerScope"]


@dataclass(frozen=True)
class WorkerScope:
    """The tasks a worker runs, the queues it takes jobs from and the schedules it fires."""

    app: Registry
    tasks: dict[str, Task[Any, Any]]
    queues: list[str]
    schedules: list[Schedule[Any]]
    #: Whether the worker may delete the broker state of schedules not in ``schedules``
    #: (only a worker of the whole app knows them all).
    prune_schedules: bool

    @classmethod
    def of(
        cls,
        target: Task[Any, Any] | Registry,
        queues: Sequence[str] | None,
        *,
        allow_unknown_queues: bool,
    ) -> WorkerScope:
        """The scope of ``Worker(target, queues=...)``; a ConfigError for one that cannot
        work (a producer stub, a queue shared with tasks it cannot run, an unknown queue).
        """
        if isinstance(target, TaskBase) and not isinstance(target, Task):
            raise ConfigError(
                f"{target!r} is a producer stub: workers run tasks registered with @app.task"
            )
        if isinstance(queues, str):
            raise ConfigError(
                f"queues must be a list of queue names, got the string {queues!r}; "
                f"pass queues=[{queues!r}]"
            )
        if isinstance(target, Task):
            if queues is not None:
                raise ConfigError(
                    f"Worker({target.name}) runs the queue of its task ({target.queue!r}); "
                    "queues= is for a worker of a whole app: app.worker(queues=[...])"
                )
            task: Task[Any, Any] = target
            app = task.app
            # A worker fails jobs whose task it does not know, so it must not consume a
            # queue that also carries tasks it cannot run.
            others = sorted(
                t.name for t in app.tasks.values() if t.queue == task.queue and t.name != task.name
            )
            if others:
                raise ConfigError(
                    f"queue {task.queue!r} also carries tasks {others} that "
                    f"Worker({task.name}) cannot run; give {task.name!r} its own queue "
                    "(@app.task(queue=...)) or run them all with app.worker()"
                )
            # Only this task's schedules: the app's others are not this worker's to
            # reconcile (nor to prune).
            schedules = [s for s in app.schedules.values() if s.task is task]
            return cls(app, {task.name: task}, list(task.queues), schedules, False)
        app = target
        if not app.tasks:
            raise ConfigError(f"app {app.name!r} has no tasks: register some with @app.task")
        if queues and not allow_unknown_queues:
            check_queues(
                app.tasks.values(), queues, app=app.name, insist="allow_unknown_queues=True"
            )
        queues = expand_queues(app.tasks.values(), queues) if queues else app.queues
        return cls(app, dict(app.tasks), list(queues), list(app.schedules.values()), True)
