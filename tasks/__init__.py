"""Pipeline stages as plain functions with thin Prefect `@task` wrappers.

`problems` is the normalised problem record every stage reads; `storage` the one storage setting
(local directory or S3-compatible) shared by datasets and Prefect's results and cache records;
`data` the data stage (sources -> clean, verified, versioned problem sets).
"""
