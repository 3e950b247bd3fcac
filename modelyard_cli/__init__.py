"""``modelyard``: the command-line client CI pipelines use against the REST API."""
