"""What `igrpo` prints: progress bars, one line per finished phase, the final table, and no avoidable noise.

`quiet()` runs first thing in `igrpo`, before Prefect is imported. Each setting below is ours only where the
user has set nothing (environment, Prefect profile): turning a thing back on is the library's usual switch.

- Prefect's ephemeral server: analytics off (its telemetry insert races the flow's own writes to the
  server's sqlite file: `database is locked` tracebacks on a busy machine), 120 s to start instead of 20
  (a loaded 2-core machine needs ~40), and its console handler at WARNING: per-task state lines repeat our
  phase lines; errors and a failing task's traceback still show, and a real server's UI still gets every log.
- TRL 1.16 calls transformers 5's deprecated `is_gradient_checkpointing` and
  `gradient_checkpointing_enable/disable` around every GRPO generation (PEFT reads the first when it wraps
  a LoRA model): FutureWarnings no setting of ours avoids (the config builders already pass the new
  `activation_checkpointing`, see `pipeline.passthrough.checkpointing_defaults`).
- Trainer prints each logged dict (every step in GRPO) under its progress bar: those go to MLflow; the bar stays.
- transformers' "Loading weights" / "Writing model shards" bars and datasets' map bars: a dozen per round,
  each under a second at the quickstart's size (downloads from the hub keep their bars).
- MLflow's "Creating initial MLflow database tables" INFO lines when the sqlite store is first made.
- MLflow's "View run ... / View experiment ..." links, printed at the end of every run on a tracking server: two a
  phase; `igrpo run` names the parent run and the server once, at its end.
- Prefect's "--- Error logging to API ---" once the run's servers lost their database (`DatabaseDown`): the run's one
  error, which names it, is then the last thing printed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings

PHASE_LOGGER = "pipeline"  # `pipeline.phases` logs one line per finished phase at INFO

_TRL_DEPRECATED_CALLS = r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated"


def quiet() -> None:
    """Set the console up for `igrpo`: our phase lines on, avoidable third-party noise off (see the module doc)."""
    prefect_defaults()
    warnings.filterwarnings("ignore", message=_TRL_DEPRECATED_CALLS, category=FutureWarning)
    if "MLFLOW_LOGGING_LEVEL" not in os.environ:
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    _hf_bars_off()
    _phase_lines_on()


def prefect_defaults() -> None:
    """igrpo's Prefect settings, each only where the user set none (environment, .env, prefect.toml, profile)."""
    from prefect.settings import Settings

    settings = Settings()  # environment, .env, prefect.toml and the active profile: what the user has set
    ours = {}
    if "analytics_enabled" not in settings.server.model_fields_set:
        ours["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    if "startup_timeout_seconds" not in settings.server.ephemeral.model_fields_set:
        ours["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
    user_logging = {"level", "config_path"} & settings.logging.model_fields_set
    if not user_logging and "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL" not in os.environ:
        ours["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] = "WARNING"  # read when Prefect sets its logging up
    os.environ.update(ours)  # the ephemeral server, a subprocess, reads them from here
    import prefect.context

    refresh = getattr(prefect.context, "refresh_global_settings_context", None)
    if ours and refresh:  # this process's settings were read on import
        refresh()


def _hf_bars_off() -> None:
    import huggingface_hub.utils as hub
    from transformers import trainer, trainer_callback
    from transformers.utils import logging as hf_logging

    downloads_on = not hub.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # transformers' own bars; it turns the hub's off with them
    if downloads_on:
        hub.enable_progress_bars()
    if "HF_DATASETS_DISABLE_PROGRESS_BARS" not in os.environ:
        import datasets

        datasets.disable_progress_bars()

    class BarOnly(trainer_callback.ProgressCallback):
        """Trainer's progress bar without the logged dict printed under it at every logging step."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

    if trainer.DEFAULT_PROGRESS_CALLBACK is trainer_callback.ProgressCallback:  # not in a notebook
        trainer.DEFAULT_PROGRESS_CALLBACK = BarOnly


class DatabaseDown(logging.Filter):
    """On Prefect's console handlers during `igrpo run`: once the run's servers say they lost their database (`down()`
    gives why: `flows.postgres.database_down`), Prefect's ERROR records (the failing task's and flow's tracebacks, each
    logged as it fails, before the cause is known) are dropped, and the run stops with the one error that names it
    (flows/cli.py). Asked at most once a second, and only on an ERROR record: a run whose database is up shows them."""

    def __init__(self, down):
        super().__init__()
        self.down, self.why, self.asked = down, None, float("-inf")

    def reason(self) -> str | None:
        """Why the database is down: as found while the run ran, else asked now; None if it is up."""
        if self.why is None:
            self.why, self.asked = self.down(), time.monotonic()
            if self.why:  # Prefect's log worker says so (stdlib-style) at each batch it fails to send, exit included
                logging.raiseExceptions = False
        return self.why

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.name.startswith("prefect"):
            return True
        if time.monotonic() - self.asked >= 1:
            self.reason()
        return self.why is None


@contextlib.contextmanager
def database_errors_folded(down):
    """`DatabaseDown(down)` on the console handlers of Prefect's loggers (and the root's) while the block runs."""
    fold = DatabaseDown(down)
    handlers = {h for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs")
                for h in logging.getLogger(name).handlers if isinstance(h, logging.StreamHandler)}
    for h in handlers:
        h.addFilter(fold)
    try:
        yield fold
    finally:
        for h in handlers:
            h.removeFilter(fold)


class _PhaseFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno == logging.INFO else f"{record.levelname}: {record.name}: {text}"


def _phase_lines_on() -> None:
    logger = logging.getLogger(PHASE_LOGGER)
    if any(getattr(h, "igrpo", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.igrpo = True
    handler.setFormatter(_PhaseFormatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # shown once, here, whatever handlers Prefect puts on the root logger
