"""Runs batches: each line is a request through the same path as an interactive one (auth, models,
budgets, workflows, episodes), behind it in priority.

Which replica runs a batch: the one that owns its home partition of baton.responses (a partition the
replica that created it owned then), so that when a replica stops or dies, the one that takes the
partition over goes on with it.
Nothing runs twice: each line carries an idempotency key of its own (tenant, batch, custom_id), so a
line the last replica had started is joined, not run again, and the answers so far are kept as parts
in the file store (`<files_dir>/_batches/<batch id>/`), so lines already answered are not asked again.

Priority: a replica runs at most `gateway.batch_concurrency` lines at once, and starts none while more
than `gateway.batch_yield_waiting` interactive requests wait on it: batches take only the capacity
interactive traffic leaves. Lines do not count against their key's request and token rates (the
tenant's budget holds them, as any request).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import posixpath
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from opentelemetry import trace
from opentelemetry.trace import Span, Tracer

from baton_gateway.api import ApiError
from baton_gateway.auth import Principal
from baton_gateway.batches import Batch, Batches, Line, parse_lines
from baton_gateway.files import FileStore, write_atomic
from baton_gateway.idempotency import IdempotencyKey
from baton_platform.config import GatewayConfig
from baton_platform.dataset import locate

log = logging.getLogger(__name__)

TICK_S = 0.5
PART_EVERY_S = 2.0
BUDGET_WAIT_S = 1.0  # a line refused while the tenant's running requests hold its budget waits this long


# Runs one line's request body as its endpoint would: (request id, answer body), or an ApiError.
Complete = Callable[[bytes, Principal, Span, IdempotencyKey], Awaitable[tuple[str, dict[str, Any]]]]


def _expired(batch: Batch) -> bool:
    """Past its completion window: no new line starts, and it ends `expired` with what it answered."""
    return time.time() > batch.object["expires_at"]


class Progress:
    """A batch's answered lines, as JSONL parts written whole (rename on a disk, one PUT on a store)."""

    def __init__(self, files_root: str, batch_id: str) -> None:
        self._fs, root = locate(files_root)
        self._dir = posixpath.join(root, "_batches", batch_id)

    async def done(self) -> dict[str, dict[str, Any]]:
        return await asyncio.to_thread(self._read)

    def _read(self) -> dict[str, dict[str, Any]]:
        if not self._fs.exists(self._dir):
            return {}
        found: dict[str, dict[str, Any]] = {}
        for path in sorted(self._fs.ls(self._dir, detail=False)):
            if posixpath.basename(path).startswith("part-"):
                for raw in self._fs.cat_file(path).splitlines():
                    out = json.loads(raw)
                    found[out["custom_id"]] = out
        return found

    async def add(self, answered: list[dict[str, Any]]) -> None:
        body = "".join(json.dumps(a) + "\n" for a in answered).encode()
        await asyncio.to_thread(self._write, f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}.jsonl", body)

    def _write(self, name: str, body: bytes) -> None:
        self._fs.makedirs(self._dir, exist_ok=True)
        final = posixpath.join(self._dir, name)
        if not isinstance(self._fs, LocalFileSystem):
            self._fs.pipe_file(final, body)  # an object store publishes a PUT whole
            return
        write_atomic(final, body)


