"""Systems under test: the protocol the runner drives (``base``) and the engines behind it (``reference``)."""
