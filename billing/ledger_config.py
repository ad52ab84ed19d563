"""The ledger's knobs (a node of the settings tree) and where its spill, journal and quarantine files live."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from billing.db import Database


class LedgerConfig(BaseModel):
    """The ledger's knobs: a node of the settings tree (`[ledger]`, FAIRSERVE_LEDGER__*, `--ledger-*`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    buffer_size: int = Field(
        default=10_000, ge=1, description="usage rows buffered before they spill to disk"
    )
    batch_size: int = Field(default=500, ge=1, description="usage rows per SQL insert")
    flush_interval_s: float = Field(default=0.5, gt=0, description="seconds between ledger writes")
    spill_path: str | None = Field(
        default=None, description="file of rows the buffer could not hold (default: <data_dir>/ledger.spill)"
    )
    max_backoff_s: float = Field(default=5.0, gt=0, description="longest wait between failed ledger writes")
    data_dir: str | None = Field(
        default=None, description="where the spill file goes when spill_path is unset"
    )
    journal: bool = Field(
        default=True, description="journal each row before buffering it (<spill path minus suffix>.journal)"
    )
    journal_segment_bytes: int = Field(
        default=4 << 20, ge=1, description="the live journal segment is closed past this size"
    )
    orphan_scan_s: float = Field(
        default=5.0, gt=0, description="how often the writer looks for journals of gateways that died since"
    )


def spill_path(db: Database, config: LedgerConfig) -> Path:
    """Where the ledger spills (and, beside it, journals and quarantines): `spill_path`, else `data_dir`, else
    next to a SQLite database file, else ./data."""
    if config.spill_path:
        return Path(config.spill_path)
    if config.data_dir:
        return Path(config.data_dir) / "ledger.spill"
    database = db.url.database or ""
    if db.dialect == "sqlite" and database and database != ":memory:" and not database.startswith("file:"):
        return Path(database).expanduser().resolve().parent / "ledger.spill"
    return Path("data") / "ledger.spill"
