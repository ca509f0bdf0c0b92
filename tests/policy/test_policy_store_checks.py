"""Where a router may load a published version from (`baton_policy.in_store`, `verified_copy`)."""

from __future__ import annotations

import pytest

from baton_policy import artefact_digest, in_store, verified_copy


def test_only_uris_inside_the_store_are_in_it(tmp_path):
    root = str(tmp_path / "store")
    assert in_store(f"{root}/baton/v1", root) and in_store(f"file://{root}/baton/v1", root)
    for outside in (root, f"{root}/../elsewhere/v1", f"{root}-evil/v1", "/etc", "http://169.254.169.254/x"):
        assert not in_store(outside, root), outside
    assert in_store("s3://bucket/policies/baton/v1", "s3://bucket/policies")
    for outside in ("s3://other/policies/baton/v1", "s3://bucket/policies2/v1", "gs://bucket/policies/v1",
                    "s3://bucket/policies/../secrets/v1"):
        assert not in_store(outside, "s3://bucket/policies"), outside


def test_a_copy_is_loaded_only_when_its_content_is_the_published_one(tmp_path):
    version = tmp_path / "store" / "baton" / "v1"
    version.mkdir(parents=True)
    (version / "policy.json").write_text("{}")
    digest = artefact_digest(version)
    (version / "manifest.json").write_text('{"anything": 1}')  # the store's own record: not part of it
    copy = verified_copy(str(version), digest, str(tmp_path / "store"))
    assert copy != version and (copy / "policy.json").read_text() == "{}"
    (version / "policy.json").write_text('{"routes": "elsewhere"}')
    with pytest.raises(ValueError, match="not the published"):
        verified_copy(str(version), digest, str(tmp_path / "store"))
    with pytest.raises(ValueError, match="no sha256 digest"):
        verified_copy(str(version), "", None)
