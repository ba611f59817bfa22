"""The Python client of Corral's HTTP API (`/v1`): what the command line and the node agent use.

```python
from corral.client import Client

with Client("http://127.0.0.1:8400", token) as corral:
    job = corral.submit({"name": "train", "gpus_per_replica": 4, "command": ["python", "train.py"]})
    print(corral.job(job["id"])["state"])
```

Every method returns the API's JSON shapes (DESIGN.md 4.6, 4.7) and raises `ClientError`
(status, message, fix) when the server refuses or cannot be reached. Several replicas of one
control plane: `Client("https://cp1:8400,https://cp2:8400", token)` (client/failover.py).
"""

from __future__ import annotations

from corral.client.http import DEFAULT_SERVER, Client, ClientError, JsonObject

__all__ = ["DEFAULT_SERVER", "Client", "ClientError", "JsonObject"]
