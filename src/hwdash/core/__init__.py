"""The pure core: catalog, estimator, fit, alerts. Imports only the standard library and pydantic."""
