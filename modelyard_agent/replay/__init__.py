"""The replay gate's host side: captured requests sent again to the serving version and to a candidate.

``captures`` reads the gateway's capture files (one JSON line per
captured request, see ``captures.CapturedRequest``); ``compare`` compares two KServe v2 responses
output by output and sums up a replay; ``triton`` runs one replay on a Triton host, beside what it
serves. The orchestrator uses ``compare.Tolerances`` too, so the tolerances it accepts are the ones the
agent applies.
"""
