"""ddp-doctor's version: a leaf module, so what prints it (the CLI, the HTML report's footer) imports no
package above it (``ddp_doctor/__init__`` reaches the probe and the session through ``watch()``)."""

__version__ = "0.1.0"
