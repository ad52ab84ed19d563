"""Reading `fairserve serve`'s banner from a pipe, as the benchmarks and the tests start it.

On a pipe (not a terminal) the banner names the files holding the secrets (`api_key_file: PATH`) rather
than printing them (gateway/cli/serve_run.py `shown_banner`), so a reader that wants the secret itself
reads the file; this is the one place that knows it.
"""

from __future__ import annotations

from pathlib import Path

SECRETS = ("api_key", "metrics_token", "admin_token")  # in print order: admin_token ends the banner


def banner_entry(line: str) -> tuple[str, str] | None:
    """(key, value) of one `key: value` banner line, a `SECRET_file: PATH` line read into (SECRET, secret);
    None for a line that is not `key: value`."""
    key, sep, value = line.strip().partition(": ")
    if not sep:
        return None
    secret = key.removesuffix("_file")
    if key != secret and secret in SECRETS:
        return secret, Path(value).read_text().strip()
    return key, value
