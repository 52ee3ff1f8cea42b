"""The job process: the only code that loads a user's model. It imports the engine and nothing of the API."""
