"""The fleet simulator: many node agents in one process over the agents' real HTTP API, to load
a control plane as a real cluster would (`python -m corral.fleet`), and the shadow replay's
comparison of two event logs (`corral.fleet.shadow`)."""
