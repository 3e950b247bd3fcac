"""Formats the registry accepts and the agent checks again, free of Django: archives (``archives``),
Triton model configs (``triton_config``) and the file names they may name (``triton_paths``), and
the name grammar (``names``)."""
