"""The rollouter actor's process of the fully async recipe: ``FullyAsyncRollouter``
(actor.py) and what it composes (the streaming loop, the replicas' supervisor, validation,
the checkpoint book, the state machines).

It answers the driver with the shared messages (fully_async_policy/messages.py); it never
imports fully_async_policy/driver/.
"""
