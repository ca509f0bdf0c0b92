"""The worker pool: lookups never read the file; `refresh` takes the workers added to it, once."""

from __future__ import annotations

import os

import yaml
from testbed import MMLU_PRO, default_config_data

from baton_platform.config import ConfigWatch, load_config
from baton_platform.workerpool import WorkerPool

NEW = {"name": "qwen-110b", "provider": "sim", "model": "Qwen1.5-110B", "sim": {"dataset": str(MMLU_PRO)},
       "price": {"input_per_mtok": 0.9, "output_per_mtok": 0.9}}


def test_refresh_takes_added_workers_once_skips_a_broken_file_and_drop_offers_them_again(write_config):
    data = default_config_data()
    path = write_config(data=data)
    config = load_config(path)
    pool = WorkerPool(config.workers, ConfigWatch(path))
    assert set(pool) == {w.name for w in config.workers} and pool.lacks(["qwen-110b", "gemini-pro"]) == ["qwen-110b"]
    assert pool.refresh() == [], "the file has not changed"

    def rewrite(text: str, stamp_s: int) -> None:
        path.write_text(text)
        os.utime(path, ns=(stamp_s * 10**9, stamp_s * 10**9))

    data["workers"].append(NEW)
    full = yaml.safe_dump(data)
    rewrite(full[: len(full) // 2] + "\n  - [", 1_000)
    assert pool.refresh() == [] and "qwen-110b" not in pool, "a file that does not load is skipped"
    rewrite(full, 2_000)
    (added,) = pool.refresh()
    assert added.name == "qwen-110b" and pool["qwen-110b"].provider == "sim" and pool.lacks(["qwen-110b"]) == []
    assert pool.refresh() == [], "taken once"

    pool.drop(["qwen-110b"])
    assert "qwen-110b" not in pool and pool.refresh() == [], "dropped until the file changes again"
    rewrite(full, 3_000)
    assert [w.name for w in pool.refresh()] == ["qwen-110b"]


def test_without_a_file_the_pool_is_the_configured_workers(write_config):
    config = load_config(write_config())
    pool = WorkerPool(config.workers)
    assert pool.refresh() == [] and len(pool) == len(config.workers)
