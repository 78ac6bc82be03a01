"""Reading Optuna trials as the tests see them."""

from autotune.space import Config


def enqueued_config(trial) -> str | None:
    """The config text an enqueued trial of a one-template study holds (its fixed params,
    waiting or asked; None where it was not enqueued)."""
    fixed = trial.system_attrs.get("fixed_params")
    if not fixed:
        return None
    template = next(iter(fixed)).split(".")[0]
    return str(Config.make(template, {k.split(".", 1)[1]: v for k, v in fixed.items()}))
