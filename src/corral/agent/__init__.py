"""The node agent: registers its node, keeps the lease by heartbeat, long-polls its start and stop
orders and runs each attempt's workers as process groups (DESIGN.md 4.3, 4.4, 6.1, 6.5)."""
