"""`cobalt.storage.Spool`, the file a shard appends to: in place locally; on S3 a local spool
that resumes from the uploaded copy (whole lines only) on another machine."""

from __future__ import annotations

from pathlib import Path

from cobalt.storage import Spool, StorageConfig, content_hash, open_storage


def test_local_spool_is_the_file_itself_and_refresh_removes_it(tmp_path: Path) -> None:
    st = open_storage(StorageConfig(url=str(tmp_path / "runs")))
    directory = st.path("x", "shard")
    spool = Spool(st, directory, "records.jsonl", tmp_path / "unused")
    assert spool.finished is None and spool.local == Path(directory, "records.jsonl")
    assert spool.close() == b"" and spool.local.exists()  # an empty shard has its file
    st.write_atomic(spool.manifest, b'{"done": true}')
    assert Spool(st, directory, "records.jsonl", tmp_path).finished == {"done": True}
    fresh = Spool(st, directory, "records.jsonl", tmp_path, refresh=True)
    assert fresh.finished is None
    assert not Path(spool.manifest).exists() and not spool.local.exists()


def test_s3_spool_resumes_whole_lines_on_another_machine(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str
) -> None:
    config = StorageConfig(url=f"s3://{s3_bucket}/cobalt", endpoint_url=s3_endpoint)
    st = open_storage(config)
    directory = st.path("trajectories", "initial", "k", "shards", "0000-a")
    first = Spool(st, directory, "records.jsonl", tmp_path / "machine-1")
    assert first.local == tmp_path / "machine-1" / "records.jsonl"
    first.local.parent.mkdir(parents=True)
    first.local.write_bytes(b'{"p": 0}\n{"p": 1}\n{"p": 2')  # killed mid-line
    first.upload()
    assert st.fs.cat(first.remote) == b'{"p": 0}\n{"p": 1}\n'
    # another worker, nothing local: it starts from the uploaded lines
    second = Spool(st, directory, "records.jsonl", tmp_path / "machine-2")
    assert second.local.read_bytes() == b'{"p": 0}\n{"p": 1}\n'
    with second.local.open("ab") as f:
        f.write(b'{"p": 2}\n')
    data = second.close()
    assert st.fs.cat(second.remote) == data and data.count(b"\n") == 3
    assert content_hash(data).startswith("sha256:") and len(content_hash(data)) == 71
    st.write_atomic(second.manifest, b'{"rows": 3}')
    third = Spool(st, directory, "records.jsonl", tmp_path / "machine-3")
    assert third.finished == {"rows": 3} and not third.local.exists()  # finished: no download


def test_s3_refresh_removes_both_copies(tmp_path: Path, s3_endpoint: str, s3_bucket: str) -> None:
    st = open_storage(StorageConfig(url=f"s3://{s3_bucket}/c", endpoint_url=s3_endpoint))
    directory = st.path("d")
    st.write_atomic(f"{directory}/records.jsonl", b"old\n")
    st.write_atomic(f"{directory}/MANIFEST.json", b"{}")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "records.jsonl").write_bytes(b"old\n")
    spool = Spool(st, directory, "records.jsonl", tmp_path / "s", refresh=True)
    assert spool.finished is None and not spool.local.exists()
    assert not st.fs.exists(spool.remote) and not st.fs.exists(spool.manifest)
