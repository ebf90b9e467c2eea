"""Prefect's result storage on S3 (`tasks/storage.py`) against the real Prefect API and moto's S3:
the saved results block holds no credential; with --storage-block it refers to the user's block,
without one the worker's environment supplies them."""

from __future__ import annotations

import asyncio
import json

import pytest
from prefect.client.orchestration import get_client
from prefect.filesystems import RemoteFileSystem

from cobalt.storage import Storage, StorageConfig
from tasks.storage import ResultStorage, key_storage, result_storage

SECRET = "cobalt-secret-access-key-0123456789"
AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def stored(name: str) -> tuple[str, dict]:
    """A saved block document as the API holds it: its own data (JSON) and its references."""

    async def read():
        async with get_client() as client:
            doc = await client.read_block_document_by_name(
                name, block_type_slug="cobalt-result-storage", include_secrets=True
            )
            return doc

    doc = asyncio.run(read())
    own = {k: v for k, v in doc.data.items() if k not in doc.block_document_references}
    return json.dumps(own), doc.block_document_references


@pytest.mark.usefixtures("prefect_harness")
def test_the_results_block_refers_to_the_users_block(s3_endpoint, s3_bucket, monkeypatch):
    user = RemoteFileSystem(
        basepath=f"s3://{s3_bucket}/elsewhere", settings={"key": "user-key", "secret": SECRET}
    )
    user.save("cobalt-test-storage", overwrite=True)
    config = StorageConfig(
        url=f"s3://{s3_bucket}/run", endpoint_url=s3_endpoint, block="cobalt-test-storage"
    )
    block = result_storage(Storage(config))
    name = block._block_document_name

    own, refs = stored(name)
    assert SECRET not in own and "user-key" not in own  # no copy of the credentials...
    assert refs["credentials"]["block_document"]["name"] == "cobalt-test-storage"  # ...a reference

    # The credentials are the user's block's, read when used: a new secret there is used here.
    RemoteFileSystem(
        basepath=user.basepath, settings={"key": "user-key", "secret": SECRET + "-rotated"}
    ).save("cobalt-test-storage", overwrite=True)
    loaded = ResultStorage.load(name)
    assert loaded.credentials.settings["secret"] == SECRET + "-rotated"

    for var in AWS_ENV:  # no credential in the environment: they come from the block only
        monkeypatch.delenv(var, raising=False)
    loaded.write_path("probe", b"result")
    assert ResultStorage.load(name).read_path("probe") == b"result"
    assert key_storage(Storage(config)).credentials.settings["secret"] == SECRET + "-rotated"


@pytest.mark.usefixtures("prefect_harness")
def test_without_a_block_the_credentials_come_from_the_environment(s3_endpoint, s3_bucket):
    config = StorageConfig(url=f"s3://{s3_bucket}/run", endpoint_url=s3_endpoint)
    block = result_storage(Storage(config))
    own, refs = stored(block._block_document_name)
    assert json.loads(own)["settings"] == {"endpoint_url": s3_endpoint} and not refs
    block.write_path("probe", b"result")  # AWS_* from the environment (tests/conftest.py)
    assert ResultStorage.load(block._block_document_name).read_path("probe") == b"result"