class BatchRunner:
    def __init__(self, batches: Batches, files: FileStore, files_root: str, endpoints: Mapping[str, Complete],
                 tracer: Tracer, settings: GatewayConfig, owns: Callable[[int], bool],
                 interactive_waiting: Callable[[], int]) -> None:
        """`endpoints`: how a line of each endpoint is run (Api.complete, ResponsesApi.complete)."""
        self._batches, self._files, self._files_root, self._endpoints = batches, files, files_root, endpoints
        self._tracer, self._settings, self._owns = tracer, settings, owns
        self._interactive_waiting = interactive_waiting
        self._running: dict[str, asyncio.Task] = {}
        self._task: asyncio.Task | None = None
        self.in_flight = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch runner")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._running.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _loop(self) -> None:
        while True:
            self._tick()
            await asyncio.sleep(TICK_S)

    def _tick(self) -> None:
        """Start the batches whose home partition this replica owns; stop those it no longer does."""
        for batch in self._batches.active():
            if self._owns(batch.home) and batch.id not in self._running:
                task = asyncio.create_task(self._run(batch.id), name=f"batch {batch.id}")
                self._running[batch.id] = task
                task.add_done_callback(functools.partial(self._ended, batch.id))
        for batch_id, task in list(self._running.items()):
            batch = self._batches.by_id(batch_id)
            if batch is None or not self._owns(batch.home):
                task.cancel()

    def _ended(self, batch_id: str, _task: asyncio.Task) -> None:
        self._running.pop(batch_id, None)

    async def _run(self, batch_id: str) -> None:
        try:
            await self._drive(batch_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - logged; the next tick starts the batch again where it was
            log.exception("batch %s stopped; it goes on at the next tick", batch_id)
            await asyncio.sleep(5)

    async def _drive(self, batch_id: str) -> None:
        batch = self._batches.by_id(batch_id)
        if batch is None:
            return
        if _expired(batch):
            await self._finish(batch, "expired")
            return
        content = await self._files.content(batch.tenant, batch.object["input_file_id"])
        if content is None:
            await self._fail(batch, "the input file is gone")
            return
        try:
            lines = parse_lines(content, batch.object["endpoint"], 10**9)
        except ApiError as e:
            await self._fail(batch, e.message)
            return
        if batch.status == "validating":
            await self._move(batch, "in_progress")
        if batch.status in ("in_progress", "cancelling"):
            await self._answer(batch, lines)
        cancelled = self._batches.cancel_asked(batch.id)
        if cancelled is not None:
            batch.object["cancelling_at"] = cancelled
            await self._finish(batch, "cancelled")
        else:
            await self._finish(batch, "expired" if _expired(batch) else "completed")

    async def _answer(self, batch: Batch, lines: list[Line]) -> None:
        progress = Progress(self._files_root, batch.id)
        done = await progress.done()
        self._count(batch, done.values())
        todo = [line for line in lines if line.custom_id not in done]
        answered: list[dict[str, Any]] = []
        slots = asyncio.Semaphore(self._settings.batch_concurrency)
        pending: set[asyncio.Task] = set()
        last_part = time.monotonic()
        def landed(task: asyncio.Task) -> None:
            slots.release()
            pending.discard(task)
            if not task.cancelled():
                answered.append(task.result())

        for line in todo:
            if self._batches.cancel_asked(batch.id) is not None or _expired(batch):
                break
            await slots.acquire()
            await self._yield_to_interactive()
            task = asyncio.create_task(self._one(batch, line))
            pending.add(task)
            task.add_done_callback(landed)
            if answered and time.monotonic() - last_part > PART_EVERY_S:
                last_part = await self._keep(batch, progress, answered, done)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        await self._keep(batch, progress, answered, done)

    async def _keep(self, batch: Batch, progress: Progress, answered: list[dict[str, Any]],
                    done: dict[str, dict[str, Any]]) -> float:
        """Write the lines answered since the last part, and publish the counts."""
        if answered:
            part, answered[:] = list(answered), []
            await progress.add(part)
            done.update((a["custom_id"], a) for a in part)
            self._count(batch, done.values())
            await self._batches.save(batch)
        return time.monotonic()

    @staticmethod
    def _count(batch: Batch, answered) -> None:
        ok = sum(1 for a in answered if a["response"]["status_code"] == 200)
        failed = sum(1 for a in answered if a["response"]["status_code"] != 200)
        batch.object["request_counts"] = {**batch.object["request_counts"], "completed": ok, "failed": failed}

    async def _yield_to_interactive(self) -> None:
        while self._interactive_waiting() - self.in_flight > self._settings.batch_yield_waiting:
            await asyncio.sleep(0.05)

    async def _one(self, batch: Batch, line: Line) -> dict[str, Any]:
        """One line's answer as an output line: its response's status, request id and body."""
        self.in_flight += 1
        try:
            request_id, status, body = await self._ask(batch, line)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a line's own failure is its error line, never the batch's
            log.exception("batch %s line %d failed", batch.id, line.number)
            request_id, status = "", 500
            body = ApiError(500, f"the line could not be run ({type(e).__name__})", type="server_error").body()
        finally:
            self.in_flight -= 1
        return {"id": f"batch_req_{hashlib.sha256((batch.id + line.custom_id).encode()).hexdigest()[:24]}",
                "custom_id": line.custom_id, "response": {"status_code": status, "request_id": request_id, "body": body},
                "error": None}

    async def _ask(self, batch: Batch, line: Line) -> tuple[str, int, dict[str, Any]]:
        complete = self._endpoints[batch.object["endpoint"]]
        principal = Principal(batch.tenant, batch.key_id, frozenset(batch.scopes), frozenset(batch.models),
                              digest=f"batch:{batch.id}", batch=True)
        raw = json.dumps(line.body).encode()
        slot = hashlib.sha256(f"{batch.tenant}\0batch\0{batch.id}\0{line.custom_id}".encode()).hexdigest()
        key = IdempotencyKey(slot, hashlib.sha256(batch.object["endpoint"].encode() + b"\0" + raw).hexdigest())
        with self._tracer.start_as_current_span("batch line", kind=trace.SpanKind.INTERNAL,
                                                attributes={"baton.batch_id": batch.id}) as span:
            while True:
                try:
                    request_id, body = await complete(raw, principal, span, key)
                    return request_id, 200, body
                except ApiError as e:
                    if e.code == "insufficient_quota" and e.headers.get("retry-after"):
                        await asyncio.sleep(BUDGET_WAIT_S)  # the budget is held by running requests
                        continue
                    return "", e.status, e.body()

    async def _move(self, batch: Batch, status: str) -> None:
        batch.object["status"] = status
        batch.object[f"{status}_at"] = int(time.time())
        await self._batches.save(batch)

    async def _fail(self, batch: Batch, why: str) -> None:
        batch.object["errors"] = {"object": "list", "data": [{"code": "invalid_batch", "message": why,
                                                               "param": None, "line": None}]}
        await self._move(batch, "failed")

    async def _finish(self, batch: Batch, status: str) -> None:
        """Write the output and error files from every part, then the final status."""
        if status == "completed":
            await self._move(batch, "finalizing")
        done = await Progress(self._files_root, batch.id).done()
        self._count(batch, done.values())
        ok = [a for a in done.values() if a["response"]["status_code"] == 200]
        failed = [a for a in done.values() if a["response"]["status_code"] != 200]
        for kind, rows in (("output", ok), ("error", failed)):
            if rows:
                body = "".join(json.dumps(r) + "\n" for r in rows).encode()
                stored = await self._files.put(batch.tenant, f"{batch.id}_{kind}.jsonl", "batch_output", body)
                batch.object[f"{kind}_file_id"] = stored["id"]
        await self._move(batch, status)
