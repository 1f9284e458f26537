"""The one exception type for a bad setting: it names the field, the value and what is allowed."""


class ConfigError(ValueError):
    """A configuration value that cannot work, caught before any tensor or file is touched."""

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r} is invalid: allowed {allowed}")

    def __reduce__(self):
        # rebuilt from its three parts: a parallel sweep's worker process pickles a failed job's error
        return type(self), (self.field, self.value, self.allowed)


class SweepConfigError(ConfigError):
    """A setting that would fail every job of a ``-m`` sweep alike: it stops the sweep instead of
    being recorded as one failed run."""


class DirectoryHoldsRun(ConfigError):
    """The run directory holds an earlier run's results, and this run does not continue it: the error
    is this attempt's, so it is not recorded in that directory."""
