"""Where config files are looked up: $GLM53CTL_CONFIG_DIR, then the checkout, then the package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from glm53ctl.errors import ConfigError

ENV_CONFIG_DIR = "GLM53CTL_CONFIG_DIR"


def checkout_root() -> Path | None:
    """The source checkout this glm53ctl runs from (an editable install), if any."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").exists() and (root / "configs" / "models").is_dir() else None


def shipped_root() -> Path:
    """The configs/ of the checkout (editable install) or of the installed package."""
    if (checkout := checkout_root()) is not None:
        return checkout / "configs"
    from importlib.resources import files

    return Path(str(files("glm53ctl.configs_data")))


def config_roots() -> list[Path]:
    """Where to look, first match wins: $GLM53CTL_CONFIG_DIR (must exist), then the shipped configs."""
    roots = []
    env = os.environ.get(ENV_CONFIG_DIR)
    if env:
        if not Path(env).is_dir():
            if Path(env).exists():  # a file (a tuned file, say) where its folder was meant
                raise ConfigError(
                    f"{ENV_CONFIG_DIR}={env}: is a file, not a folder",
                    hint=f"set it to a folder holding tuned/<model>/tp<T>.json (and models/), "
                    f"or unset {ENV_CONFIG_DIR}",
                )
            raise ConfigError(f"{ENV_CONFIG_DIR}={env}: no such folder", hint=f"create it or unset {ENV_CONFIG_DIR}")
        roots.append(Path(env))
    roots.append(shipped_root())
    if os.environ.get("GLM53CTL_DEBUG_CONFIG"):
        print(f"glm53ctl: config roots {', '.join(map(str, roots))}", file=sys.stderr)
    return roots


def config_root() -> Path:
    """The root tuned files are read from and written to: the first of config_roots()."""
    return config_roots()[0]


def read_text(path: Path) -> str:
    """A config file's text; anything that keeps it from being read is a ConfigError naming it."""

    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror})") from None


def tuned_path(model: str, tp: int, root: Path | None = None) -> Path:
    return (root or config_root()) / "tuned" / model / f"tp{tp}.json"
