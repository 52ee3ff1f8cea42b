"""The AMCT compression service: REST API, database, artifact store. See docs/service.md."""
