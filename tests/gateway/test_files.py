"""The gateway's files: the store on a local folder and on an fsspec store (memory://), and the
routes' multipart upload, limits and errors, without a broker (tests/e2e/test_files.py runs them
through the official client on a stack)."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from opentelemetry.trace import NoOpTracer
from starlette.applications import Starlette
from starlette.testclient import TestClient
from testbed import default_config_data

from baton_gateway.api import ApiError
from baton_gateway.auth import Principal
from baton_gateway.files import FILE_ID, FileStore
from baton_gateway.files_routes import FilesApi
from baton_gateway.routes import EXCEPTION_HANDLERS
from baton_platform.config import BatonConfig

LINES = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n\n{"custom_id": "b"}\n'


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    root = str(tmp_path / "files") if request.param == "local" else f"memory://files-{uuid.uuid4().hex}"
    return FileStore(root, max_bytes=1000)


async def test_a_file_round_trips_with_openais_file_object(store):
    made = await store.put("acme", "in.jsonl", "batch", LINES)
    assert FILE_ID.fullmatch(made["id"])
    assert made == {"id": made["id"], "object": "file", "bytes": len(LINES), "created_at": made["created_at"],
                    "filename": "in.jsonl", "purpose": "batch", "status": "processed", "expires_at": None,
                    "status_details": None}
    assert await store.get("acme", made["id"]) == made
    assert await store.content("acme", made["id"]) == LINES


async def test_another_tenant_finds_nothing(store):
    made = await store.put("acme", "in.jsonl", "batch", LINES)
    assert await store.get("other", made["id"]) is None
    assert await store.content("other", made["id"]) is None
    assert await store.delete("other", made["id"]) is False
    assert await store.list("other") == []
    assert await store.get("acme", made["id"]) is not None


@pytest.mark.parametrize("file_id", ["../acme/x", "file-../../etc", "file-" + "A" * 32, "file-abc", "", "x" * 300,
                                     "file-" + "0" * 32 + "/../x"])
async def test_an_id_the_store_did_not_mint_names_no_file(store, file_id):
    assert await store.get("acme", file_id) is None
    assert await store.content("acme", file_id) is None
    assert await store.delete("acme", file_id) is False


@pytest.mark.parametrize(("content", "fragment"), [
    (b'{"a": 1}\n[1, 2]\n', "line 2 is not a JSON object"),
    (b'{"a": 1}\n\n\n{"b": \n', "line 4 is not a JSON object"),
    (b'"text"', "line 1 is not a JSON object"),
    (b"\xff\xfe", "not UTF-8"),
    (b"\n  \n", "holds no JSON lines"),
])
async def test_a_batch_file_must_be_jsonl_and_the_first_bad_line_is_named(store, content, fragment):
    with pytest.raises(ApiError) as err:
        await store.put("acme", "in.jsonl", "batch", content)
    assert err.value.status == 400 and err.value.param == "file" and fragment in err.value.message
    assert await store.list("acme") == []


async def test_a_file_past_the_limit_is_refused_and_server_output_is_not_checked(store):
    with pytest.raises(ApiError) as err:
        await store.put("acme", "in.jsonl", "batch", b'{"a": "' + b"x" * 1000 + b'"}')
    assert err.value.status == 413
    output = await store.put("acme", "out.jsonl", "batch_output", b"x" * 2000)
    assert await store.content("acme", output["id"]) == b"x" * 2000


async def test_an_unknown_purpose_is_a_400_naming_purpose(store):
    with pytest.raises(ApiError) as err:
        await store.put("acme", "in.jsonl", "fine-tune", LINES)
    assert err.value.status == 400 and err.value.param == "purpose"


async def test_list_is_newest_first_by_purpose_and_delete_removes(store):
    first = await store.put("acme", "a.jsonl", "batch", LINES)
    second = await store.put("acme", "b.jsonl", "batch", LINES)
    output = await store.put("acme", "out.jsonl", "batch_output", b"{}\n")
    assert [f["id"] for f in await store.list("acme")] == [output["id"], second["id"], first["id"]]
    assert [f["id"] for f in await store.list("acme", purpose="batch")] == [second["id"], first["id"]]
    assert await store.delete("acme", second["id"]) is True
    assert await store.delete("acme", second["id"]) is False
    assert await store.get("acme", second["id"]) is None and await store.content("acme", second["id"]) is None
    assert [f["id"] for f in await store.list("acme")] == [output["id"], first["id"]]


async def test_on_a_local_disk_a_file_is_its_content_and_metadata_and_no_temporary_is_left(tmp_path):
    store = FileStore(str(tmp_path), max_bytes=1000)
    made = await store.put("acme", "in.jsonl", "batch", LINES)
    assert sorted(os.listdir(tmp_path / "acme")) == [f"{made['id']}.content", f"{made['id']}.json"]
    assert json.loads((tmp_path / "acme" / f"{made['id']}.json").read_text())["filename"] == "in.jsonl"


async def test_content_without_its_metadata_is_not_a_file(tmp_path):
    """A write cut between the content and the metadata leaves nothing a client can see."""
    store = FileStore(str(tmp_path), max_bytes=1000)
    (tmp_path / "acme").mkdir()
    orphan = "file-" + "0" * 32
    (tmp_path / "acme" / f"{orphan}.content").write_bytes(LINES)
    assert await store.get("acme", orphan) is None and await store.content("acme", orphan) is None
    assert await store.list("acme") == []


def test_files_live_beside_the_episodes_unless_configured():
    data = default_config_data()
    data["reward_logger"] = {"dataset_dir": "s3://bucket/data/"}
    assert BatonConfig(**data).files_dir == "s3://bucket/data/files"
    data["gateway"] = {"files_dir": "/srv/files"}
    assert BatonConfig(**data).files_dir == "/srv/files"


class Keys:
    """Api's authorize: the bearer key names its tenant; no key is a 401."""

    def authorize(self, request, scope):
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            raise ApiError(401, "no key", code="invalid_api_key")
        return Principal(auth.removeprefix("Bearer "), "k", frozenset({scope}), frozenset({"*"}))


