"""What every config dataclass shares: the error a bad setting raises (stdlib only)."""


class ConfigError(ValueError):
    """A setting that cannot work; the message names the setting and its value."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
