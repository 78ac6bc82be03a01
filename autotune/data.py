"""Where the data folders are: next to the package in a checkout, inside it when installed."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def data_path(name: str) -> Path:
    """templates/, search_spaces/ or cache/: the checkout's copy if there, else the wheel's."""
    checkout = PACKAGE.parent / name
    if checkout.is_dir() and (PACKAGE.parent / "pyproject.toml").is_file():
        return checkout
    return PACKAGE / name


def in_checkout() -> bool:
    """True when running from a source checkout (editable install or plain PYTHONPATH)."""
    return (PACKAGE.parent / "pyproject.toml").is_file() and (PACKAGE.parent / "templates").is_dir()
