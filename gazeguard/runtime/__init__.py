"""Layer 8, runtime: the sidecar and the fleet — pipeline, label stream, cohort aggregator, ingest,
MQTT, JetStream, service, dashboard."""
