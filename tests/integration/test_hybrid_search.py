"""Hybrid retrieval on the real stores (qdrant-edge and qdrant-client's local mode): Chinese
questions find Chinese passages through BM25 although the default embedder reads no Chinese,
English keywords the embedder blurs are found, the knowledge-base filter holds in every mode,
and a query without keywords still searches."""

from __future__ import annotations

import pytest

from rag_stream.ingest.documents import DocumentDraft
from rag_stream.ingest.parsing import parse_markdown, parse_plain
from rag_stream.schemas.kbs import SearchMode
from rag_stream.schemas.tenants import LOCAL_TENANT

# The fixtures come from tests/support/kb_stack.py; test arguments reuse their names.
# ruff: noqa: F811
from tests.support.kb_stack import (  # noqa: F401
    Stack,
    backend,
    db_url,
    embedder,
    stack,
)

CHINESE = {
    "缓存淘汰": "当内存达到上限时，Redis 按照配置的淘汰策略删除键。allkeys-lru 在所有键中近似地"
    "淘汰最久未被访问的键，volatile-ttl 只在设置了过期时间的键里挑剩余寿命最短的。",
    "持久化": "RDB 定期把整个数据集写成一个紧凑的快照文件，恢复速度快，但两次快照之间的写入可能"
    "丢失。AOF 把每条写命令追加到日志里，配合每秒一次的 fsync，最多丢失一秒的数据。",
    "滚动更新": "滚动更新逐步用新版本的 Pod 替换旧版本。maxSurge 规定更新期间最多可以多出几个"
    " Pod，maxUnavailable 规定最多允许几个 Pod 不可用，发现问题可以回滚到上一个版本。",
    "死锁": "两个事务各自持有对方需要的行锁并互相等待，就形成了死锁。数据库会周期性地检测等待图"
    "中的环，选择一个事务回滚来打破僵局。",
}
ENGLISH = {
    "Durability": "With sync = always, every write waits until the log record is on stable "
    "storage, so an acknowledged write survives a power cut.",
    "Compaction": "Background compaction merges overlapping sorted files into larger ones and "
    "throws away overwritten values and deletion markers.",
    "Error codes": "The client raises EMBR-4417 when the snapshot it reads from was released "
    "by another thread.",
}


async def _mixed_kb(stack: Stack) -> str:
    kb = await stack.new_kb()
    for title, text in {**CHINESE, **ENGLISH}.items():
        draft = DocumentDraft(title, parse_plain(text))
        await stack.ingestor.ingest(kb, draft, tenant=LOCAL_TENANT)
    return kb


@pytest.mark.parametrize(
    ("question", "title"),
    [
        ("数据库两个事务互相等待对方的锁怎么办？", "死锁"),
        ("快照和追加日志各会丢失多少数据？", "持久化"),
        ("发布新版本时怎么控制同时替换的 Pod 数量？", "滚动更新"),
        ("内存满了 Redis 按什么规则删除键？", "缓存淘汰"),
    ],
)
async def test_chinese_questions_find_their_passage(
    stack: Stack, question: str, title: str
) -> None:
    kb = await _mixed_kb(stack)
    hybrid = await stack.retriever.search(kb, question, 3)
    sparse = await stack.retriever.search(kb, question, 3, mode="sparse")
    assert hybrid[0].title == title
    assert sparse[0].title == title


async def test_english_keywords_and_meaning_both_count(stack: Stack) -> None:
    kb = await _mixed_kb(stack)
    code = await stack.retriever.search(kb, "what does EMBR-4417 mean", 1)
    assert code[0].title == "Error codes"
    meaning = await stack.retriever.search(kb, "will a confirmed write outlive an outage", 1)
    assert meaning[0].title == "Durability"  # no shared keyword but "write": dense carries it


@pytest.mark.parametrize("mode", ["hybrid", "dense", "sparse"])
async def test_another_knowledge_base_never_leaks_in(stack: Stack, mode: SearchMode) -> None:
    kb = await _mixed_kb(stack)
    other = await stack.new_kb()
    text = "死锁 死锁 死锁: 事务 互相 等待 锁。" * 5
    await stack.ingestor.ingest(
        other, DocumentDraft("Other", parse_plain(text)), tenant=LOCAL_TENANT
    )
    hits = await stack.retriever.search(kb, "事务互相等待锁", 10, mode=mode)
    assert hits and "Other" not in {h.title for h in hits}
    assert {h.title for h in await stack.retriever.search(other, "死锁", 10, mode=mode)} == {
        "Other"
    }


async def test_a_query_of_stop_words_searches_dense_alone(stack: Stack) -> None:
    kb = await _mixed_kb(stack)
    assert await stack.retriever.search(kb, "the of and", 3, mode="sparse") == []
    assert len(await stack.retriever.search(kb, "the of and", 3)) == 3


async def test_replaced_and_deleted_documents_leave_keyword_search_too(stack: Stack) -> None:
    kb = await _mixed_kb(stack)
    source = "notes/zebra.md"
    first = DocumentDraft("Zebra", parse_markdown("Quagga stripes fade."), source=source)
    await stack.ingestor.ingest(kb, first, tenant=LOCAL_TENANT)
    second = DocumentDraft("Zebra", parse_markdown("Okapi stripes stay."), source=source)
    result = await stack.ingestor.ingest(kb, second, tenant=LOCAL_TENANT)
    assert await stack.retriever.search(kb, "quagga", 5, mode="sparse") == []
    assert [h.title for h in await stack.retriever.search(kb, "okapi", 5, mode="sparse")] == [
        "Zebra"
    ]
    await stack.ingestor.delete_document(kb, result.document.id, tenant=LOCAL_TENANT)
    assert await stack.retriever.search(kb, "okapi", 5, mode="sparse") == []
    assert await stack.point_ids(kb) == await stack.chunk_row_ids(kb)
