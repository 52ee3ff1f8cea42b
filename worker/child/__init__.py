"""Entry points that run in the sandboxed child process (they load user TorchScript)."""
