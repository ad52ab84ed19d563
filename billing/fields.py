"""The one definition of every stored usage field's width: models, migrations' tests and the edge read it here.

A value the edge accepts must fit the column that stores it, or the request is answered and its row is
refused by the database (free service). So each string that reaches `usage` has its maximum length here;
`billing/models.py` sizes its columns with it and the gateway's header and body checks cap with it.
Changing a width needs a migration (tests/billing/test_fields.py compares the migrated schema with these).
"""

from __future__ import annotations

from typing import Final

# Caller-chosen identifiers. X-Request-Id is replaced by a fresh id when longer (gateway/edge/middleware.py);
# X-Task-Id and X-Workflow-Run-Id get a 400 when longer (gateway/openai/parsing.py).
REQUEST_ID_MAX: Final = 128
TASK_ID_MAX: Final = 200
WORKFLOW_RUN_ID_MAX: Final = 200
# The body's `model` (400 when longer, gateway/openai/schemas.py); it must also equal the served model's
# name, so a model named longer than this is refused on every request rather than answered unbilled.
MODEL_MAX: Final = 128
# Ids the gateway makes (uuid4 strings), never the caller's.
TENANT_ID_MAX: Final = 128  # usage.tenant_id; tenants.id itself is a 36-character uuid
UUID_MAX: Final = 36
# Closed vocabularies (billing/records.py USAGE_STATUSES, CANCEL_STATES, engine finish reasons).
STATUS_MAX: Final = 16
FINISH_REASON_MAX: Final = 16
CANCEL_STATE_MAX: Final = 16
DEGRADATION_MAX: Final = 16  # fallback | partial | truncated (gateway/openai/served.py)

# usage column -> its maximum length, for the schema test and the quarantine's diagnosis.
USAGE_STRING_WIDTHS: Final[dict[str, int]] = {
    "tenant_id": TENANT_ID_MAX,
    "request_id": REQUEST_ID_MAX,
    "api_key_id": UUID_MAX,
    "task_id": TASK_ID_MAX,
    "workflow_run_id": WORKFLOW_RUN_ID_MAX,
    "model": MODEL_MAX,
    "status": STATUS_MAX,
    "finish_reason": FINISH_REASON_MAX,
    "cancel_state": CANCEL_STATE_MAX,
    "served_model": MODEL_MAX,
    "degradation": DEGRADATION_MAX,
}
