"""The host adapters, one per serving runtime, behind ``modelyard_agent.host_agents.HostAgent``."""
