"""The one error type of model building (a ``ValueError``: bad input, exit code 2)."""


class ModelBuildError(ValueError):
    """A model could not be fetched, checked or converted; the message says what and why."""
