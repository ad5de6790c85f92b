"""Layer 5, wire: the published payloads (chunk, status, label, cohort, attention), their schemas
and topics."""
