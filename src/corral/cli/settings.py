"""Where Corral keeps its files, and the client's configuration: flags, then environment
variables, then the config file (`$XDG_CONFIG_HOME/corral/config.json`, mode 0600)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def data_dir() -> Path:
    """`$CORRAL_DATA_DIR`, else `$XDG_DATA_HOME/corral`, else `~/.local/share/corral`."""
    if env := os.environ.get("CORRAL_DATA_DIR"):
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "corral"


def default_database_url(directory: Path) -> str:
    return f"sqlite:///{(directory / 'corral.db').resolve()}"


def config_path() -> Path:
    if env := os.environ.get("CORRAL_CONFIG"):
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "corral" / "config.json"


def read_config() -> dict[str, Any]:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {path}: {exc} (fix: correct or delete the file)", file=sys.stderr)
        raise SystemExit(2) from None
    return data if isinstance(data, dict) else {}


def write_config(values: dict[str, Any]) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = read_config()
    data.update(values)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # also when a stale temporary file had wider permissions
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)
    return path


def resolve_connection(server: str | None, token: str | None) -> tuple[str, str | None]:
    """The server URL and token a command uses: its flags, then `CORRAL_SERVER` and
    `CORRAL_TOKEN`, then the config file (`corral up` writes one), then the local default.
    The URL may name several replicas, `URL1,URL2` (the config file: a string or a list)."""
    from corral.client import DEFAULT_SERVER

    config: dict[str, Any] | None = None

    def from_config(key: str) -> str | None:
        nonlocal config
        if config is None:
            config = read_config()
        value = config.get(key)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return ",".join(value)  # "server": ["http://a:8400", "http://b:8400"]: replicas
        return value if isinstance(value, str) and value else None

    url = server or os.environ.get("CORRAL_SERVER") or from_config("server") or DEFAULT_SERVER
    secret = token or os.environ.get("CORRAL_TOKEN") or from_config("token")
    return url, secret
