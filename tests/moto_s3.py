"""A real S3-compatible server (moto's) on a free local port, for the datasets' s3:// paths.

The code under test is pointed at it the way a production user points Baton at MinIO, Ceph or R2:
with `AWS_ENDPOINT_URL_S3`, which botocore (and so s3fs) honours, and ordinary credentials.
tests/conftest.py registers this module as a plugin: a test asks for `s3_url` by name.
"""

from __future__ import annotations

import socket
import uuid

import pytest


@pytest.fixture(scope="session")
def s3_server():
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_url(s3_server, monkeypatch):
    """`s3://<a new, empty bucket>`, with the environment pointing S3 clients at the local server."""
    import fsspec

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    fsspec.filesystem("s3").clear_instance_cache()  # a cached client would not see the environment
    bucket = f"baton-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3").mkdir(bucket)
    return f"s3://{bucket}"
