"""How a settings tree is read: flags over `FAIRSERVE_*` variables over an optional TOML file over the
defaults (`LayeredSettings.load`), the data directory every command shares, and the one-line-per-setting
error text commands print. The trees themselves are in gateway/settings.py."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any, Self

from pydantic import Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from billing import default_db_url

ENV_PREFIX = "FAIRSERVE_"
ENV_NESTED_DELIMITER = "__"
# The data directory every command shares (serve, tenants, keys, usage, db): one default, one variable.
DEFAULT_DATA_DIR = Path("./fairserve-data")

# The TOML file of the settings being built: pydantic-settings builds its sources per class, so the file
# chosen by `--config` for one load reaches `settings_customise_sources` through this variable.
_config_file: ContextVar[Path | None] = ContextVar("fairserve_config_file", default=None)


class LayeredSettings(BaseSettings):
    """A settings tree read from flags, then FAIRSERVE_* variables, then a `--config` TOML file (`load`)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        arbitrary_types_allowed=True,
        validate_default=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (passed as init values), then the environment, then the `--config` TOML file."""
        toml_file = _config_file.get()
        if toml_file is None:
            return init_settings, env_settings
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=toml_file)

    @classmethod
    def load(cls, flags: dict[str, Any] | None = None, config_file: Path | None = None) -> Self:
        """The effective settings: `flags` (a nested dict of what the command line set) over the
        FAIRSERVE_* environment over `config_file` over the defaults. Raises pydantic's ValidationError."""
        if config_file is not None and not config_file.is_file():
            raise ValueError(f"config file {config_file} does not exist")
        token = _config_file.set(config_file)
        try:
            return cls(**(flags or {}))
        finally:
            _config_file.reset(token)


class DataDirSettings(LayeredSettings):
    """The data directory every command shares."""

    data_dir: Path = Field(default=DEFAULT_DATA_DIR, description="database, secrets, ledger spill and models")


class StorageSettings(DataDirSettings):
    """Where a deployment keeps its state: shared by `serve` and the db/tenants/keys/usage commands, so a
    command run after `make serve` finds the server's database without being told."""

    db_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL (default: SQLite in the data dir)",
        json_schema_extra={"flags": ["--db"]},
    )

    def database_url(self) -> str:
        """The configured URL, else the SQLite file in the data directory (which this creates)."""
        return self.db_url or default_db_url(self.data_dir)


def settings_error_text(exc: Exception) -> str:
    """One line per bad setting, `path: reason`, for a command's stderr."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    lines = []
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"]) or "settings"
        lines.append(f"{path}: {error['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)