@pytest.fixture
def http(tmp_path):
    app = Starlette(routes=FilesApi(Keys(), FileStore(str(tmp_path), max_bytes=1000), NoOpTracer()).routes(),
                    exception_handlers=EXCEPTION_HANDLERS)
    with TestClient(app, headers={"authorization": "Bearer acme"}) as client:
        yield client


def test_upload_retrieve_content_list_and_delete_over_http(http):
    made = http.post("/v1/files", files={"file": ("in.jsonl", LINES)}, data={"purpose": "batch"})
    assert made.status_code == 200, made.text
    file_id = made.json()["id"]
    assert http.get(f"/v1/files/{file_id}").json() == made.json()
    content = http.get(f"/v1/files/{file_id}/content")
    assert content.content == LINES and content.headers["content-type"] == "application/jsonl"
    listed = http.get("/v1/files", params={"purpose": "batch"}).json()
    assert listed["object"] == "list" and [f["id"] for f in listed["data"]] == [file_id]
    other = {"authorization": "Bearer other"}
    assert http.get(f"/v1/files/{file_id}", headers=other).status_code == 404
    assert http.delete(f"/v1/files/{file_id}").json() == {"id": file_id, "object": "file", "deleted": True}
    gone = http.get(f"/v1/files/{file_id}")
    assert gone.status_code == 404
    assert gone.json()["error"] == {"message": f"No such File object: {file_id}", "type": "invalid_request_error",
                                    "param": "id", "code": None}


@pytest.mark.parametrize(("files", "data", "status", "param"), [
    ({"file": ("in.jsonl", LINES)}, {"purpose": "batch_output"}, 400, "purpose"),
    ({"file": ("in.jsonl", LINES)}, {"purpose": "fine-tune"}, 400, "purpose"),
    ({"file": ("in.jsonl", LINES)}, {}, 400, "purpose"),
    (None, {"purpose": "batch", "file": "not a file"}, 400, "file"),
    ({"file": ("in.jsonl", LINES)}, {"purpose": "batch", "expires_after": "1"}, 400, "expires_after"),
    ({"file": ("in.jsonl", b'{"a": 1}\nnope\n')}, {"purpose": "batch"}, 400, "file"),
    ({"file": ("in.jsonl", b'{"a": "' + b"x" * 2000 + b'"}')}, {"purpose": "batch"}, 413, "file"),
])
def test_a_bad_upload_gets_an_openai_error(http, files, data, status, param):
    answer = http.post("/v1/files", files=files, data=data)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param
    assert http.get("/v1/files").json()["data"] == []


def test_an_upload_past_the_limit_is_refused_before_it_is_read(http):
    big = http.post("/v1/files", content=b"x" * 200_000,
                    headers={"content-type": "multipart/form-data; boundary=b"})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: cut as it arrives
        for _ in range(100):
            yield b"x" * 10_000
    chunked = http.post("/v1/files", content=chunks(), headers={"content-type": "multipart/form-data; boundary=b"})
    assert chunked.status_code == 413


def test_without_a_key_every_route_is_a_401(http):
    for method, path in (("GET", "/v1/files"), ("POST", "/v1/files"), ("GET", "/v1/files/file-x"),
                         ("GET", "/v1/files/file-x/content"), ("DELETE", "/v1/files/file-x")):
        assert http.request(method, path, headers={"authorization": ""}).status_code == 401
