"""The errors a user's input causes: each message says what to do, and the command line prints it as one line.

At the bottom of the package (it imports nothing of it), so that every layer can raise them and `cli` can catch
them without importing the layers that raise them.
"""


class UserError(Exception):
  """What `cli.run` reports as `error: ...` in one line, exit status 1.

  `every_process`: in a multi-host run, every process raises this same error at the same point (it comes from values
  all of them hold, such as the loss of a global batch or what process 0 sent to all), so no process needs telling
  (hosts.exit_with).
  """

  def __init__(self, message: str, every_process: bool = False):
    super().__init__(message)
    self.every_process = every_process


class ConfigError(UserError, ValueError):
  """A configuration the user must fix; the message says how."""


class DataError(UserError, ValueError):
  """Input data the user must fix; the message says how."""


class CheckpointError(UserError, RuntimeError):
  """A checkpoint that cannot be used or written; the message says what to do."""


class TrainingError(UserError, RuntimeError):
  """The run cannot go on; the message says why and what to do."""

