"""Examples around the engine: the Fashion-MNIST loader and CNN, `make demo` and `make samples`.

Not part of the installed packages: they run from a checkout (tests and bench import them too).
"""
