"""morphpipe's tests, grouped as morphpipe/ is; a package so that helpers import as `tests.<folder>.conftest`."""
