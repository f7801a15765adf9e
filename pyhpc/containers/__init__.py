"""The framework image: its spec rendered to a Containerfile or Apptainer ``.def``, its
offline build, and the command line that starts a task inside it."""
