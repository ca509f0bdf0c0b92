"""The episodes the console shows: the newest rows of the reward logger's dataset, read again when
older than `refresh_s`, and the summaries its pages draw (series over time, plan mixes, spend); and
the trainer's gate decisions from the policy store."""

from __future__ import annotations

import asyncio
import functools
import json
import operator
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from baton_console.live import LiveEpisodes
from baton_platform.dataset import open_dataset, with_string_column
from baton_policy import decisions

COLUMNS = ["request_id", "tenant", "policy", "created_unix_ms", "completed_unix_ms", "query", "metadata_json",
           "plan_backend", "plan_policy_version", "plan_fallback", "plan_invalid_reason", "plan_json", "steps",
           "answer", "error_code", "error_message", "input_tokens", "output_tokens", "cost_usd", "calls",
           "latency_ms", "grader", "quality", "reward", "reward_detail"]
SPLITS = ("tenant", "version", "worker")  # what the overview's series may be split by
OUTCOMES = ("right", "wrong", "error", "ungraded")


def plan_steps(row: dict) -> list[dict]:
    """The plan's steps: worker, instruction and the earlier steps it may read (`access`)."""
    try:
        steps = json.loads(row.get("plan_json") or "[]")
    except ValueError:
        return []
    return [s for s in steps if isinstance(s, dict)]


def reads(step: dict) -> str:
    """Which earlier steps' outputs a plan step may read, numbered from 1: 'all', '1,2' or ''."""
    access = step.get("access") or {}
    if access.get("all"):
        return "all"
    return ",".join(str(int(i) + 1) for i in access.get("steps", []))


def workflow_shape(row: dict) -> str:
    """A plan as a short line: workers in order, a step that reads earlier steps after `<-`
    (`gemini-flash; gemini-pro <- 1`)."""
    parts = [s.get("worker", "?") + (f" <- {reads(s)}" if reads(s) else "") for s in plan_steps(row)]
    return "; ".join(parts) or "(no plan)"


def workers_of(row: dict) -> list[str]:
    return sorted({s["worker"] for s in row.get("steps") or [] if s.get("worker")})


def outcome(row: dict) -> str:
    if row.get("error_code"):
        return "error"
    if row.get("quality") is None:
        return "ungraded"
    return "right" if row["quality"] >= 0.5 else "wrong"


def version_of(row: dict) -> str:
    """The policy version that planned the episode, or its backend when it has none (static, ...)."""
    return row.get("plan_policy_version") or row.get("plan_backend") or "-"


def sole_worker(row: dict) -> str | None:
    """The one worker of a one-step plan; None for a plan of more steps or none."""
    steps = plan_steps(row)
    return steps[0].get("worker", "?") if len(steps) == 1 else None


def eval_name(row: dict) -> str:
    try:
        return str(json.loads(row.get("metadata_json") or "{}").get("baton_eval", "")).split(":")[0] or "-"
    except ValueError:
        return "-"


def split_keys(row: dict, by: str) -> list[str]:
    if by == "tenant":
        return [row.get("tenant") or "-"]
    if by == "version":
        return [version_of(row)]
    return workers_of(row) or ["-"]


