"""``dsh batch``: the click command; running the tasks is :mod:`dsh.batch`.

Imported on demand by :class:`dsh.cli.root.DshGroup`.
"""

from __future__ import annotations

from pathlib import Path

import click

from dsh.cli.options import MODE_HELP
from dsh.cli.options import agent_overrides
from dsh.cli.options import parse_limits
from dsh.cli.shared import State
from dsh.cli.shared import pass_state


@click.command()
@click.argument("tasks", metavar="TASKS.jsonl")
@click.option("--results", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Append result lines to FILE (default: stdout); its record is FILE.journal.")
@click.option("--workers", type=click.IntRange(min=1), default=4, show_default=True,
              help="Tasks running at once.")
@click.option("-a", "--agent", help="Agent of tasks that name none (default: the config's).")
@click.option("-m", "--model", help="Model of tasks that name none.")
@click.option("-o", "--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Model option of every task (a task's own options win; repeatable).")
@click.option("-L", "--limit", "limits", multiple=True, metavar="KEY=VALUE",
              help="Budget limit of the whole batch, across all workers (repeatable).")
@click.option("--task-limit", "task_limits", multiple=True, metavar="KEY=VALUE",
              help="Budget limit of each task (repeatable).")
@click.option("--retries", type=click.IntRange(min=0), default=0, show_default=True,
              help="Runs again a task that failed, up to N more times.")
@click.option("--executor", default="local", show_default=True,
              help="Where tasks run: local (threads), or an executor a plugin adds.")
@click.option("--ordered", is_flag=True, help="Write result lines in input order.")
@click.option("--mode", metavar="MODE", default=None, help=MODE_HELP)
@click.option("--yes", is_flag=True, help="Approve every tool call that would ask.")
@pass_state
def batch(state: State, tasks: str, results: Path | None, workers: int, agent: str | None,
          model: str | None, options: tuple[str, ...], limits: tuple[str, ...],
          task_limits: tuple[str, ...], retries: int, executor: str, ordered: bool,
          mode: str | None, yes: bool) -> None:
    """Run every task of TASKS.jsonl (`-`: stdin), one JSON object a line.

    A task has an `id`, a `prompt`, and optionally `input`, `agent`, `model`, `options`,
    `session`. One result line per task (the `dsh run --json` object plus `id`). Running
    the same command again skips completed tasks and runs what is left (docs/batch.md).
    Exit codes: 0 all completed, 1 some failed or left, 3 batch limit reached, 130
    interrupted.
    """
    overrides = agent_overrides(model, None, None, options, mode)
    batch_limits, each = parse_limits(limits), parse_limits(task_limits)
    from dsh.batch.runner import run_batch

    code = run_batch(state.app, tasks, results=results, workers=workers, agent=agent,
                     overrides=overrides, limits=batch_limits, task_limits=each,
                     retries=retries, executor=executor, ordered=ordered, approve=yes)
    click.get_current_context().exit(code)
