"""The one exception every workload module raises for bad input."""


class TraceError(ValueError):
    """A trace, trace file or workload request is malformed.

    The message is one line and, for files, names the file, the line (or JSON
    entry) and the field that is wrong, so a CLI can print it as is.
    """


def where(path, line, field: str | None = None) -> str:
    """Prefix for a file error: ``path:line: field``."""
    prefix = f"{path}:{line}"
    return f"{prefix}: {field}" if field else prefix
