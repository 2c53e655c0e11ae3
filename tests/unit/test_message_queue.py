"""The message queue's contract, on the plain asyncio class: bounded, blocking put (never
evicts), whole-batch FIFO get, a close that wakes waiters with an end-of-stream value."""

import asyncio

import pytest

from fully_async_policy.message_queue import MessageQueue
from fully_async_policy.messages import EndOfStream


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


async def _pending(task: asyncio.Task) -> bool:
    """True if ``task`` is still waiting after the loop ran everything it could."""
    for _ in range(5):
        await asyncio.sleep(0)
    return not task.done()


def test_queue_blocks_producer_when_full_and_lets_it_in_after_a_get():
    async def scenario():
        queue = MessageQueue(capacity=2)
        assert await queue.put("a") and await queue.put("b")
        blocked = asyncio.create_task(queue.put("c"))
        assert await _pending(blocked)
        assert queue.stats().size == 2  # nothing was evicted to make room
        assert await queue.get_batch(1) == ["a"]
        assert await blocked is True
        assert await queue.get_batch(2) == ["b", "c"]
        stats = queue.stats()
        assert stats.num_blocked_puts == 1 and stats.max_size == 2
        assert stats.num_produced == 3 and stats.num_consumed == 3 and stats.size == 0

    run(scenario())


def test_get_batch_waits_for_the_whole_batch_and_keeps_put_order():
    async def scenario():
        queue = MessageQueue(capacity=4)
        getter = asyncio.create_task(queue.get_batch(3))
        await queue.put(1)
        await queue.put(2)
        assert await _pending(getter)  # two of three: keeps waiting
        await queue.put(3)
        await queue.put(4)
        assert await getter == [1, 2, 3]
        assert await queue.get_batch(1) == [4]

    run(scenario())


def test_close_wakes_a_waiting_consumer_with_end_of_stream_and_a_producer_with_false():
    async def scenario():
        queue = MessageQueue(capacity=1)
        await queue.put("x")
        producer = asyncio.create_task(queue.put("y"))
        consumer = asyncio.create_task(queue.get_batch(1))
        assert await consumer == ["x"]  # room again: the blocked producer gets in
        assert await producer is True
        short = asyncio.create_task(queue.get_batch(1))
        assert await short == ["y"]
        waiting = asyncio.create_task(queue.get_batch(1))
        blocked_after = asyncio.create_task(queue.put("z"))
        assert await blocked_after is True  # fills the queue again
        assert await waiting == ["z"]
        waiting = asyncio.create_task(queue.get_batch(1))
        assert await _pending(waiting)
        await queue.close()
        assert await waiting == EndOfStream(num_left=0)
        assert await queue.put("late") is False
        assert queue.stats().closed

    run(scenario())


def test_close_while_a_producer_waits_returns_false_and_keeps_what_was_queued():
    async def scenario():
        queue = MessageQueue(capacity=1)
        await queue.put("kept")
        producer = asyncio.create_task(queue.put("refused"))
        assert await _pending(producer)
        await queue.close()
        assert await producer is False
        # Fewer than asked for after close: end of stream, and drain hands out the rest.
        assert await queue.get_batch(1) == ["kept"]
        assert await queue.get_batch(1) == EndOfStream(num_left=0)

    run(scenario())


def test_short_batch_after_close_is_end_of_stream_and_drain_returns_the_rest():
    async def scenario():
        queue = MessageQueue(capacity=4)
        for item in range(3):
            await queue.put(item)
        await queue.close()
        assert await queue.get_batch(2) == [0, 1]
        assert await queue.get_batch(2) == EndOfStream(num_left=1)
        assert await queue.drain() == [2]
        stats = queue.stats()
        assert stats.num_produced == stats.num_consumed + stats.size == 3

    run(scenario())


@pytest.mark.parametrize("num_items", [0, 3])
def test_get_batch_rejects_a_size_that_could_never_be_served(num_items):
    with pytest.raises(ValueError, match="capacity=2"):
        run(MessageQueue(capacity=2).get_batch(num_items))


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity=0"):
        MessageQueue(capacity=0)


def test_many_producers_and_one_consumer_lose_nothing_and_never_exceed_capacity():
    async def scenario():
        queue = MessageQueue(capacity=3)

        async def produce(base: int) -> None:
            for i in range(10):
                assert await queue.put(base + i)

        producers = [asyncio.create_task(produce(100 * p)) for p in range(4)]
        got: list[int] = []
        while len(got) < 40:
            got += await queue.get_batch(2)
        await asyncio.gather(*producers)
        assert sorted(got) == sorted(100 * p + i for p in range(4) for i in range(10))
        for p in range(4):  # each producer's items stay in its put order
            mine = [x for x in got if x // 100 == p]
            assert mine == sorted(mine)
        assert queue.stats().max_size <= 3

    run(scenario())
