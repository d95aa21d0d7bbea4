"""Where config files are looked up (STYLE.md 11): $GLM53CTL_CONFIG_DIR, then the checkout, then the package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_CONFIG_DIR = "GLM53CTL_CONFIG_DIR"


def checkout_root() -> Path | None:
    """The source checkout this glm53ctl runs from (an editable install), if any."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").exists() and (root / "configs" / "models").is_dir() else None


def config_root() -> Path:
    tried = []
    env = os.environ.get(ENV_CONFIG_DIR)
    if env:
        tried.append(env)
        root = Path(env)
    elif (checkout := checkout_root()) is not None:
        root = checkout / "configs"
        tried.append(str(root))
    else:
        from importlib.resources import files

        root = Path(str(files("glm53ctl.configs_data")))
        tried.append(str(root))
    if os.environ.get("GLM53CTL_DEBUG_CONFIG"):
        print(f"glm53ctl: config root {root} (tried: {', '.join(tried)})", file=sys.stderr)
    return root


def tuned_path(model: str, tp: int, root: Path | None = None) -> Path:
    return (root or config_root()) / "tuned" / model / f"tp{tp}.json"