@dataclass
class Buckets:
    """Time buckets over the episodes' completion times, at most `count` of them."""

    start_ms: int
    width_ms: int
    count: int

    @classmethod
    def over(cls, rows: list[dict], most: int = 48) -> Buckets:
        stamps = [r["completed_unix_ms"] for r in rows if r.get("completed_unix_ms")]
        if not stamps:
            return cls(0, 60_000, 0)
        first, last = min(stamps), max(stamps)
        width = next((w for w in (1_000, 5_000, 10_000, 60_000, 300_000, 900_000, 3_600_000, 21_600_000, 86_400_000)
                      if (last - first) / w < most), 86_400_000)
        start = first - first % width
        return cls(start, width, (last - start) // width + 1)

    def index(self, row: dict) -> int:
        return (row["completed_unix_ms"] - self.start_ms) // self.width_ms

    def times(self) -> list[int]:
        return [self.start_ms + i * self.width_ms for i in range(self.count)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def series(rows: list[dict], buckets: Buckets, keys: Callable[[dict], Iterable[str]],
           value: Callable[[list[dict]], float | None], empty: float | None = None) -> dict[str, list[float | None]]:
    """For each key, `value` of its rows in each bucket; `empty` where it has none (a rate is 0 there,
    a latency or a quality is unknown: None, a gap in its line)."""
    grouped: dict[str, list[list[dict]]] = defaultdict(lambda: [[] for _ in range(buckets.count)])
    for r in rows:
        if r.get("completed_unix_ms"):
            for k in keys(r):
                grouped[k][buckets.index(r)].append(r)
    return {k: [value(b) if b else empty for b in cells] for k, cells in sorted(grouped.items())}


def overview(rows: list[dict], by: str) -> tuple[Buckets, dict[str, dict[str, list[float | None]]]]:
    """Requests per second, p50 and p99 latency (s), errors per minute and cost per minute, per split."""
    b = Buckets.over(rows)
    per_s, per_min = b.width_ms / 1000, b.width_ms / 60_000

    def keys(r: dict) -> list[str]:
        return split_keys(r, by)

    return b, {
        "requests per second": series(rows, b, keys, lambda rs: len(rs) / per_s, 0.0),
        "p50 latency (s)": series(rows, b, keys, lambda rs: percentile([r["latency_ms"] or 0 for r in rs], 0.5) / 1000),
        "p99 latency (s)": series(rows, b, keys, lambda rs: percentile([r["latency_ms"] or 0 for r in rs], 0.99) / 1000),
        "errors per minute": series(rows, b, keys, lambda rs: sum(1 for r in rs if r.get("error_code")) / per_min, 0.0),
        "cost per minute (USD)": series(rows, b, keys, lambda rs: sum(r["cost_usd"] or 0 for r in rs) / per_min, 0.0),
    }


def mean_quality(rows: list[dict]) -> float | None:
    graded = [r["quality"] for r in rows if r.get("quality") is not None]
    return sum(graded) / len(graded) if graded else None


def rollouts(rows: list[dict]) -> list[tuple[int, str]]:
    """When each policy version answered first: the rollouts, in time order."""
    first: dict[str, int] = {}
    for r in sorted(rows, key=lambda r: r.get("completed_unix_ms") or 0):
        version = r.get("plan_policy_version")
        if version and version not in first:
            first[version] = r["completed_unix_ms"]
    return sorted((t, v) for v, t in first.items())


def frontier(rows: list[dict]) -> list[tuple[str, float, float, int]]:
    """(name, USD per query, quality, episodes) for each single worker on the questions it answered
    alone, and for each policy version over all its graded episodes."""
    points = []
    alone: dict[str, list[dict]] = defaultdict(list)
    versions: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("quality") is None:
            continue
        if (worker := sole_worker(r)) is not None:
            alone[worker].append(r)
        versions[version_of(r)].append(r)
    for prefix, groups in (("worker ", alone), ("policy ", versions)):
        for name, rs in sorted(groups.items()):
            points.append((prefix + name, sum(r["cost_usd"] or 0 for r in rs) / len(rs), mean_quality(rs) or 0.0, len(rs)))
    return points


def workflow_mix(rows: list[dict], by_eval: bool) -> dict[str, Counter]:
    """How often each plan shape was written, overall or per evaluation set."""
    mix: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        mix[eval_name(r) if by_eval else "all"][workflow_shape(r)] += 1
    return dict(sorted(mix.items()))


def search(rows: list[dict], *, request_id: str = "", tenant: str = "", worker: str = "", result: str = "",
           limit: int = 100) -> list[dict]:
    """The newest episodes matching every filter given (request id by prefix)."""
    found = []
    for r in reversed(rows):
        if ((not request_id or r["request_id"].startswith(request_id)) and (not tenant or r.get("tenant") == tenant)
                and (not worker or worker in workers_of(r)) and (not result or outcome(r) == result)):
            found.append(r)
            if len(found) >= limit:
                break
    return found


def files_of(dataset: ds.Dataset | None) -> tuple[str, ...]:
    """The files a dataset opened by `open_dataset` reads; none for no dataset."""
    return tuple(dataset.files) if isinstance(dataset, ds.FileSystemDataset) else ()


def newest_episodes(dataset: ds.Dataset, most: int) -> pa.Table:
    """The console's columns of the `most` newest episodes by completion time (and of any that tie with
    the oldest of them or have no time), opening only the files that can hold them: the newest days'
    partitions until they hold `most` rows, then in those only the rows from the cutoff on. Memory and
    reads follow `most`, not the size of a dataset that grows every day."""
    by_day: dict[str, list[ds.Expression]] = defaultdict(list)
    for fragment in dataset.get_fragments():
        day = str(ds.get_partition_keys(fragment.partition_expression).get("date", "~"))  # no date: newest
        if not any(fragment.partition_expression.equals(e) for e in by_day[day]):
            by_day[day].append(fragment.partition_expression)
    partitions, chunks = [], []
    for day in sorted(by_day, reverse=True):
        partitions += by_day[day]
        day_times = dataset.to_table(columns=["completed_unix_ms"], filter=functools.reduce(operator.or_, by_day[day]))
        chunks.append(day_times.column(0).drop_null())
        if sum(map(len, chunks)) >= most:
            break
    where = functools.reduce(operator.or_, partitions, ds.scalar(False))
    times = pa.chunked_array(chunks, pa.int64()).combine_chunks()
    if len(times) <= most:
        return dataset.to_table(columns=COLUMNS, filter=where)
    nth = len(times) - most  # the oldest of the newest `most`, in ascending order
    cutoff = times[pc.partition_nth_indices(times, pivot=nth)[nth].as_py()].as_py()
    done = ds.field("completed_unix_ms")
    return dataset.to_table(columns=COLUMNS, filter=where & ((done >= cutoff) | done.is_null()))


@dataclass
class Episodes:
    """The newest `most` episodes under `root` (the reward logger's dataset_dir), oldest first, and
    the feedback on them; read again at most every `refresh_s` seconds, off the event loop. With
    `live`, the episodes followed on Kafka that the dataset does not hold yet come after them."""

    root: str
    refresh_s: float = 5.0
    most: int = 50_000
    live: LiveEpisodes | None = None
    rows: list[dict] = field(default_factory=list)
    feedback: dict[str, list[dict]] = field(default_factory=dict)
    read_at: float = float("-inf")
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The episode and feedback files `rows` and `feedback` were read from; None before the first read.
    _files: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    async def current(self) -> list[dict]:
        async with self._lock:
            if time.monotonic() - self.read_at >= self.refresh_s:
                await asyncio.to_thread(self._read)
                self.read_at = time.monotonic()
                if self.live is not None:
                    self.live.written(r["request_id"] for r in self.rows)
        if self.live is None or not self.live.rows:
            return self.rows
        return (self.rows + self.live.pending())[-self.most:]

    def _read(self) -> tuple[list[dict], dict[str, list[dict]]]:
        """`rows` and `feedback`, read again only if a file was written or removed since the last
        read. The reward logger never changes a file once it is written (a compaction writes new ones
        and removes the old), so the same files hold the same rows: a console nobody writes to, asked
        only by its readiness probe, lists two folders instead of decoding `most` rows each time."""
        root = self.root.rstrip("/")
        dataset, ratings = open_dataset(f"{root}/episodes"), open_dataset(f"{root}/feedback")
        files = (files_of(dataset), files_of(ratings))
        if files != self._files:
            self.rows, self.feedback = self._decode(dataset, ratings)
            self._files = files
        return self.rows, self.feedback

    def _decode(self, dataset: ds.Dataset | None, ratings: ds.Dataset | None) -> tuple[list[dict], dict[str, list[dict]]]:
        rows: list[dict] = []
        if dataset is not None:
            table = newest_episodes(with_string_column(dataset, "tenant"), self.most).sort_by("completed_unix_ms")
            rows = table.slice(max(0, table.num_rows - self.most)).to_pylist()
        # A response read twice (a redelivery) is one episode: the newest row of each request id.
        newest = {r["request_id"]: r for r in rows}
        unique = sorted(newest.values(), key=lambda r: r["completed_unix_ms"] or 0)
        feedback: dict[str, list[dict]] = defaultdict(list)
        if ratings is not None:
            columns = ["response_id", "score", "comment", "source", "created_unix_ms", "tenant"]
            for f in with_string_column(ratings, "tenant").to_table(columns=columns).to_pylist():
                feedback[f["response_id"]].append(f)
        return unique, dict(feedback)

    def find(self, request_id: str) -> dict | None:
        if self.live is not None and request_id in self.live.rows:
            return self.live.rows[request_id]
        return next((r for r in reversed(self.rows) if r["request_id"] == request_id), None)

    async def ready(self) -> str | None:
        try:
            await self.current()
        except Exception as e:  # noqa: BLE001 - readiness reports any failure as "not ready"
            return f"the dataset at {self.root} cannot be read: {type(e).__name__}"
        return None


@dataclass
class Decisions:
    """The newest `most` gate decisions the trainer recorded for policy `name` in the store at `root`,
    oldest first; read again at most every `refresh_s` seconds, off the event loop. A store that cannot
    be read leaves no decisions and a `problem` to show instead."""

    root: str
    name: str
    refresh_s: float = 5.0
    most: int = 50
    found: list[dict] = field(default_factory=list)
    problem: str | None = None
    read_at: float = float("-inf")
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def current(self) -> list[dict]:
        async with self._lock:
            if time.monotonic() - self.read_at >= self.refresh_s:
                try:
                    self.found, self.problem = await asyncio.to_thread(decisions.read, self.root, self.name,
                                                                       self.most), None
                except Exception as e:  # noqa: BLE001 - any failure to read is shown, never raised to the page
                    self.found, self.problem = [], f"the policy store (router.policy_store) cannot be read: {type(e).__name__}"
                self.read_at = time.monotonic()
        return self.found
