"""The reward logger's Parquet dataset, wherever it lives: a local directory or an fsspec URL.

`s3://bucket/prefix/episodes` is read with s3fs, which finds its endpoint and credentials as botocore
does (`AWS_ENDPOINT_URL_S3` for an S3-compatible store, `AWS_ACCESS_KEY_ID`, an IAM role, ...).
"""

from __future__ import annotations

import os
import posixpath

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds


def locate(root: str | os.PathLike) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the path on it; a plain path stays relative to the working directory."""
    return fsspec.core.url_to_fs(os.fspath(root))


def open_dataset(root: str | os.PathLike) -> ds.Dataset | None:
    """The hive-partitioned (date=...) Parquet files under `root`; None while there are none."""
    fs, path = locate(root)
    # One listing, handed to pyarrow, instead of a second discovery walk (each is a LIST on S3).
    # A name starting with "." is a file the reward logger is still writing on a local disk.
    files = sorted(p for p in fs.find(path)
                   if p.endswith(".parquet") and not posixpath.basename(p).startswith((".", "_")))
    if not files:
        return None
    return ds.dataset(files, filesystem=fs, format="parquet", partitioning="hive", partition_base_dir=path)


def with_string_column(dataset: ds.Dataset, name: str) -> ds.Dataset:
    """`dataset` with a string column `name`, null in the files written before it existed (the schema
    is the first file's, so a column added later is otherwise not read at all)."""
    if name in dataset.schema.names:
        return dataset
    return dataset.replace_schema(dataset.schema.append(pa.field(name, pa.string())))
