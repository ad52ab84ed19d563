"""fairserve_client: the openai SDK's clients, using what a fairserve server offers.

```python
from fairserve_client import FairServe
client = FairServe(base_url="http://127.0.0.1:8000/v1", api_key=KEY, deadline_in=30)
with client.task() as task:  # one X-Task-Id; cancelled on the server if the block raises
    out = client.completions.create(model="fairserve-tiny", prompt="Hello", max_tokens=16)
```

Retries of one call share the SDK's idempotency key (sent as `Idempotency-Key`), so the server
generates and bills them once; a call's `X-Deadline` is fixed at its first attempt and no retry is
sent that could not start before it; `X-Workflow-Run-Id` and `X-Attempt` reach the ledger. See
README.md beside this file, and for the packaging choice pyproject.toml.
"""

from fairserve_client.calls import DeadlineExceeded
from fairserve_client.client import AsyncFairServe, FairServe
from fairserve_client.task import AsyncTask, Task, current_task_id

__all__ = ["AsyncFairServe", "AsyncTask", "DeadlineExceeded", "FairServe", "Task", "current_task_id"]
