"""The Prefect layer: `@task` wrappers of the library's stages (`cobalt/`), their content cache
policies (caching.py), where Prefect keeps results and cache records (storage.py), and the
reports as artifacts. Nothing here computes what a stage produces."""

import tasks.storage  # noqa: F401  (installs the Prefect block loader for storage credentials)
